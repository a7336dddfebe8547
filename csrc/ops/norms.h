// Validation of tensor_norms (the per-tensor vector norms behind gradient
// clipping), run by every kernel (CPU, CUDA, Meta, the composite one) before it
// reads anything, and the dtype of its result.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace torchext {

void check_tensor_norms_args(at::TensorList tensors, double ord,
                             const std::optional<at::Tensor>& inv_scale,
                             const std::optional<at::Tensor>& found_inf);

// The dtype torch.stack gives the per-tensor norms: each norm has its
// tensor's real dtype (complex64 -> float32), promoted over the list.
at::ScalarType tensor_norms_dtype(at::TensorList tensors);

}  // namespace torchext

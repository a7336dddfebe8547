// Validation of swap_ (averaged weights), run by every kernel before it
// touches anything.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchext {

// Equal lengths; each pair defined, strided, same dtype, shape and device,
// not overlapping in memory; one device for all.
void check_swap_args(at::TensorList tensors, at::TensorList others);

}  // namespace torchext

// Gradient clipping by norm for the C++ front end: the one C++ home of the
// clip's rules (Python's is torchext/nn/utils/clip_grad.py, the same
// arithmetic op for op, so both give the same bits). Used by
// GradScaler::clip_grad_norm_, ASGD::clip_grad_norm_ and the drop-in
// torchext::nn::utils::clip_grad_norm_. No host sync, unless
// error_if_nonfinite asks for one.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <vector>

namespace torchext {
namespace api {

// One tensor_norms call: a list on one device, with the scaler's inv_scale
// and found_inf for the norms of the unscaled tensors and the inf/NaN check
// in the same read.
struct NormsCall {
  std::vector<at::Tensor> tensors;
  std::optional<at::Tensor> inv_scale, found_inf;
};

// The norm of all the calls' tensors as if concatenated into one vector,
// torch's get_total_norm: one tensor_norms call per list, then the norm of
// the norms on the first list's device. Every list is checked before the
// first op call (all or nothing across devices). `calls` must not be empty.
at::Tensor total_norm(const std::vector<NormsCall>& calls, double norm_type);

// torch's error_if_nonfinite: a host read of the total norm, refused while a
// CUDA graph is being captured.
void check_nonfinite(const at::Tensor& total_norm, double norm_type, bool error_if_nonfinite);

// torch's clip coefficient min(max_norm / (total_norm + 1e-6), 1), on the
// device and in the dtype of total_norm.
at::Tensor clip_coef(const at::Tensor& total_norm, double max_norm);

// tensors *= factor (a 1-element tensor) in place, one pass per device, no
// sync: the unscale_ op with a float32 factor, torch's _foreach_mul_ for a
// float64 one (float64 gradients keep its precision). Every device's list is
// checked before the first is written.
void multiply_(const std::vector<at::Tensor>& tensors, const at::Tensor& factor);

// The drop-in: clips the gradients of `params` in place to a total norm of
// max_norm and returns the total norm (0-d, the first gradient's device, a
// float 0 on the CPU with no gradient), as torch.nn.utils.clip_grad_norm_.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                           double norm_type, bool error_if_nonfinite);

// Every defined .grad of `params`, in order; of every group's params.
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params);
std::vector<at::Tensor> grads_of(const torch::optim::Optimizer& optimizer);

// One NormsCall per device (devices in order of first appearance).
std::vector<NormsCall> norms_calls_by_device(const std::vector<at::Tensor>& tensors);

}  // namespace api
}  // namespace torchext

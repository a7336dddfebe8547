// torchext::nn::utils::clip_grad_norm_: a drop-in for LibTorch's
// torch::nn::utils::clip_grad_norm_, with its signature and return: clips the
// parameters' gradients in place to a total norm of max_norm and returns the
// total norm (before clipping) as a double, which reads it on the host, as
// LibTorch's does. The norms come from one tensor_norms call per device (one
// read of the gradients) and the multiply from one unscale_ pass, where
// LibTorch makes one norm call per parameter. The value is Python's
// torch.nn.utils.clip_grad_norm_'s (for norm_type 0 the number of gradients
// with a nonzero element; LibTorch's counts the gradients). Throws c10::Error
// for gradients the op refuses (sparse, integer), before any is written.
//
// The same clip without a host read (the norm stays a device tensor):
// GradScaler::clip_grad_norm_ (unscale_ + clip in one pass) and
// ASGD::clip_grad_norm_; folded into the step, without rewriting the
// gradients of torchext's ASGD: GradScaler::clip_and_step and
// ASGD::clip_and_step, which return a torchext::ClipAndStep (below).
#pragma once

#include <torchext/amp/fused_step.h>  // TORCHEXT_API

#include <torch/types.h>

#include <initializer_list>
#include <utility>
#include <vector>

namespace torchext {

// What GradScaler::clip_and_step and ASGD::clip_and_step return (Python's
// named tuple ClipAndStep(total_norm, result)): the total norm of the
// unscaled gradients before clipping (0-d, their dtype, the first gradient's
// device; a float 0 on the CPU with no gradient) and what the step returned
// (undefined when the scaler skipped it, or when the step returns nothing).
struct ClipAndStep {
  torch::Tensor total_norm;
  torch::Tensor result;
};

namespace nn {
namespace utils {

TORCHEXT_API double clip_grad_norm_(const std::vector<torch::Tensor>& parameters,
                                    double max_norm, double norm_type = 2.0,
                                    bool error_if_nonfinite = false);

inline double clip_grad_norm_(std::initializer_list<torch::Tensor> parameters, double max_norm,
                              double norm_type = 2.0, bool error_if_nonfinite = false) {
  return clip_grad_norm_(std::vector<torch::Tensor>(parameters), max_norm, norm_type,
                         error_if_nonfinite);
}

inline double clip_grad_norm_(torch::Tensor parameter, double max_norm, double norm_type = 2.0,
                              bool error_if_nonfinite = false) {
  return clip_grad_norm_(std::vector<torch::Tensor>{std::move(parameter)}, max_norm, norm_type,
                         error_if_nonfinite);
}

}  // namespace utils
}  // namespace nn
}  // namespace torchext

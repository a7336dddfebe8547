// torchext::amp::FusedAmpStep: how torchext's GradScaler steps an optimizer
// whose gradients were scaled, the C++ side of torchext/amp/protocol.py.
//
// A GradScaler steps an optimizer in one of two ways:
//
// * plain (any torch::optim::Optimizer): unscale the gradients in place,
//   check them for inf/NaN, read the result on the host, and call
//   optimizer.step() only when they are finite;
// * fused (an optimizer that also implements FusedAmpStep, such as
//   torchext::optim::ASGD): check the gradients read-only, then call
//   step_with_amp(grad_scale, found_inf); the optimizer unscales on the fly.
//
// In the fused way the scaler still reads found_inf on the host and does not
// call step_with_amp on an overflow (as for a plain optimizer, so an
// overflowed step is one the optimizer never saw), unless
// amp_step_must_not_sync() is true (torchext's ASGD: every group has
// capturable=true; torch's _step_supports_amp_scaling in Python): then it
// always calls step_with_amp with found_inf, and the optimizer must change
// nothing at all when found_inf != 0, deciding that on the device.
#pragma once

#include <torch/types.h>

#ifndef TORCHEXT_API
#if defined(_WIN32)
#define TORCHEXT_API
#else
#define TORCHEXT_API __attribute__((visibility("default")))
#endif
#endif

namespace torchext {
namespace amp {

class TORCHEXT_API FusedAmpStep {
 public:
  virtual ~FusedAmpStep() = default;

  // One step with the scaler's records:
  // - grad_scale: divide the gradients by it on the fly (float32, 1 element);
  //   undefined when they were unscaled already (GradScaler::unscale_).
  // - clip_coef: the clip coefficient of GradScaler::clip_and_step (float32
  //   or float64, 1 element; see Note [Clip: applied when called, folded
  //   only inside one call] in csrc/api/clip_grad.h), undefined when there
  //   is none: the unscaled gradients are then multiplied by it, a second
  //   factor, never folded into grad_scale (scale / coef overflows float32
  //   at the largest scales). torchext::optim::ASGD passes it to the asgd_
  //   op's clip_coef.
  // - found_inf: undefined when the scaler checked on the host that the
  //   gradients are finite; else a 1-element float32 tensor, and the step
  //   must change nothing when it is nonzero (decided on the device).
  // Returns what step() returns (GradScaler::step returns it in turn).
  virtual torch::Tensor step_with_amp(const torch::Tensor& grad_scale,
                                      const torch::Tensor& found_inf,
                                      const torch::Tensor& clip_coef) = 0;

  // True when no host read of found_inf may happen before the step (the
  // scaler then always calls step_with_amp and the skip is decided on the
  // device). False: the scaler reads found_inf once and skips the call on an
  // overflow.
  virtual bool amp_step_must_not_sync() const = 0;
};

}  // namespace amp
}  // namespace torchext

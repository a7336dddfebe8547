// Gradient clipping by norm for the C++ front end: the one C++ home of the
// clip's arithmetic (Python's twin is torchext/_clip.py, the same arithmetic
// op for op, so both give the same bits). Used by GradScaler::clip_grad_norm_,
// GradScaler::clip_and_step, ASGD::clip_grad_norm_, ASGD::clip_and_step and
// the drop-in torchext::nn::utils::clip_grad_norm_. Two parts: measure (one
// read of the gradients: the total norm, and the inf check when they are
// still scaled) and multiply_ (one pass that writes them unscaled and
// clipped). No host sync, unless error_if_nonfinite asks for one.
//
// Note [Clip: applied when called, folded only inside one call]
// (Python's twin note, under the same title, is in torchext/_clip.py.)
//
// Between two calls of user code nothing is pending: a clip is applied when
// it is called, and what it returns, the gradients, and the scaler's record
// of the optimizer say all there is.
//
// - The two-call clip (GradScaler::clip_grad_norm_, ASGD::clip_grad_norm_,
//   the drop-in) is torch's recipe, `scaler.unscale_(opt)` then
//   `clip_grad_norm_`, fused: one read (measure: the norms of the unscaled
//   gradients and, when the scaler's record is kReady, the inf check in the
//   same read), then one pass (multiply_: grad * inv_scale, rounded, then *
//   coef, rounded, as torch's recipe stores them) that writes the unscaled,
//   clipped gradients. Afterwards the scaler's record is torch's: kUnscaled
//   with found_inf, nothing else. Whatever the user does to the gradients
//   before step() (replaces them, edits them, accumulates into them) is
//   stepped as it is, as in torch; no coefficient waits for the step.
// - Only clip_and_step (GradScaler::clip_and_step, ASGD::clip_and_step) hands
//   the coefficient to the step without writing the gradients, because no
//   user code runs between its measure and its step: a FusedAmpStep
//   optimizer (torchext's ASGD) gets step_with_amp(grad_scale, found_inf,
//   clip_coef), two factors applied one after the other in its kernel (their
//   product overflows float32 at the top scales), and its gradients are left
//   scaled and unclipped; any other optimizer gets the multiply_ pass, then
//   its step.
// - Everything that can refuse (bad gradients, fp16 without allow_fp16, no
//   scale(), after step()) refuses before the first write or record. A
//   non-finite norm with error_if_nonfinite is refused where torch's recipe
//   refuses it: after its unscale_ (the gradients unscaled, the record
//   kUnscaled with found_inf), before its clip.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <vector>

namespace torchext {
namespace api {

// One tensor_norms call: a list on one device, with the scaler's inv_scale
// and a fresh found_inf for the norms of the unscaled tensors and the
// inf/NaN check in the same read (both unset: the norms of the tensors as
// they are).
struct NormsCall {
  std::vector<at::Tensor> tensors;
  std::optional<at::Tensor> inv_scale, found_inf;
};

// One call per device of `tensors` (devices in order of first appearance);
// with inv_scale defined, each call gets it on its device and a fresh
// float32 found_inf (0) there.
std::vector<NormsCall> norms_calls_by_device(const std::vector<at::Tensor>& tensors,
                                             const at::Tensor& inv_scale = at::Tensor());

// What measure read.
struct Measured {
  at::Tensor total;  // 0-d, the first list's device and the tensors' dtype
  // One per call, in order: the call's found_inf, undefined where it had none.
  std::vector<at::Tensor> found_inf;
};

// The norm of all the calls' tensors as if concatenated into one vector,
// torch's get_total_norm: one tensor_norms call per list, then the norm of
// the norms on the first list's device. Every list is checked before the
// first op call (all or nothing across devices); the op writes nothing but
// the calls' found_inf. No call (no gradient): torch's tensor(0.). See
// Note [Clip: applied when called, folded only inside one call].
Measured measure(const std::vector<NormsCall>& calls, double norm_type);

// error_if_nonfinite reads the total norm on the host: refused while a CUDA
// graph is being captured (on `on`'s device).
void check_host_read(const at::Tensor& on, bool error_if_nonfinite);

// torch's error_if_nonfinite as a question: true when error_if_nonfinite and
// the total norm is inf or NaN (a host read, check_host_read first); false
// without a read otherwise. throw_nonfinite then throws torch's message.
bool refuses_nonfinite(const at::Tensor& total_norm, bool error_if_nonfinite);
[[noreturn]] void throw_nonfinite(double norm_type);

// torch's clip coefficient min(max_norm / (total_norm + 1e-6), 1), on the
// device and in the dtype of total_norm; undefined for max_norm = inf, which
// never clips (torch multiplies by inf/inf = NaN when the norm overflowed).
at::Tensor clip_coef(const at::Tensor& total_norm, double max_norm);

// A coefficient as the ops take it (unscale_'s and asgd_'s clip_coef):
// float64 stays, anything else becomes float32 (a bf16/fp16 coefficient is
// exact in float32). Undefined stays undefined.
at::Tensor as_factor(const at::Tensor& coef);

// One part of a multiply_ pass: tensors and the inv_scale to unscale them by
// (undefined: they are unscaled already).
struct Multiply {
  std::vector<at::Tensor> tensors;
  at::Tensor inv_scale;
};

// Each part's tensors = (tensors * inv_scale) * coef in place (either factor
// may be undefined), rounded to each tensor's dtype after each factor, as
// torch's unscale_ then clip store them: one unscale_ pass per part and
// device, no sync. Every part's lists are checked before the first is
// written. See Note [Clip: applied when called, folded only inside one call].
void multiply_(const std::vector<Multiply>& parts, const at::Tensor& coef);
void multiply_(const std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale,
               const at::Tensor& coef);

// The drop-in: clips the gradients of `params` in place to a total norm of
// max_norm and returns the total norm (0-d, the first gradient's device, a
// float 0 on the CPU with no gradient), as torch.nn.utils.clip_grad_norm_.
// A non-finite norm refused by error_if_nonfinite changes nothing.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                           double norm_type, bool error_if_nonfinite);

// Every defined .grad of `params`, in order; of every group's params.
std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params);
std::vector<at::Tensor> grads_of(const torch::optim::Optimizer& optimizer);

// Every param of every group of `optimizer`, in order, with a grad or not.
std::vector<at::Tensor> params_of(const torch::optim::Optimizer& optimizer);

// Refuses an fp16 gradient (GradScaler's allow_fp16 rule: torch's unscale_
// refuses them, with this message).
void refuse_fp16(const std::vector<at::Tensor>& grads);

}  // namespace api
}  // namespace torchext

// Gradient clipping by norm for the C++ front end: the one C++ home of the
// clip's rules and of the pending clip (Python's twin is torchext/_clip.py,
// the same arithmetic op for op, so both give the same bits). Used by
// GradScaler::clip_grad_norm_, ASGD::clip_grad_norm_ and the drop-in
// torchext::nn::utils::clip_grad_norm_. No host sync, unless
// error_if_nonfinite asks for one.
#pragma once

#include "../classes/grads_seen.h"

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

// error_if_nonfinite reads the total norm on the host: refused while a CUDA
// graph is being captured (on `on`'s device).
void check_host_read(const at::Tensor& on, bool error_if_nonfinite);

// torch's error_if_nonfinite: a host read of the total norm (check_host_read
// first).
void check_nonfinite(const at::Tensor& total_norm, double norm_type, bool error_if_nonfinite);

// torch's clip coefficient min(max_norm / (total_norm + 1e-6), 1), on the
// device and in the dtype of total_norm; undefined for max_norm = inf, which
// never clips (torch multiplies by inf/inf = NaN when the norm overflowed).
at::Tensor clip_coef(const at::Tensor& total_norm, double max_norm);

// tensors = (tensors * inv_scale) * coef in place (either factor may be
// undefined), rounded to each tensor's dtype after each factor, as torch's
// unscale_ then clip store them: one unscale_ pass per device, no sync.
// Every device's list is checked before the first is written.
void multiply_(const std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale,
               const at::Tensor& coef);

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

// Every param of every group of `optimizer`, in order, with a grad or not.
std::vector<at::Tensor> params_of(const torch::optim::Optimizer& optimizer);

// Refuses an fp16 gradient (GradScaler's allow_fp16 rule: torch's unscale_
// refuses them, with this message).
void refuse_fp16(const std::vector<at::Tensor>& grads);

// ---- The pending clip (Python: torchext/_clip.py, PendingClip) ----------
//
// A clip whose multiplies wait for the next step, the one record of a
// pending clip in C++, in one of two homes: GradScaler's record of the
// optimizer when the clip came through an enabled scaler, else ASGD's own.
// Its whole life, the rule being "a clip applies to the gradients it
// measured, or to nothing":
// - made by a clip, once everything that can refuse has passed;
// - consumed by the next step of its optimizer, exactly once: a fused step
//   (FusedAmpStep) takes its factors (fold), any other optimizer gets its
//   gradients multiplied first (apply_). A step that throws before it writes
//   keeps it; one that multiplied the gradients first has consumed it;
// - applied to the gradients as torch's recipe leaves them (apply_) when
//   something needs them so: a second clip (which then composes as torch's),
//   a save of the optimizer that holds it, the scaler's load;
// - dropped by the holder's zero_grad() (ASGD) or update() (GradScaler), and
//   when its gradients were replaced or removed since;
// - refused (valid() throws, nothing changed) by a step when a gradient it
//   measured was written in place since, and so is a second clip.
struct PendingClip {
  torch::optim::Optimizer* optimizer = nullptr;  // whose gradients it measured
  at::Tensor coef;    // undefined: max_norm = inf (an unscale alone)
  bool scaled = false;  // the gradients are still multiplied by the loss scale
  c10::intrusive_ptr<GradsSeen> seen;  // which gradients it measured

  // GradsSeen::kSame, kReplaced or kWritten.
  int64_t status() const;
  // True when it still applies; false when its gradients were replaced or
  // removed (drop it); throws when they were written in place.
  bool valid() const;
  // Multiplies `grads` (every gradient it measured) in place by 1 / scale
  // (float32, as unscale_) when they are still scaled, then by coef.
  void apply_(const std::vector<at::Tensor>& grads, const at::Tensor& scale) const;
};

// What a fused step (FusedAmpStep::step_with_amp) gets: grad_scale (the
// gradients are divided by it) and clip_coef (then multiplied by it), two
// factors applied one after the other, exactly torch's recipe's two
// multiplies at every scale its scaler reaches: their product (scale / coef)
// overflows float32 at the top scales. `scale`: the scaler's scale (undefined
// when the gradients were unscaled in place already).
struct Factors {
  at::Tensor grad_scale, clip_coef;
};
Factors fold(const PendingClip* clip, const at::Tensor& scale);

}  // namespace api
}  // namespace torchext

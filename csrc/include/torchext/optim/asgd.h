// torchext::optim::ASGD: Averaged SGD for LibTorch, on the fused
// torchext::asgd_ op (called through the dispatcher, as Python does).
//
// Same update, same per-parameter state (step, eta, mu: 0-d float32 on the
// parameter's device, float64 when the default dtype is float64; ax: like the
// parameter, but float32 for float16/bfloat16 parameters unless
// average_dtype is nullopt) as torchext.optim.ASGD (torch.optim.ASGD keeps
// every ax in the parameter's dtype: average_dtype = nullopt).
#pragma once

#include <torchext/amp/fused_step.h>
#include <torchext/nn/clip_grad.h>  // torchext::ClipAndStep

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <vector>

// (TORCHEXT_API, from fused_step.h: symbols of the C++ API are exported
// from a library built with -fvisibility=hidden, as the Python extension is.)

namespace torchext {
namespace optim {

class AveragedParameters;  // torchext/optim/averaging.h

struct TORCHEXT_API ASGDOptions
    : public torch::optim::OptimizerCloneableOptions<ASGDOptions> {
  /* implicit */ ASGDOptions(double lr = 1e-2);
  // A 0-d (1-element) floating tensor lr, as Python's tensor lr: the fused op
  // reads it on the device, so a schedule that changes it
  // in place (lr.fill_(x), lr.mul_(g)) needs no host sync and no new graph.
  explicit ASGDOptions(torch::Tensor lr);
  // A float lr (drops a tensor lr). lr() is the float lr; with a tensor lr
  // it is meaningless: use lr_tensor() (or get_lr(), which syncs).
  ASGDOptions& lr(double new_lr) {
    lr_ = new_lr;
    lr_tensor_ = torch::Tensor();
    return *this;
  }
  double lr() const noexcept { return lr_; }
  TORCH_ARG(double, lambd) = 1e-4;
  TORCH_ARG(double, alpha) = 0.75;
  TORCH_ARG(double, t0) = 1e6;
  // One t0 per parameter of the group, in group order, or empty (then t0
  // serves every parameter). start_averaging() writes it when the group's
  // parameters took different numbers of steps, as Python's writes the
  // group's 't0_per_param'; the step then makes one op call per distinct
  // value. Its length must be the group's parameter count (checked by
  // add_param_group, step and the checkpoint loaders).
  TORCH_ARG(std::vector<double>, t0_per_param);
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;
  // As Python's `capturable`. For the fused=false path: true runs its
  // sync-free tensor form; false follows torch.optim.ASGD's for-loop path op
  // for op (it reads step/eta/mu on the host). The fused op never syncs. With
  // a GradScaler: true in every group means the overflow skip is decided on
  // the device (amp_step_must_not_sync(), step_with_amp is always called);
  // otherwise an overflowed step is one the scaler does not call.
  TORCH_ARG(bool, capturable) = false;
  // nullopt: fused whenever every parameter is on a device with kernels:
  // CPU, CUDA or meta (default; the rule is Python's KERNEL_DEVICES).
  // true: always the fused op (error on other devices). false: a pure
  // tensor-op path (same math, any device), mainly for testing.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;
  // The dtype of the average ax of float16/bfloat16 parameters, Python's
  // `average_dtype`: at::kFloat (default) keeps a float32 average, which
  // keeps moving where one in the parameter's dtype freezes (an update
  // (p - ax) * mu below half an ulp of ax is lost); 4 B/element instead of
  // 2, and a bf16 step moves 14 B/element instead of 10. nullopt: the
  // parameter's dtype (torch.optim.ASGD's layout). Only kFloat or nullopt
  // (validate()). float32, float64 and complex parameters keep ax in their
  // own dtype either way. ax averages the parameters as stored (rounded to
  // their dtype). Checkpoints re-take ax in this rule's dtype on load.
  TORCH_ARG(std::optional<at::ScalarType>, average_dtype) = at::kFloat;
  // Python's `stochastic_rounding`: the new value of a float16/bfloat16
  // parameter (computed in float32) is rounded up or down to a neighbour in
  // its dtype with probability by its distance to each, instead of to
  // nearest, so that updates below half an ulp still move it on average
  // (round to nearest drops them: pure-bf16 training stalls). The random
  // bits are a counter-based hash of rounding_seed, the parameter's place
  // in the optimizer (its group's index << 32 | its index in the group),
  // the step being taken and the element's index: the same bits in C++ and
  // Python, on CPU and CUDA, and after a checkpoint. float32, float64 and
  // complex parameters ignore it. It needs the fused op: refused with
  // fused=false (validate()), and a step whose group would take the
  // unfused path (a device without torchext kernels) throws.
  TORCH_ARG(bool, stochastic_rounding) = false;
  // The seed of those bits (any value; the same on every process so that
  // replicas round alike). Both checkpoint formats keep both options.
  TORCH_ARG(int64_t, rounding_seed) = 0;

 public:
  // Sets a tensor lr (see the constructor); lr(double) sets a float lr and
  // drops a tensor lr.
  ASGDOptions& lr(torch::Tensor new_lr);
  // The tensor lr, or an undefined tensor when the lr is a float.
  const torch::Tensor& lr_tensor() const noexcept { return lr_tensor_; }
  bool has_tensor_lr() const noexcept { return lr_tensor_.defined(); }

  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  // With a tensor lr: get_lr() reads it (a host sync), set_lr() fills it in
  // place (no sync), as torch's LR schedulers do with a tensor lr.
  double get_lr() const override;
  void set_lr(const double lr) override;
  // Throws c10::Error (ValueError in Python terms) on a bad value: the
  // asgd_ op's own rules (lr, lambd, alpha, weight_decay finite and >= 0;
  // t0 and every t0_per_param value not NaN, inf meaning never average).
  // A tensor lr's value is checked only on the CPU (no device read, no sync).
  // average_dtype must be at::kFloat or nullopt; stochastic_rounding needs
  // fused unset or true.
  void validate() const;
  // The dtype of the average ax of `param` under these options (Python's
  // average_dtype_of): float32 for a float16/bfloat16 param unless
  // average_dtype is nullopt, else the param's dtype.
  at::ScalarType average_dtype_for(const at::Tensor& param) const;
  TORCHEXT_API friend bool operator==(const ASGDOptions& lhs, const ASGDOptions& rhs);

 private:
  double lr_ = 1e-2;
  torch::Tensor lr_tensor_;
};

struct TORCHEXT_API ASGDParamState
    : public torch::optim::OptimizerCloneableParamState<ASGDParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, eta);
  TORCH_ARG(torch::Tensor, mu);
  TORCH_ARG(torch::Tensor, ax);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class TORCHEXT_API ASGD : public torch::optim::Optimizer, public amp::FusedAmpStep {
 public:
  explicit ASGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                ASGDOptions defaults = {});
  explicit ASGD(std::vector<torch::Tensor> params, ASGDOptions defaults = {});

  // Runs the closure (with grad mode on) if given, then one step. All or
  // nothing: every group is checked (the asgd_ op's own validator) before
  // the first write, so a rejected step changes nothing, not even the state
  // it would have created.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // The fused step of GradScaler's protocol (torchext/amp/fused_step.h):
  // grads are unscaled on the fly by grad_scale (undefined: already
  // unscaled), then multiplied by clip_coef (undefined: no clip), and when
  // found_inf is defined nothing at all changes where it is nonzero, decided
  // on the device with no host sync. All or nothing, as step(). Returns what
  // step() returns without a closure (undefined).
  torch::Tensor step_with_amp(const torch::Tensor& grad_scale, const torch::Tensor& found_inf,
                              const torch::Tensor& clip_coef) override;
  // True when every group has capturable=true (Python's
  // _step_supports_amp_scaling): a GradScaler then never reads found_inf on
  // the host and always calls step_with_amp.
  bool amp_step_must_not_sync() const override;

  // torch::nn::utils::clip_grad_norm_ over every parameter of this
  // optimizer, applied when called (Python's ASGD.clip_grad_norm_; see Note
  // [Clip: applied when called, folded only inside one call] in
  // csrc/api/clip_grad.h, also in torchext/_clip.py): one fused read of the
  // gradients for the total norm, one pass that writes them clipped; the
  // next step() steps whatever they then hold. Returns the total norm (0-d,
  // the gradients' dtype, the first gradient's device; a float 0 on the CPU
  // with no gradient), no host sync unless error_if_nonfinite (a non-finite
  // norm then throws and changes nothing). max_norm = inf measures and never
  // clips. With an enabled GradScaler use GradScaler::clip_grad_norm_ (or
  // clip_and_step): these gradients are scaled.
  torch::Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0,
                                bool error_if_nonfinite = false);

  // The closure (if any, with grad mode on), then clip_grad_norm_ and step()
  // in one call, the clip folded into the step (Python's ASGD.clip_and_step;
  // see Note [Clip: applied when called, folded only inside one call] in
  // csrc/api/clip_grad.h, also in torchext/_clip.py): one read of the
  // gradients, then the step multiplies each gradient by the coefficient
  // min(max_norm / (total + 1e-6), 1) on the fly; the gradients are left
  // unclipped. Returns the total norm and the closure's loss (undefined
  // without a closure). error_if_nonfinite with a non-finite norm throws
  // before the step, changing nothing (the closure has run). For training
  // without a scaler; with one use GradScaler::clip_and_step.
  ClipAndStep clip_and_step(double max_norm, double norm_type = 2.0,
                            bool error_if_nonfinite = false, LossClosure closure = nullptr);

  ~ASGD() override;

  // Hides Optimizer::add_param_group (not virtual), which replaces the
  // options of a group with the defaults for optimizer types it does not
  // know. A group without options takes a copy of the defaults; a group with
  // ASGDOptions keeps them as given. Checks the options and that no
  // parameter is in two groups; throws and changes nothing otherwise.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  // torch::save(optimizer, path) / torch::load(optimizer, path) use these.
  // load() validates the archive against the current parameters (group
  // count and sizes, state shapes) and changes nothing when it does not fit.
  // State tensors are moved to each parameter's device. save() refuses while
  // an AveragedParameters guard is alive (the parameters then hold the
  // averages), as Python's state_dict() does.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Averaged weights (torchext/optim/averaging.h, csrc/api/averaging.cpp):
  // a guard holding every stepped parameter swapped with its average, and
  // the NT-ASGD restart of the average with the next step, Python's rule
  // (torchext/optim/averaging.py start_averaging): each parameter's t0
  // becomes its step count - 1 and its mu 1; a group's t0 is the most common
  // of its parameters' values (the first one seen on a tie), and its
  // t0_per_param holds them all when they differ (else it is cleared).
  [[nodiscard]] AveragedParameters averaged_parameters();
  void start_averaging();
  // Throws while an AveragedParameters guard is alive; `what` names the call.
  void check_not_averaged(const char* what) const;

 private:
  friend class AveragedParameters;
  bool averaged_in_ = false;  // a guard is alive: step() refuses
  // The step of step(), step_with_amp() and clip_and_step(): each factor
  // may be null.
  void step_impl(const torch::Tensor* grad_scale, const torch::Tensor* found_inf,
                 const torch::Tensor* clip_coef);
};

}  // namespace optim
}  // namespace torchext

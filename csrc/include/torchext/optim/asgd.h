// torchext::optim::ASGD: Averaged SGD for LibTorch, on the fused
// torchext::asgd_ op (called through the dispatcher, as Python does).
//
// Same update, same per-parameter state (step, eta, mu: 0-d float32 on the
// parameter's device, float64 when the default dtype is float64; ax: like the
// parameter) as torch.optim.ASGD and torchext.optim.ASGD.
#pragma once

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <optional>
#include <vector>

// Symbols of the C++ API are exported from a library built with
// -fvisibility=hidden (the Python extension is).
#ifndef TORCHEXT_API
#if defined(_WIN32)
#define TORCHEXT_API
#else
#define TORCHEXT_API __attribute__((visibility("default")))
#endif
#endif

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
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;
  // As Python's `capturable`, for the fused=false path only: true runs its
  // sync-free tensor form; false follows torch.optim.ASGD's for-loop path op
  // for op (it reads step/eta/mu on the host). The fused op never syncs.
  TORCH_ARG(bool, capturable) = false;
  // nullopt: fused whenever every parameter is on CPU or CUDA (default).
  // true: always the fused op (error on other devices). false: a pure
  // tensor-op path (same math, any device), mainly for testing.
  TORCH_ARG(std::optional<bool>, fused) = std::nullopt;

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
  // Throws c10::Error (ValueError in Python terms) on a bad value.
  void validate() const;
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

class TORCHEXT_API ASGD : public torch::optim::Optimizer {
 public:
  explicit ASGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                ASGDOptions defaults = {});
  explicit ASGD(std::vector<torch::Tensor> params, ASGDOptions defaults = {});

  // Runs the closure (with grad mode on) if given, then one step. All or
  // nothing: every group is checked (the asgd_ op's own validator) before
  // the first write, so a rejected step changes nothing, not even the state
  // it would have created.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // The step GradScaler uses (torch's _step_supports_amp_scaling contract):
  // grads are unscaled on the fly by grad_scale (pass an undefined tensor
  // when they are already unscaled), and nothing at all changes when
  // found_inf != 0, decided on the device with no host sync.
  void step_with_amp(const torch::Tensor& grad_scale, const torch::Tensor& found_inf);

  // Hides Optimizer::add_param_group (not virtual), which replaces the
  // options of a group with the defaults for optimizer types it does not
  // know. A group without options takes a copy of the defaults; a group with
  // ASGDOptions keeps them as given. Checks the options and that no
  // parameter is in two groups; throws and changes nothing otherwise.
  void add_param_group(const torch::optim::OptimizerParamGroup& param_group);

  // torch::save(optimizer, path) / torch::load(optimizer, path) use these.
  // load() validates the archive against the current parameters (group
  // count and sizes, state shapes) and changes nothing when it does not fit.
  // State tensors are moved to each parameter's device.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Averaged weights (torchext/optim/averaging.h, csrc/api/averaging.cpp):
  // a guard holding every stepped parameter swapped with its average, and
  // the NT-ASGD restart of the average with the next step (each group's t0
  // becomes its step count - 1, mu becomes 1; same rule as Python).
  [[nodiscard]] AveragedParameters averaged_parameters();
  void start_averaging();

 private:
  friend class AveragedParameters;
  bool averaged_in_ = false;  // a guard is alive: step() refuses
  void step_impl(const torch::Tensor* grad_scale, const torch::Tensor* found_inf);
};

}  // namespace optim
}  // namespace torchext

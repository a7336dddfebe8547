// torchext::amp::GradScaler: dynamic loss scaling for LibTorch, on the
// torchext custom ops (check_finite_, unscale_, update_scale_). The rule is
// torch.amp.GradScaler's, plus hysteresis, min/max scale and skip reporting.
//
//   auto scaled = scaler.scale(loss);  scaled.backward();
//   scaler.step(optimizer);            // skips the step on overflow
//   scaler.update();                   // grows / backs off the scale
//
// All the state lives in device tensors on the device of the first scaled
// output: scale (0-d float32), growth tracker and hysteresis tracker (0-d
// int32). How an optimizer is stepped is the protocol of
// torchext/amp/fused_step.h (Python: torchext/amp/protocol.py): an optimizer
// implementing FusedAmpStep (torchext::optim::ASGD) gets a read-only check
// and a step that unscales on the fly; any other optimizer is unscaled in
// place. clip_and_step() folds a gradient clip into that step;
// clip_grad_norm_() clips when called. Either way
// found_inf is read on the host once and the step is not called on an
// overflow, unless the optimizer says no host read may happen
// (FusedAmpStep::amp_step_must_not_sync(): ASGD with capturable=true in every
// group) or a CUDA graph is being captured: then it is always called and
// skips on the device.
#pragma once

#include <torchext/amp/fused_step.h>
#include <torchext/amp/state_dict_version.h>
#include <torchext/nn/clip_grad.h>  // torchext::ClipAndStep

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <optional>
#include <unordered_map>
#include <vector>

namespace torchext {
namespace amp {

struct TORCHEXT_API GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
  TORCH_ARG(bool, enabled) = true;
  // Overflows tolerated in a row before the scale backs off (1: torch's rule).
  TORCH_ARG(int64_t, hysteresis) = 1;
  TORCH_ARG(std::optional<double>, min_scale) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_scale) = std::nullopt;
  // Allow unscaling fp16 gradients (pure fp16 training; torchext's fused
  // ASGD computes in fp32). Python's allow_fp16, with its rule: torch's
  // unscale_ refuses them, and so do unscale_(), clip_grad_norm_() and the
  // step of an optimizer a torch scaler would unscale first (every one but
  // a FusedAmpStep whose amp_step_must_not_sync() is true).
  TORCH_ARG(bool, allow_fp16) = false;
};

class TORCHEXT_API GradScaler {
 public:
  // Throws c10::Error on bad options.
  explicit GradScaler(GradScalerOptions options = {});

  const GradScalerOptions& options() const noexcept { return options_; }
  bool is_enabled() const noexcept { return options_.enabled(); }

  // outputs * scale (on the outputs' device). The first call creates the
  // state on that device. Returns outputs unchanged when disabled.
  torch::Tensor scale(const torch::Tensor& outputs);
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  // Divides the optimizer's gradients by the scale in place (multiplies by
  // the float32 reciprocal, as torch does) and records found_inf. At most
  // once per optimizer between update()s, and not after step().
  void unscale_(torch::optim::Optimizer& optimizer);

  // unscale_(optimizer) + torch::nn::utils::clip_grad_norm_ over the
  // optimizer's gradients, fused (Python's GradScaler.clip_grad_norm_), and
  // applied when called (see Note [Clip: applied when called, folded only
  // inside one call] in csrc/api/clip_grad.h, also in torchext/_clip.py):
  // one read of the gradients (the norms of the unscaled gradients and the
  // inf/NaN check), then one pass that writes them unscaled and clipped,
  // rounded as torch's recipe stores them; no host sync (unless
  // error_if_nonfinite). Returns the total norm of the unscaled gradients
  // (0-d, their dtype, the first gradient's device; inf/NaN on an overflow,
  // as torch's recipe returns; a float 0 on the CPU with no gradient).
  // Afterwards the record is torch's after unscale_(): kUnscaled with the
  // inf check, and step() steps whatever the gradients then hold. After
  // unscale_() (or a first clip) the gradients are measured and clipped as
  // they are, never unscaled twice. Not after step(). Refuses before
  // anything is written or recorded: no scale() yet, after step(), fp16
  // gradients without allow_fp16, gradients the ops refuse. A non-finite
  // norm refused by error_if_nonfinite is refused as by torch's recipe,
  // after its unscale_: the gradients are unscaled (not clipped) and the
  // inf check is recorded. max_norm = inf measures and never clips. A
  // disabled scaler clips as ASGD::clip_grad_norm_ (torchext's ASGD) or in
  // place (the drop-in, torchext/nn/clip_grad.h).
  torch::Tensor clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm,
                                double norm_type = 2.0, bool error_if_nonfinite = false);
  // One clip over several optimizers' gradients (torch's recipe: unscale_
  // each, then one clip_grad_norm_ over all their parameters): each
  // optimizer's gradients read (unscaled per its own record), one total
  // norm, one coefficient, each optimizer's gradients written, each record
  // kUnscaled with its inf check. Every optimizer is validated before the
  // first write; one listed twice is refused.
  torch::Tensor clip_grad_norm_(const std::vector<torch::optim::Optimizer*>& optimizers,
                                double max_norm, double norm_type = 2.0,
                                bool error_if_nonfinite = false);

  // clip_grad_norm_(optimizer, ...) then step(optimizer) in one call, the
  // clip folded into the step (Python's GradScaler.clip_and_step; see Note
  // [Clip: applied when called, folded only inside one call] in
  // csrc/api/clip_grad.h, also in torchext/_clip.py): one read of the
  // gradients, then an optimizer implementing FusedAmpStep (torchext's ASGD)
  // gets step_with_amp(grad_scale = scale, found_inf, clip_coef = coef), two
  // factors applied one after the other on the fly, and its gradients are
  // left scaled and unclipped; any other optimizer gets its gradients
  // unscaled and clipped in one pass (the record then says kUnscaled), then
  // step()'s skip logic. After unscale_() or clip_grad_norm_() the
  // gradients are measured as they are and clipped again (never unscaled
  // twice). Returns the total norm and what the step returned (undefined
  // when it was skipped). Leaves the record kStepped, as step(); does not
  // call update(). Refuses as clip_grad_norm_ and step() (after step():
  // step()'s message), before anything is written; error_if_nonfinite with
  // a non-finite norm as clip_grad_norm_ (gradients unscaled, record
  // kUnscaled with the inf check, no step). When the optimizer's step
  // throws: a fused step wrote nothing, and the record is as before the
  // call; a plain optimizer's gradients stay unscaled and clipped and the
  // record kUnscaled, so a later step(optimizer) steps them without
  // clipping twice. A disabled scaler: ASGD::clip_and_step (torchext's
  // ASGD), else the drop-in clip then step().
  ClipAndStep clip_and_step(torch::optim::Optimizer& optimizer, double max_norm,
                            double norm_type = 2.0, bool error_if_nonfinite = false);

  // Steps the optimizer unless the gradients overflowed (fused_step.h).
  // Returns what the optimizer's step (step() or step_with_amp()) returned,
  // or an undefined tensor when it was not called (an overflow, read on the
  // host). When the optimizer's step throws, the records say what the
  // gradients are: a fused step wrote nothing and the record is as before;
  // gradients unscaled in place before a plain optimizer's step stay so,
  // and the record says so (a retry does not unscale them again). With no
  // gradient, a FusedAmpStep whose
  // amp_step_must_not_sync() is true steps a no-op; any other optimizer
  // throws "no inf checks were recorded" (torch's answers for its fused and
  // plain optimizers).
  torch::Tensor step(torch::optim::Optimizer& optimizer);

  // Updates the scale from the found_inf of every optimizer stepped (or
  // unscaled) since the last update, on the device, and records whether this
  // iteration was skipped: one call of the op update_scale_.counted, as
  // Python's GradScaler.update. For one process, or for gradients that are
  // the same on every process (replicated, all-reduced before step()): the
  // C++ scaler does not all-reduce found_inf across processes (LibTorch has
  // no FSDP; Python's GradScaler does it for sharded gradients), so
  // processes whose gradients differ could disagree on skipping a step.
  void update();
  // Sets the scale (growth tracker untouched, as torch does).
  void update(double new_scale);
  void update(const torch::Tensor& new_scale);  // 1-element float32

  // A host number: syncs. init_scale before the first scale(), 1 if disabled.
  double get_scale() const;
  // The device tensor itself (undefined before the first scale()).
  const torch::Tensor& scale_tensor() const noexcept { return scale_; }
  torch::Tensor growth_tracker() const { return growth_tracker_; }
  torch::Tensor hysteresis_tracker() const { return hysteresis_tracker_; }
  int64_t get_growth_tracker() const;  // syncs

  // Skip reporting, on the device: 0-d bool "the last update() saw an
  // overflow" (false until then) and 0-d int64 count of such iterations
  // since construction (restored by load()). Created with the rest of the
  // state by the first scale() (undefined before) and written in place by
  // update(). A checkpoint holds no last_step_skipped: load() into a scaler
  // without state creates it at the next scale() or update().
  torch::Tensor last_step_skipped() const { return last_step_skipped_; }
  torch::Tensor skipped_steps() const { return skipped_steps_; }
  int64_t num_skipped_steps() const;  // syncs

  // torch::save(scaler, path) / torch::load(scaler, path). Keys follow
  // torch.amp.GradScaler.state_dict(): scale, growth_factor, backoff_factor,
  // growth_interval, _growth_tracker; plus hysteresis state and counters.
  // load() validates first and changes nothing when the archive is wrong.
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);

  // Python's state_dict() / load_state_dict(): the keys of
  // torchext.amp.GradScaler (torch.amp.GradScaler's five first, numbers
  // only); load_state_dict also takes torch.amp.GradScaler's five keys alone.
  // Validated first, nothing changes on error. state_dict() syncs (it reads
  // the scale). torchext::save_state_dict/load_state_dict write/read files.
  c10::impl::GenericDict state_dict() const;  // str -> number
  void load_state_dict(const c10::impl::GenericDict& state_dict);

 private:
  // torch's OptState; kUnscaled after unscale_() or clip_grad_norm_().
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    std::vector<std::pair<c10::Device, torch::Tensor>> found_inf_per_device;
  };
  struct Measure;  // a clip's read (grad_scaler.cpp)

  void check_scale_created(const char* where) const;
  void ensure_state(const c10::Device& device);
  torch::Tensor combined_found_inf(const PerOptimizer& s) const;
  // The clip's two halves (csrc/api/clip_grad.h): the read of every
  // optimizer's gradients, validated first, writing and recording nothing;
  // then the pass that writes them and records each kUnscaled (throwing
  // the non-finite error after it when error_if_nonfinite refused).
  Measure measure_clip(const std::vector<torch::optim::Optimizer*>& optimizers, double max_norm,
                       double norm_type, bool error_if_nonfinite, const char* where) const;
  void write_clip(Measure& measure, double norm_type);
  // The steps after the records are made: the fused protocol (throws before
  // anything is stepped when no inf check was recorded and the skip is not
  // the device's) and a plain optimizer's step from its kUnscaled record.
  torch::Tensor fused_step(FusedAmpStep& fused, const PerOptimizer& record, bool scaled,
                           const torch::Tensor& clip_coef) const;
  torch::Tensor plain_step(torch::optim::Optimizer& optimizer);

  GradScalerOptions options_;
  torch::Tensor scale_, growth_tracker_, hysteresis_tracker_;
  torch::Tensor last_step_skipped_, skipped_steps_;
  // True while the state only came from load() (or was never created): the
  // first scale() may then move it to the outputs' device.
  bool state_movable_ = true;
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
};

TORCHEXT_API torch::serialize::OutputArchive& operator<<(
    torch::serialize::OutputArchive& archive, const GradScaler& scaler);
TORCHEXT_API torch::serialize::InputArchive& operator>>(
    torch::serialize::InputArchive& archive, GradScaler& scaler);

}  // namespace amp
}  // namespace torchext

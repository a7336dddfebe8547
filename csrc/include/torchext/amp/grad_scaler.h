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
// place. clip_grad_norm_() folds a gradient clip into that step. Either way
// found_inf is read on the host once and the step is not called on an
// overflow, unless the optimizer says no host read may happen
// (FusedAmpStep::amp_step_must_not_sync(): ASGD with capturable=true in every
// group) or a CUDA graph is being captured: then it is always called and
// skips on the device.
#pragma once

#include <torchext/amp/fused_step.h>
#include <torchext/amp/state_dict_version.h>

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
namespace api {
struct PendingClip;  // csrc/api/clip_grad.h
}
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
  // optimizer's gradients, fused (Python's GradScaler.clip_grad_norm_): one
  // read of the gradients, no write, no host sync (unless
  // error_if_nonfinite). Returns the total norm of the unscaled gradients
  // (0-d, their dtype, the first gradient's device; inf/NaN on an overflow,
  // as torch's recipe returns; a float 0 on the CPU with no gradient) and
  // records the inf/NaN check. The clip coefficient
  // min(max_norm / (total + 1e-6), 1) stays on the device, in one pending
  // clip (csrc/api/clip_grad.h, api::PendingClip: its whole life), and the
  // next step() applies it: an optimizer implementing FusedAmpStep
  // (torchext's ASGD) gets grad_scale = scale and clip_coef = coef, two
  // factors it applies on the fly, so its gradients are never rewritten
  // (still scaled after the step); any other optimizer gets its gradients
  // unscaled and clipped in one pass before its step(), as torch's recipe
  // leaves them. After unscale_() only the coefficient waits. A second clip
  // before the step composes as torch's recipe (the pending one is applied
  // to the gradients, which are then measured again). Not after step().
  // fp16 gradients are refused unless allow_fp16. A non-finite norm refused
  // by error_if_nonfinite is refused as by torch's recipe, after its
  // unscale_: the inf check is recorded. max_norm = inf measures and never
  // clips. A disabled scaler clips as ASGD::clip_grad_norm_ (torchext's
  // ASGD) or in place (the drop-in, torchext/nn/clip_grad.h).
  torch::Tensor clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm,
                                double norm_type = 2.0, bool error_if_nonfinite = false);

  // Steps the optimizer unless the gradients overflowed (fused_step.h).
  // Returns what the optimizer's step (step() or step_with_amp()) returned,
  // or an undefined tensor when it was not called (an overflow, read on the
  // host). When the optimizer's step throws, the records say what the
  // gradients are: a fused step wrote nothing and keeps the pending clip
  // for a retry; gradients unscaled (and clipped) in place before a plain
  // optimizer's step stay so, and the record says so (a retry does not
  // multiply them again). With no gradient, a FusedAmpStep whose
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
    std::shared_ptr<const api::PendingClip> clip;  // waits for the step
  };

  void check_scale_created(const char* where) const;
  void ensure_state(const c10::Device& device);
  torch::Tensor combined_found_inf(const PerOptimizer& s) const;
  // A pending clip made concrete: applied to its gradients when they are
  // still those it measured (the record then says kUnscaled, no clip);
  // dropped when they were replaced (with its inf check when it read scaled
  // gradients); kept when they were written in place (the step, or a second
  // clip, then refuses it).
  void settle_clip(PerOptimizer& record) const;
  void settle_clips();  // every record's, before load()/load_state_dict() change the scale
  void apply_clip(PerOptimizer& record) const;

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

// torchext::amp::GradScaler (LibTorch), on the torchext AMP ops (and
// tensor_norms for clip_grad_norm_) called through the dispatcher.
#include <torchext/torchext.h>

#include "../ops/amp.h"
#include "capture.h"
#include "clip_grad.h"
#include "device_groups.h"
#include "op_handles.h"

#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <cmath>

namespace torchext {
namespace amp {
namespace {

using api::check_finite_op;
using api::unscale_op;

// The gradients of an optimizer (every group), grouped by device, each with
// a fresh found_inf on its device.
struct DeviceGrads {
  c10::Device device;
  std::vector<at::Tensor> grads;
  at::Tensor found_inf;
};
std::vector<DeviceGrads> grads_by_device(const torch::optim::Optimizer& optimizer) {
  const auto grads = api::grads_of(optimizer);
  std::vector<DeviceGrads> out;
  for (const auto& [device, idx] : api::index_by_device(grads)) {
    out.push_back({device, api::pick(grads, idx),
                   at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device))});
  }
  return out;
}

using FoundInf = std::vector<std::pair<c10::Device, torch::Tensor>>;
FoundInf found_infs(std::vector<DeviceGrads>& per_device) {
  FoundInf out;
  for (auto& d : per_device) out.emplace_back(d.device, std::move(d.found_inf));
  return out;
}

// The options' rules are update_scale_'s (check_update_scale_settings), plus
// a finite init_scale > 0 (Python's check_options in
// torchext/amp/_checkpoint.py: the same rules).
void validate(const GradScalerOptions& o) {
  TORCH_CHECK_VALUE(std::isfinite(o.init_scale()) && o.init_scale() > 0.0,
                    "GradScaler: init_scale (the scale) must be > 0 and finite, got ",
                    o.init_scale());
  check_update_scale_settings(UpdateScaleSettings::from(o));
}

// The skip record (0-d bool, false: nothing skipped yet) on the scale's
// device, when there is none: with the rest of the state (ensure_state), or
// after load(), which restores the rest (a checkpoint holds no skip record).
void ensure_skip_record(torch::Tensor& last_step_skipped, const torch::Tensor& scale) {
  if (!last_step_skipped.defined()) {
    last_step_skipped = at::zeros({}, scale.options().dtype(at::kBool));
  }
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(std::move(options)) {
  validate(options_);
}

void GradScaler::ensure_state(const c10::Device& device) {
  if (!scale_.defined()) {
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device);
    const auto i = at::TensorOptions().dtype(at::kInt).device(device);
    scale_ = at::full({}, options_.init_scale(), f);
    growth_tracker_ = at::zeros({}, i);
    hysteresis_tracker_ = at::full({}, options_.hysteresis(), i);
    skipped_steps_ = at::zeros({}, i.dtype(at::kLong));
  } else if (state_movable_ && scale_.device() != device) {
    scale_ = scale_.to(device);
    growth_tracker_ = growth_tracker_.to(device);
    hysteresis_tracker_ = hysteresis_tracker_.to(device);
    skipped_steps_ = skipped_steps_.to(device);
    if (last_step_skipped_.defined()) last_step_skipped_ = last_step_skipped_.to(device);
  }
  ensure_skip_record(last_step_skipped_, scale_);
  state_movable_ = false;
}

void GradScaler::check_scale_created(const char* where) const {
  TORCH_CHECK(scale_.defined(), "GradScaler.", where,
              ": the scale does not exist yet. This may indicate your program did not use "
              "scaler.scale(loss or outputs) earlier in the iteration.");
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!options_.enabled()) return outputs;
  TORCH_CHECK(outputs.defined(), "GradScaler.scale: outputs is undefined");
  ensure_state(outputs.device());
  return outputs * scale_.to(outputs.device(), /*non_blocking=*/true);
}

std::vector<torch::Tensor> GradScaler::scale(const std::vector<torch::Tensor>& outputs) {
  std::vector<torch::Tensor> out;
  out.reserve(outputs.size());
  for (const auto& t : outputs) out.push_back(scale(t));
  return out;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  check_scale_created("unscale_");
  auto found = per_optimizer_.find(&optimizer);
  const Stage stage = found == per_optimizer_.end() ? Stage::kReady : found->second.stage;
  TORCH_CHECK(stage != Stage::kUnscaled,
              "GradScaler.unscale_() has already been called on this optimizer since the last "
              "update().");
  TORCH_CHECK(stage != Stage::kStepped, "GradScaler.unscale_() is being called after step().");
  at::NoGradGuard no_grad;
  // torch: inv_scale = scale.double().reciprocal().float()
  const auto inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  if (!options_.allow_fp16()) api::refuse_fp16(api::grads_of(optimizer));
  auto per_device = grads_by_device(optimizer);
  std::vector<at::Tensor> inv_scales;
  // All or nothing: every device's list is checked before the first one is unscaled.
  for (const auto& d : per_device) {
    inv_scales.push_back(inv_scale.to(d.device, /*non_blocking=*/true));
    check_unscale_args(d.grads, d.found_inf, inv_scales.back());
  }
  for (const auto i : c10::irange(per_device.size())) {
    unscale_op().call(per_device[i].grads, per_device[i].found_inf, inv_scales[i], std::nullopt);
  }
  auto& st = per_optimizer_[&optimizer];  // recorded once the grads are unscaled
  st.found_inf_per_device = found_infs(per_device);
  st.stage = Stage::kUnscaled;
}

torch::Tensor GradScaler::clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm,
                                          double norm_type, bool error_if_nonfinite) {
  if (!options_.enabled()) {
    // Nothing is scaled: torchext's ASGD folds the clip into its next step,
    // any other optimizer's gradients are clipped in place.
    if (auto* asgd = dynamic_cast<optim::ASGD*>(&optimizer)) {
      return asgd->clip_grad_norm_(max_norm, norm_type, error_if_nonfinite);
    }
    return api::clip_grad_norm_(api::params_of(optimizer), max_norm, norm_type,
                                error_if_nonfinite);
  }
  check_scale_created("clip_grad_norm_");
  auto found = per_optimizer_.find(&optimizer);
  PerOptimizer next = found == per_optimizer_.end() ? PerOptimizer{} : found->second;
  TORCH_CHECK(next.stage != Stage::kStepped,
              "GradScaler.clip_grad_norm_() is being called after step().");
  api::check_host_read(scale_, error_if_nonfinite);
  at::NoGradGuard no_grad;
  if (next.clip) {  // a second clip: the first, as torch's recipe leaves it, first
    (void)next.clip->valid();  // (throws, changing nothing, when written in place)
    settle_clip(next);
    per_optimizer_[&optimizer] = next;
  }
  // After unscale_() the norms of the grads as they are (found_inf was
  // recorded then); else of grads * inv_scale, with the inf/NaN check in the
  // same read. torch: inv_scale = scale.double().reciprocal().float()
  const bool unscaled = next.stage == Stage::kUnscaled;
  auto per_device = grads_by_device(optimizer);
  if (!unscaled && !options_.allow_fp16()) {
    for (const auto& d : per_device) api::refuse_fp16(d.grads);
  }
  if (per_device.empty()) {
    // torch's recipe over no gradients: unscale_ records no inf check, and
    // the clip returns torch's tensor(0.).
    if (!unscaled) {
      next.found_inf_per_device.clear();
      next.stage = Stage::kUnscaled;
      per_optimizer_[&optimizer] = std::move(next);
    }
    return at::zeros({});
  }
  std::vector<api::NormsCall> calls;
  for (const auto& d : per_device) calls.push_back({d.grads, std::nullopt, std::nullopt});
  if (!unscaled) {
    const auto inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
    for (const auto i : c10::irange(calls.size())) {
      calls[i].inv_scale = inv_scale.to(per_device[i].device, /*non_blocking=*/true);
      calls[i].found_inf = per_device[i].found_inf;
    }
  }
  const auto total = api::total_norm(calls, norm_type);  // every device checked first
  // A non-finite norm refused by error_if_nonfinite is refused as by torch's
  // recipe, after its unscale_: the inf check and the unscale stand.
  std::optional<c10::Error> refused;
  try {
    api::check_nonfinite(total, norm_type, error_if_nonfinite);
  } catch (const c10::Error& e) {
    refused = e;
  }
  auto coef = refused ? at::Tensor() : api::clip_coef(total, max_norm);
  if (!unscaled) next.found_inf_per_device = found_infs(per_device);
  if (coef.defined() || !unscaled) {
    next.clip = std::make_shared<const api::PendingClip>(api::PendingClip{
        &optimizer, std::move(coef), !unscaled,
        c10::make_intrusive<GradsSeen>(api::params_of(optimizer))});
  }
  next.stage = Stage::kUnscaled;
  per_optimizer_[&optimizer] = std::move(next);  // recorded once nothing else can refuse
  if (refused) throw *refused;
  return total;
}

void GradScaler::apply_clip(PerOptimizer& record) const {
  record.clip->apply_(api::grads_of(*record.clip->optimizer), scale_);
  record.clip.reset();
  record.stage = Stage::kUnscaled;
}

void GradScaler::settle_clip(PerOptimizer& record) const {
  const auto status = record.clip->status();
  if (status == GradsSeen::kSame) {
    apply_clip(record);
    return;
  }
  if (status == GradsSeen::kWritten) return;  // kept: the step (or a second clip) refuses it
  const bool scaled = record.clip->scaled;
  record.clip.reset();  // its gradients were replaced: it applies to nothing
  if (scaled) {  // nor does its inf check: the new gradients are checked afresh
    record.stage = Stage::kReady;
    record.found_inf_per_device.clear();
  }
}

torch::Tensor GradScaler::combined_found_inf(const PerOptimizer& s) const {
  auto total = at::zeros({}, scale_.options().dtype(at::kFloat));
  for (const auto& [device, f] : s.found_inf_per_device) {
    total.add_(f.to(scale_.device(), /*non_blocking=*/true));
  }
  return total;
}

torch::Tensor GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return optimizer.step();
  check_scale_created("step");
  // This iteration's record, copied: a fused step that throws leaves the
  // scaler's records as they were.
  auto found = per_optimizer_.find(&optimizer);
  PerOptimizer next = found == per_optimizer_.end() ? PerOptimizer{} : found->second;
  TORCH_CHECK(next.stage != Stage::kStepped,
              "GradScaler.step() has already been called since the last update().");
  at::NoGradGuard no_grad;
  if (next.clip && !next.clip->valid()) settle_clip(next);  // (throws when written in place)
  if (auto* fused = dynamic_cast<FusedAmpStep*>(&optimizer)) {
    // The fused step (fused_step.h, Python's protocol.py): a read-only check
    // unless unscale_() or clip_grad_norm_() checked already, then the
    // optimizer unscales (and clips) on the fly. One that decides its skip
    // on the device is what torch's scaler steps fused (fp16 grads allowed,
    // a no-op without grads); any other is unscaled first by torch's, which
    // refuses both.
    const bool torch_fused = fused->amp_step_must_not_sync();
    if (next.stage == Stage::kReady) {
      auto per_device = grads_by_device(optimizer);
      if (!torch_fused && !options_.allow_fp16()) {
        for (const auto& d : per_device) api::refuse_fp16(d.grads);
      }
      for (const auto& d : per_device) check_amp_tensors("check_finite_", d.grads, d.found_inf);
      for (auto& d : per_device) check_finite_op().call(d.grads, d.found_inf);
      next.found_inf_per_device = found_infs(per_device);
    }
    TORCH_CHECK(torch_fused || !next.found_inf_per_device.empty(),
                "GradScaler.step: no inf checks were recorded for this optimizer (no parameter "
                "has a gradient).");
    auto found_inf = combined_found_inf(next);
    const bool device_skip = torch_fused || api::capturing(scale_);
    torch::Tensor ret;
    // Not called on an overflow (one host read), unless no host read may happen.
    if (device_skip || found_inf.item<double>() == 0.0) {
      // torch's fused kernels skip only when found_inf == 1.
      if (device_skip && next.found_inf_per_device.size() > 1) found_inf.clamp_max_(1.0);
      const bool unscaled = next.stage == Stage::kUnscaled && !(next.clip && next.clip->scaled);
      const auto factors = api::fold(next.clip.get(), unscaled ? torch::Tensor() : scale_);
      ret = fused->step_with_amp(factors.grad_scale, device_skip ? found_inf : torch::Tensor(),
                                 factors.clip_coef);
    }
    next.clip.reset();  // consumed
    next.stage = Stage::kStepped;
    per_optimizer_[&optimizer] = std::move(next);
    return ret;
  }
  if (next.clip) {
    // The pending clip: the gradients unscaled and clipped in one pass (only
    // clipped after unscale_()), as torch's recipe leaves them; recorded
    // before the step, so that a retry does not multiply them again.
    apply_clip(next);
    per_optimizer_[&optimizer] = next;
  } else if (next.stage == Stage::kReady) {
    unscale_(optimizer);
  }
  auto& st = per_optimizer_.at(&optimizer);
  TORCH_CHECK(!st.found_inf_per_device.empty(),
              "GradScaler.step: no inf checks were recorded for this optimizer (no parameter "
              "has a gradient).");
  double found_sum = 0.0;
  for (const auto& [device, f] : st.found_inf_per_device) found_sum += f.item<double>();
  torch::Tensor ret;
  if (found_sum == 0.0) ret = optimizer.step();
  st.stage = Stage::kStepped;
  return ret;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  check_scale_created("update");
  TORCH_CHECK(!per_optimizer_.empty(),
              "GradScaler.update: no inf checks were recorded prior to update().");
  auto found_inf = at::zeros({}, scale_.options().dtype(at::kFloat));
  for (const auto& [opt, st] : per_optimizer_) {
    for (const auto& [device, f] : st.found_inf_per_device) {
      found_inf.add_(f.to(scale_.device(), /*non_blocking=*/true));
    }
  }
  ensure_skip_record(last_step_skipped_, scale_);  // load() restores no skip record
  // One op, as Python's GradScaler.update: the scale's update and the skip
  // record (last_step_skipped = found_inf != 0, skipped_steps += it), in place.
  call_update_scale({.scale = scale_,
                     .growth_tracker = growth_tracker_,
                     .hysteresis_tracker = hysteresis_tracker_,
                     .found_inf = found_inf,
                     .last_step_skipped = last_step_skipped_,
                     .skipped_steps = skipped_steps_,
                     .settings = UpdateScaleSettings::from(options_)});
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled()) return;
  check_scale_created("update");
  TORCH_CHECK_VALUE(new_scale > 0.0, "GradScaler.update: new_scale must be > 0, got ", new_scale);
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

void GradScaler::update(const torch::Tensor& new_scale) {
  if (!options_.enabled()) return;
  check_scale_created("update");
  TORCH_CHECK_TYPE(new_scale.defined() && new_scale.scalar_type() == at::kFloat &&
                       new_scale.numel() == 1,
                   "GradScaler.update: new_scale should be a float32 tensor with a single "
                   "element (or a double)");
  scale_.copy_(new_scale.reshape({}));
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) return 1.0;
  return scale_.defined() ? scale_.item<double>() : options_.init_scale();
}

int64_t GradScaler::get_growth_tracker() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : 0;
}

int64_t GradScaler::num_skipped_steps() const {
  return skipped_steps_.defined() ? skipped_steps_.item<int64_t>() : 0;
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("enabled", c10::IValue(options_.enabled()));
  if (!options_.enabled()) return;
  auto cpu = [](const torch::Tensor& t) { return t.to(at::kCPU); };
  archive.write("scale", scale_.defined() ? cpu(scale_)
                                          : at::full({}, options_.init_scale(), at::kFloat));
  archive.write("_growth_tracker", growth_tracker_.defined() ? cpu(growth_tracker_)
                                                             : at::zeros({}, at::kInt));
  archive.write("_hysteresis_tracker",
                hysteresis_tracker_.defined() ? cpu(hysteresis_tracker_)
                                              : at::full({}, options_.hysteresis(), at::kInt));
  archive.write("_skipped_steps", skipped_steps_.defined() ? cpu(skipped_steps_)
                                                           : at::zeros({}, at::kLong));
  archive.write("growth_factor", c10::IValue(options_.growth_factor()));
  archive.write("backoff_factor", c10::IValue(options_.backoff_factor()));
  archive.write("growth_interval", c10::IValue(options_.growth_interval()));
  archive.write("hysteresis", c10::IValue(options_.hysteresis()));
  archive.write("min_scale", c10::IValue(options_.min_scale()));
  archive.write("max_scale", c10::IValue(options_.max_scale()));
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  // The rules of load_state_dict (Python's parse_state_dict), on the
  // archive's tensors and values; all checked before anything changes.
  if (!options_.enabled()) return;
  c10::IValue enabled;
  TORCH_CHECK(archive.try_read("enabled", enabled) && enabled.isBool(),
              "GradScaler.load: the archive is not a torchext GradScaler checkpoint");
  TORCH_CHECK_VALUE(enabled.toBool(),
                    "GradScaler.load: the checkpoint was saved from a disabled GradScaler, it "
                    "holds no state.");
  torch::Tensor scale, growth, hyst, skipped;
  auto read_tensor = [&](const char* key, torch::Tensor& out, at::ScalarType dtype, double lo) {
    c10::IValue v;
    TORCH_CHECK_VALUE(archive.try_read(key, v) && v.isTensor(), "GradScaler.load: '", key,
                      "' is missing or not a tensor");
    out = v.toTensor();
    TORCH_CHECK_VALUE(out.numel() == 1 && out.scalar_type() == dtype &&
                          out.layout() == at::kStrided,
                      "GradScaler.load: '", key, "' must be a 1-element ", dtype,
                      " tensor, got ", out.scalar_type(), " of shape ", out.sizes());
    out = out.reshape({});
    const double value = out.item<double>();
    TORCH_CHECK_VALUE(std::isfinite(value) && value >= lo, "GradScaler.load: '", key,
                      "' must be finite and >= ", lo, ", got ", value);
  };
  read_tensor("scale", scale, at::kFloat, 0.0);
  read_tensor("_growth_tracker", growth, at::kInt, 0.0);
  read_tensor("_hysteresis_tracker", hyst, at::kInt, 0.0);
  read_tensor("_skipped_steps", skipped, at::kLong, 0.0);
  auto read_value = [&](const char* key) {
    c10::IValue v;
    TORCH_CHECK_VALUE(archive.try_read(key, v), "GradScaler.load: '", key, "' is missing");
    return v;
  };
  auto read_double = [&](const char* key) {
    const auto v = read_value(key);
    TORCH_CHECK_VALUE(v.isDouble(), "GradScaler.load: '", key, "' must be a float, got ",
                      v.tagKind());
    return v.toDouble();
  };
  auto read_int = [&](const char* key) {
    const auto v = read_value(key);
    TORCH_CHECK_VALUE(v.isInt(), "GradScaler.load: '", key, "' must be an int, got ",
                      v.tagKind());
    return v.toInt();
  };
  auto read_optional = [&](const char* key) -> std::optional<double> {
    const auto v = read_value(key);
    TORCH_CHECK_VALUE(v.isNone() || v.isDouble(), "GradScaler.load: '", key,
                      "' must be a float or None, got ", v.tagKind());
    return v.toOptional<double>();
  };
  GradScalerOptions o = options_;
  o.growth_factor(read_double("growth_factor"));
  o.backoff_factor(read_double("backoff_factor"));
  o.growth_interval(read_int("growth_interval"));
  o.hysteresis(read_int("hysteresis"));
  o.min_scale(read_optional("min_scale"));
  o.max_scale(read_optional("max_scale"));
  try {
    validate(GradScalerOptions(o).init_scale(scale.item<double>()));
  } catch (c10::Error& e) {
    e.add_context("in GradScaler.load (its 'scale' is checked as the init_scale)");
    throw;
  }
  TORCH_CHECK_VALUE(hyst.item<int>() <= o.hysteresis(), "GradScaler.load: '_hysteresis_tracker' (",
                    hyst.item<int>(), ") must be <= hysteresis (", o.hysteresis(), ")");

  settle_clips();  // (before the scale changes)
  options_ = o;
  if (scale_.defined()) {  // keep the device the state lives on
    scale_.copy_(scale);
    growth_tracker_.copy_(growth);
    hysteresis_tracker_.copy_(hyst);
    skipped_steps_.copy_(skipped);
  } else {
    scale_ = scale.clone();
    growth_tracker_ = growth.clone();
    hysteresis_tracker_ = hyst.clone();
    skipped_steps_ = skipped.clone();
    state_movable_ = true;
  }
}

void GradScaler::settle_clips() {
  // A clip pending between clip_grad_norm_() and step() unscales with the
  // scale it measured: applied to its gradients before the scale changes, as
  // torch's recipe has them at that point. The records stay (as Python's and
  // torch's load_state_dict keep this iteration's records); a clip of
  // gradients written in place since is kept (the step refuses it).
  at::NoGradGuard no_grad;
  for (auto& [opt, record] : per_optimizer_) {
    if (record.clip) settle_clip(record);
  }
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                            const GradScaler& scaler) {
  scaler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                           GradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

}  // namespace amp
}  // namespace torchext

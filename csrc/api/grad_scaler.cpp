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
#include <string_view>

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

// A clip's read through the scaler: per optimizer its record (a copy,
// committed by write_clip or the step), its gradients and whether they are
// still scaled (record kReady: read with inv_scale and found_inf, written
// with inv_scale), then the total norm over all of them and the coefficient.
struct GradScaler::Measure {
  struct Part {
    torch::optim::Optimizer* optimizer;
    PerOptimizer record;
    std::vector<at::Tensor> grads;
    bool scaled;
  };
  std::vector<Part> parts;
  at::Tensor inv_scale;  // torch's: scale.double().reciprocal().float()
  at::Tensor total, coef;  // coef undefined: no clip (max_norm = inf, or refused)
  bool refused = false;    // error_if_nonfinite and a non-finite total
};

GradScaler::Measure GradScaler::measure_clip(
    const std::vector<torch::optim::Optimizer*>& optimizers, double max_norm, double norm_type,
    bool error_if_nonfinite, const char* where) const {
  // See Note [Clip: applied when called, folded only inside one call]
  // (csrc/api/clip_grad.h): everything that can refuse refuses here,
  // before the first write or record.
  check_scale_created(where);
  api::check_host_read(scale_, error_if_nonfinite);
  at::NoGradGuard no_grad;
  Measure m;
  m.inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  std::vector<api::NormsCall> calls;
  std::vector<std::pair<size_t, size_t>> ranges;  // each part's calls
  for (auto* optimizer : optimizers) {
    TORCH_CHECK(optimizer != nullptr, "GradScaler.", where, ": an optimizer is null");
    for (const auto& p : m.parts) {
      TORCH_CHECK_VALUE(p.optimizer != optimizer, "GradScaler.", where,
                        ": an optimizer is listed twice");
    }
    auto found = per_optimizer_.find(optimizer);
    PerOptimizer record = found == per_optimizer_.end() ? PerOptimizer{} : found->second;
    if (std::string_view(where) == "clip_and_step") {
      TORCH_CHECK(record.stage != Stage::kStepped,
                  "GradScaler.clip_and_step: GradScaler.step() has already been called since "
                  "the last update().");
    } else {
      TORCH_CHECK(record.stage != Stage::kStepped, "GradScaler.", where,
                  "() is being called after step().");
    }
    const bool scaled = record.stage == Stage::kReady;
    auto grads = api::grads_of(*optimizer);
    if (scaled && !options_.allow_fp16()) api::refuse_fp16(grads);
    // After unscale_() the norms of the grads as they are (found_inf was
    // recorded then); else of grads * inv_scale, with the inf/NaN check in
    // the same read.
    auto own = api::norms_calls_by_device(grads, scaled ? m.inv_scale : at::Tensor());
    ranges.emplace_back(calls.size(), calls.size() + own.size());
    for (auto& c : own) calls.push_back(std::move(c));
    m.parts.push_back({optimizer, std::move(record), std::move(grads), scaled});
  }
  const auto measured = api::measure(calls, norm_type);  // every list checked first
  for (const auto k : c10::irange(m.parts.size())) {
    auto& part = m.parts[k];
    if (!part.scaled) continue;
    // torch's unscale_ over no gradients records no inf check.
    part.record.found_inf_per_device.clear();
    for (const auto c : c10::irange(ranges[k].first, ranges[k].second)) {
      part.record.found_inf_per_device.emplace_back(calls[c].tensors.front().device(),
                                                    measured.found_inf[c]);
    }
  }
  m.total = measured.total;
  m.refused = api::refuses_nonfinite(m.total, error_if_nonfinite);
  if (!m.refused) m.coef = api::clip_coef(m.total, max_norm);
  return m;
}

void GradScaler::write_clip(Measure& m, double norm_type) {
  at::NoGradGuard no_grad;
  std::vector<api::Multiply> passes;
  for (const auto& part : m.parts) {
    passes.push_back({part.grads, part.scaled ? m.inv_scale : at::Tensor()});
  }
  api::multiply_(passes, m.coef);  // every part checked before the first write
  for (auto& part : m.parts) {
    part.record.stage = Stage::kUnscaled;
    per_optimizer_[part.optimizer] = part.record;
  }
  // Refused as torch's recipe refuses it: after its unscale_, before its clip.
  if (m.refused) api::throw_nonfinite(norm_type);
}

torch::Tensor GradScaler::clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm,
                                          double norm_type, bool error_if_nonfinite) {
  // See Note [Clip: applied when called, folded only inside one call]
  // (csrc/api/clip_grad.h, also in torchext/_clip.py).
  return clip_grad_norm_(std::vector<torch::optim::Optimizer*>{&optimizer}, max_norm, norm_type,
                         error_if_nonfinite);
}

torch::Tensor GradScaler::clip_grad_norm_(const std::vector<torch::optim::Optimizer*>& optimizers,
                                          double max_norm, double norm_type,
                                          bool error_if_nonfinite) {
  // See Note [Clip: applied when called, folded only inside one call]
  // (csrc/api/clip_grad.h, also in torchext/_clip.py).
  if (!options_.enabled()) {
    // Nothing is scaled: the clip in place (ASGD::clip_grad_norm_ is it too).
    if (optimizers.size() == 1 && optimizers.front() != nullptr) {
      if (auto* asgd = dynamic_cast<optim::ASGD*>(optimizers.front())) {
        return asgd->clip_grad_norm_(max_norm, norm_type, error_if_nonfinite);
      }
    }
    std::vector<at::Tensor> params;
    for (auto* optimizer : optimizers) {
      TORCH_CHECK(optimizer != nullptr, "GradScaler.clip_grad_norm_: an optimizer is null");
      const auto p = api::params_of(*optimizer);
      params.insert(params.end(), p.begin(), p.end());
    }
    return api::clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite);
  }
  auto m = measure_clip(optimizers, max_norm, norm_type, error_if_nonfinite, "clip_grad_norm_");
  write_clip(m, norm_type);
  return m.total;
}

ClipAndStep GradScaler::clip_and_step(torch::optim::Optimizer& optimizer, double max_norm,
                                      double norm_type, bool error_if_nonfinite) {
  // See Note [Clip: applied when called, folded only inside one call]
  // (csrc/api/clip_grad.h, also in torchext/_clip.py): the only place where
  // the scaler hands a coefficient to a step.
  if (!options_.enabled()) {
    if (auto* asgd = dynamic_cast<optim::ASGD*>(&optimizer)) {
      return asgd->clip_and_step(max_norm, norm_type, error_if_nonfinite);
    }
    auto total = api::clip_grad_norm_(api::params_of(optimizer), max_norm, norm_type,
                                      error_if_nonfinite);
    return {std::move(total), optimizer.step()};
  }
  auto m = measure_clip({&optimizer}, max_norm, norm_type, error_if_nonfinite, "clip_and_step");
  if (m.refused) write_clip(m, norm_type);  // unscales, records, throws
  at::NoGradGuard no_grad;
  auto& part = m.parts.front();
  if (auto* fused = dynamic_cast<FusedAmpStep*>(&optimizer)) {
    // Two factors for the fused step, its gradients never written; nothing
    // recorded unless it returns (a step that throws wrote nothing).
    auto ret = fused_step(*fused, part.record, part.scaled, m.coef);
    part.record.stage = Stage::kStepped;
    per_optimizer_[&optimizer] = std::move(part.record);
    return {std::move(m.total), std::move(ret)};
  }
  // A plain optimizer: the gradients unscaled and clipped (recorded
  // kUnscaled before its step, so a retry does not clip them twice), then
  // step()'s skip.
  write_clip(m, norm_type);
  return {std::move(m.total), plain_step(optimizer)};
}

torch::Tensor GradScaler::combined_found_inf(const PerOptimizer& s) const {
  auto total = at::zeros({}, scale_.options().dtype(at::kFloat));
  for (const auto& [device, f] : s.found_inf_per_device) {
    total.add_(f.to(scale_.device(), /*non_blocking=*/true));
  }
  return total;
}

torch::Tensor GradScaler::fused_step(FusedAmpStep& fused, const PerOptimizer& record, bool scaled,
                                     const torch::Tensor& clip_coef) const {
  // One that decides its skip on the device steps even with no gradient
  // (torch's fused optimizers); any other needs an inf check.
  const bool torch_fused = fused.amp_step_must_not_sync();
  TORCH_CHECK(torch_fused || !record.found_inf_per_device.empty(),
              "GradScaler.step: no inf checks were recorded for this optimizer (no parameter "
              "has a gradient).");
  auto found_inf = combined_found_inf(record);
  const bool device_skip = torch_fused || api::capturing(scale_);
  // Not called on an overflow (one host read), unless no host read may happen.
  if (!device_skip && found_inf.item<double>() != 0.0) return {};
  // torch's fused kernels skip only when found_inf == 1.
  if (device_skip && record.found_inf_per_device.size() > 1) found_inf.clamp_max_(1.0);
  return fused.step_with_amp(scaled ? scale_ : torch::Tensor(),
                             device_skip ? found_inf : torch::Tensor(), api::as_factor(clip_coef));
}

torch::Tensor GradScaler::plain_step(torch::optim::Optimizer& optimizer) {
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
  if (auto* fused = dynamic_cast<FusedAmpStep*>(&optimizer)) {
    // The fused step (fused_step.h, Python's protocol.py): a read-only check
    // unless unscale_() or clip_grad_norm_() checked already, then the
    // optimizer unscales on the fly. One that decides its skip on the
    // device is what torch's scaler steps fused (fp16 grads allowed, a no-op
    // without grads); any other is unscaled first by torch's, which refuses
    // both.
    const bool torch_fused = fused->amp_step_must_not_sync();
    const bool scaled = next.stage == Stage::kReady;
    if (scaled) {
      auto per_device = grads_by_device(optimizer);
      if (!torch_fused && !options_.allow_fp16()) {
        for (const auto& d : per_device) api::refuse_fp16(d.grads);
      }
      for (const auto& d : per_device) check_amp_tensors("check_finite_", d.grads, d.found_inf);
      for (auto& d : per_device) check_finite_op().call(d.grads, d.found_inf);
      next.found_inf_per_device = found_infs(per_device);
    }
    auto ret = fused_step(*fused, next, scaled, torch::Tensor());
    next.stage = Stage::kStepped;
    per_optimizer_[&optimizer] = std::move(next);
    return ret;
  }
  if (next.stage == Stage::kReady) unscale_(optimizer);
  return plain_step(optimizer);
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

#include "amp.h"

#include "../utils/prefetch.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace torchext {

void check_found_inf(const char* op, const at::Tensor& found_inf,
                     const c10::Device& device) {
  TORCH_CHECK_TYPE(found_inf.scalar_type() == at::kFloat, op,
                   ": found_inf must be a float32 tensor, got ", found_inf.scalar_type());
  TORCH_CHECK_VALUE(found_inf.numel() == 1, op,
                    ": found_inf must hold exactly one element, got shape ",
                    found_inf.sizes());
  TORCH_CHECK(found_inf.device() == device, op, ": found_inf is on ",
              found_inf.device(), " but the tensors are on ", device);
}

void check_amp_tensors(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
                       bool allow_fp16) {
  const c10::Device device = found_inf.device();
  check_found_inf(op, found_inf, device);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i + kPrefetchImpl < tensors.size()) {
      prefetch_impl(tensors[i + kPrefetchImpl].unsafeGetTensorImpl());
    }
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined(), op, ": tensors[", i, "] is undefined");
    TORCH_CHECK(t.layout() == at::kStrided, op, ": tensors[", i,
                "] must be a strided (dense) tensor; sparse gradients are not supported");
    const auto dt = t.scalar_type();
    TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf ||
                         dt == at::kBFloat16 || dt == at::kComplexFloat ||
                         dt == at::kComplexDouble,
                     op, ": tensors[", i, "] has unsupported dtype ", dt);
    TORCH_CHECK(t.device() == device, op, ": tensors[", i, "] is on ", t.device(),
                " but found_inf is on ", device);
  }
}

void check_unscale_args(at::TensorList tensors, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale,
                        const std::optional<at::Tensor>& clip_coef) {
  check_amp_tensors("unscale_", tensors, found_inf);
  TORCH_CHECK_TYPE(inv_scale.scalar_type() == at::kFloat,
                   "unscale_: inv_scale must be a float32 tensor, got ", inv_scale.scalar_type());
  TORCH_CHECK_VALUE(inv_scale.numel() == 1,
                    "unscale_: inv_scale must hold exactly one element, got shape ",
                    inv_scale.sizes());
  TORCH_CHECK(inv_scale.device() == found_inf.device(), "unscale_: inv_scale is on ",
              inv_scale.device(), " but found_inf is on ", found_inf.device());
  if (clip_coef) {
    const auto dt = clip_coef->scalar_type();
    TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kDouble,
                     "unscale_: clip_coef must be a float32 or float64 tensor, got ", dt);
    TORCH_CHECK_VALUE(clip_coef->numel() == 1,
                      "unscale_: clip_coef must hold exactly one element, got shape ",
                      clip_coef->sizes());
    TORCH_CHECK(clip_coef->device() == found_inf.device(), "unscale_: clip_coef is on ",
                clip_coef->device(), " but found_inf is on ", found_inf.device());
  }
}

namespace {

// One of update_scale_'s 1-element state tensors: defined, of its dtype
// (`kind`: "a float32"), on the scale's device.
void check_state_tensor(const char* name, const at::Tensor& t, at::ScalarType dtype,
                        const char* kind, const at::Tensor& scale) {
  const char* op = "update_scale_";
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, " must be ", kind,
                   " tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == 1, op, ": ", name, " must hold exactly one element, got shape ",
                    t.sizes());
  TORCH_CHECK(t.device() == scale.device(), op, ": ", name, " is on ", t.device(),
              " but scale is on ", scale.device());
}

}  // namespace

void check_update_scale_settings(const UpdateScaleSettings& s) {
  const char* op = "update_scale_";
  TORCH_CHECK_VALUE(s.growth_factor > 1.0 && std::isfinite(s.growth_factor), op,
                    ": growth_factor must be > 1 and finite, got ", s.growth_factor);
  TORCH_CHECK_VALUE(s.backoff_factor > 0.0 && s.backoff_factor < 1.0, op,
                    ": backoff_factor must be in (0, 1), got ", s.backoff_factor);
  TORCH_CHECK_VALUE(s.growth_interval >= 1, op, ": growth_interval must be >= 1, got ",
                    s.growth_interval);
  TORCH_CHECK_VALUE(s.hysteresis >= 1, op, ": hysteresis must be >= 1, got ", s.hysteresis);
  TORCH_CHECK_VALUE(std::isfinite(s.min_scale), op, ": min_scale must be finite, got ",
                    s.min_scale);
  TORCH_CHECK_VALUE(!std::isnan(s.max_scale), op,
                    ": max_scale must not be NaN (inf or None: no clamp), got ", s.max_scale);
  TORCH_CHECK_VALUE(s.min_scale >= 0.0 && s.min_scale <= s.max_scale, op,
                    ": need 0 <= min_scale <= max_scale, got min_scale=", s.min_scale,
                    ", max_scale=", s.max_scale);
}

void check_update_scale_args(const UpdateScaleArgs& a) {
  check_state_tensor("scale", a.scale, at::kFloat, "a float32", a.scale);
  check_state_tensor("growth_tracker", a.growth_tracker, at::kInt, "an int32", a.scale);
  check_state_tensor("hysteresis_tracker", a.hysteresis_tracker, at::kInt, "an int32", a.scale);
  TORCH_CHECK(a.found_inf.defined(), "update_scale_: found_inf is undefined");
  check_found_inf("update_scale_", a.found_inf, a.scale.device());
  check_update_scale_settings(a.settings);
  if (a.counted()) {
    check_state_tensor("last_step_skipped", a.last_step_skipped, at::kBool, "a bool", a.scale);
    check_state_tensor("skipped_steps", a.skipped_steps, at::kLong, "an int64", a.scale);
  }
}

}  // namespace torchext

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

void check_update_scale_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                             const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                             double growth_factor, double backoff_factor, int64_t growth_interval,
                             int64_t hysteresis, std::optional<double> min_scale,
                             std::optional<double> max_scale) {
  const char* op = "update_scale_";
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat, op,
                   ": scale must be a float32 tensor, got ", scale.scalar_type());
  TORCH_CHECK_VALUE(scale.numel() == 1, op, ": scale must hold exactly one element, got shape ",
                    scale.sizes());
  const c10::Device device = scale.device();
  TORCH_CHECK_TYPE(growth_tracker.scalar_type() == at::kInt, op,
                   ": growth_tracker must be an int32 tensor, got ", growth_tracker.scalar_type());
  TORCH_CHECK_VALUE(growth_tracker.numel() == 1, op,
                    ": growth_tracker must hold exactly one element, got shape ",
                    growth_tracker.sizes());
  TORCH_CHECK(growth_tracker.device() == device, op, ": growth_tracker is on ",
              growth_tracker.device(), " but scale is on ", device);
  TORCH_CHECK_TYPE(hysteresis_tracker.scalar_type() == at::kInt, op,
                   ": hysteresis_tracker must be an int32 tensor, got ",
                   hysteresis_tracker.scalar_type());
  TORCH_CHECK_VALUE(hysteresis_tracker.numel() == 1, op,
                    ": hysteresis_tracker must hold exactly one element, got shape ",
                    hysteresis_tracker.sizes());
  TORCH_CHECK(hysteresis_tracker.device() == device, op, ": hysteresis_tracker is on ",
              hysteresis_tracker.device(), " but scale is on ", device);
  check_found_inf(op, found_inf, device);
  TORCH_CHECK_VALUE(growth_factor > 1.0 && std::isfinite(growth_factor), op,
                    ": growth_factor must be > 1 and finite, got ", growth_factor);
  TORCH_CHECK_VALUE(backoff_factor > 0.0 && backoff_factor < 1.0, op,
                    ": backoff_factor must be in (0, 1), got ", backoff_factor);
  TORCH_CHECK_VALUE(growth_interval >= 1, op, ": growth_interval must be >= 1, got ",
                    growth_interval);
  TORCH_CHECK_VALUE(hysteresis >= 1, op, ": hysteresis must be >= 1, got ", hysteresis);
  const double lo = min_scale.value_or(0.0);
  TORCH_CHECK_VALUE(std::isfinite(lo), op, ": min_scale must be finite, got ", lo);
  const double hi = max_scale.value_or(std::numeric_limits<double>::infinity());
  TORCH_CHECK_VALUE(!std::isnan(hi), op,
                    ": max_scale must not be NaN (inf or None: no clamp), got ", hi);
  TORCH_CHECK_VALUE(lo >= 0.0 && lo <= hi, op, ": need 0 <= min_scale <= max_scale, got min_scale=",
                    lo, ", max_scale=", hi);
}

void check_update_scale_counted_args(
    const at::Tensor& scale, const at::Tensor& growth_tracker,
    const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
    const at::Tensor& last_step_skipped, const at::Tensor& skipped_steps, double growth_factor,
    double backoff_factor, int64_t growth_interval, int64_t hysteresis,
    std::optional<double> min_scale, std::optional<double> max_scale) {
  check_update_scale_args(scale, growth_tracker, hysteresis_tracker, found_inf, growth_factor,
                          backoff_factor, growth_interval, hysteresis, min_scale, max_scale);
  const char* op = "update_scale_";
  const c10::Device device = scale.device();
  TORCH_CHECK_TYPE(last_step_skipped.scalar_type() == at::kBool, op,
                   ": last_step_skipped must be a bool tensor, got ",
                   last_step_skipped.scalar_type());
  TORCH_CHECK_VALUE(last_step_skipped.numel() == 1, op,
                    ": last_step_skipped must hold exactly one element, got shape ",
                    last_step_skipped.sizes());
  TORCH_CHECK(last_step_skipped.device() == device, op, ": last_step_skipped is on ",
              last_step_skipped.device(), " but scale is on ", device);
  TORCH_CHECK_TYPE(skipped_steps.scalar_type() == at::kLong, op,
                   ": skipped_steps must be an int64 tensor, got ", skipped_steps.scalar_type());
  TORCH_CHECK_VALUE(skipped_steps.numel() == 1, op,
                    ": skipped_steps must hold exactly one element, got shape ",
                    skipped_steps.sizes());
  TORCH_CHECK(skipped_steps.device() == device, op, ": skipped_steps is on ",
              skipped_steps.device(), " but scale is on ", device);
}

}  // namespace torchext

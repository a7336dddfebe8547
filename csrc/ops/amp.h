// Validation of the AMP ops (check_finite_, unscale_, update_scale_), run by
// every kernel (CPU, CUDA, Meta) before it touches anything, and by the C++
// GradScaler for its options.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace torchext {

void check_found_inf(const char* op, const at::Tensor& found_inf, const c10::Device& device);
void check_amp_tensors(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
                       bool allow_fp16 = true);
void check_unscale_args(at::TensorList tensors, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale,
                        const std::optional<at::Tensor>& clip_coef = std::nullopt);
void check_update_scale_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                             const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                             double growth_factor, double backoff_factor,
                             int64_t growth_interval, int64_t hysteresis,
                             std::optional<double> min_scale, std::optional<double> max_scale);
// update_scale_.counted: the above, plus its skip record (last_step_skipped:
// one bool, skipped_steps: one int64, both on the scale's device).
void check_update_scale_counted_args(
    const at::Tensor& scale, const at::Tensor& growth_tracker,
    const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
    const at::Tensor& last_step_skipped, const at::Tensor& skipped_steps, double growth_factor,
    double backoff_factor, int64_t growth_interval, int64_t hysteresis,
    std::optional<double> min_scale, std::optional<double> max_scale);

}  // namespace torchext

// Validation of the AMP ops (check_finite_, unscale_, update_scale_), run by
// every kernel (CPU, CUDA, Meta) before it touches anything, and by the C++
// GradScaler for its options.
#pragma once

#include "update_scale_args.h"

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
// update_scale_'s settings (also the C++ GradScaler's options), and a whole
// call of either overload (the skip record when a.counted()).
void check_update_scale_settings(const UpdateScaleSettings& s);
void check_update_scale_args(const UpdateScaleArgs& a);

}  // namespace torchext

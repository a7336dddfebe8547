// Meta kernels: the same validation as the real kernels, so bad input fails
// at trace time with the same message, and no data is touched.
#include "../asgd_args.h"

#include <torch/library.h>

namespace torchext {
namespace {

void asgd_meta(at::TensorList params, at::TensorList grads, at::TensorList axs,
               at::TensorList mus, at::TensorList etas, at::TensorList steps, double lr,
               double lambd, double alpha, double t0, double weight_decay, bool maximize,
               const std::optional<at::Tensor>& grad_scale,
               const std::optional<at::Tensor>& found_inf) {
  check_asgd_args({params, grads, axs, mus, etas, steps, lr, std::nullopt, lambd, alpha, t0,
                   weight_decay, maximize, grad_scale, found_inf});
}

void asgd_meta_tensor_lr(at::TensorList params, at::TensorList grads, at::TensorList axs,
                         at::TensorList mus, at::TensorList etas, at::TensorList steps,
                         const at::Tensor& lr, double lambd, double alpha, double t0,
                         double weight_decay, bool maximize,
                         const std::optional<at::Tensor>& grad_scale,
                         const std::optional<at::Tensor>& found_inf) {
  check_asgd_args({params, grads, axs, mus, etas, steps, 0.0, lr, lambd, alpha, t0,
                   weight_decay, maximize, grad_scale, found_inf});
}

void check_finite_meta(at::TensorList tensors, const at::Tensor& found_inf) {
  check_amp_tensors("check_finite_", tensors, found_inf);
}

void unscale_meta(at::TensorList tensors, const at::Tensor& found_inf,
                  const at::Tensor& inv_scale) {
  check_unscale_args(tensors, found_inf, inv_scale);
}

void update_scale_meta(const at::Tensor& scale, const at::Tensor& growth_tracker,
                       const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval,
                       int64_t hysteresis, std::optional<double> min_scale,
                       std::optional<double> max_scale) {
  check_update_scale_args(scale, growth_tracker, hysteresis_tracker, found_inf, growth_factor,
                          backoff_factor, growth_interval, hysteresis, min_scale, max_scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Meta, m) {
  m.impl("asgd_", &asgd_meta);
  m.impl("asgd_.tensor_lr", &asgd_meta_tensor_lr);
  m.impl("check_finite_", &check_finite_meta);
  m.impl("unscale_", &unscale_meta);
  m.impl("update_scale_", &update_scale_meta);
}

}  // namespace torchext

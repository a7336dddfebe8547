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

// Sparse tensors dispatch to the Sparse* keys, where there would otherwise be
// only the dispatcher's "Could not run ..." error. These kernels validate
// (which names the sparse argument) and refuse anything that slips through.
namespace torchext {
namespace {

template <auto Validate, typename... Args>
void reject_sparse(Args... args) {
  Validate(args...);
  TORCH_CHECK(false, "torchext ops do not support sparse tensors");
}

}  // namespace

#define TORCHEXT_REGISTER_SPARSE_REJECTS(m)                                                  \
  m.impl("asgd_", &reject_sparse<&asgd_meta, at::TensorList, at::TensorList, at::TensorList, \
                                 at::TensorList, at::TensorList, at::TensorList, double,     \
                                 double, double, double, double, bool,                       \
                                 const std::optional<at::Tensor>&,                           \
                                 const std::optional<at::Tensor>&>);                         \
  m.impl("asgd_.tensor_lr",                                                                  \
         &reject_sparse<&asgd_meta_tensor_lr, at::TensorList, at::TensorList,                \
                        at::TensorList, at::TensorList, at::TensorList, at::TensorList,      \
                        const at::Tensor&, double, double, double, double, bool,             \
                        const std::optional<at::Tensor>&, const std::optional<at::Tensor>&>); \
  m.impl("check_finite_",                                                                    \
         &reject_sparse<&check_finite_meta, at::TensorList, const at::Tensor&>);            \
  m.impl("unscale_", &reject_sparse<&unscale_meta, at::TensorList, const at::Tensor&,        \
                                    const at::Tensor&>);

TORCH_LIBRARY_IMPL(torchext, SparseCPU, m) {
  TORCHEXT_REGISTER_SPARSE_REJECTS(m)
}
TORCH_LIBRARY_IMPL(torchext, SparseCUDA, m) {
  TORCHEXT_REGISTER_SPARSE_REJECTS(m)
}

}  // namespace torchext

// CompositeExplicitAutograd kernels are what the dispatcher runs when a call
// has no tensor at all (empty lists: a no-op, as documented) and on devices
// with no torchext kernel (a clear error instead of "Could not run ...").
namespace torchext {
namespace {

template <auto Validate, typename... Args>
void no_kernel_for_device(at::TensorList tensors, Args... args) {
  Validate(tensors, args...);
  TORCH_CHECK(tensors.empty(), "torchext has no kernel for device ", tensors[0].device(),
              "; its ops run on CPU and CUDA (and Meta for tracing)");
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CompositeExplicitAutograd, m) {
  m.impl("asgd_",
         &no_kernel_for_device<&asgd_meta, at::TensorList, at::TensorList, at::TensorList,
                               at::TensorList, at::TensorList, double, double, double, double,
                               double, bool, const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&>);
  m.impl("asgd_.tensor_lr",
         &no_kernel_for_device<&asgd_meta_tensor_lr, at::TensorList, at::TensorList,
                               at::TensorList, at::TensorList, at::TensorList,
                               const at::Tensor&, double, double, double, double, bool,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&>);
  m.impl("check_finite_",
         &no_kernel_for_device<&check_finite_meta, const at::Tensor&>);
  m.impl("unscale_",
         &no_kernel_for_device<&unscale_meta, const at::Tensor&, const at::Tensor&>);
}

}  // namespace torchext

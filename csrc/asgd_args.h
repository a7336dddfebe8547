// The arguments of torchext::asgd_ and the validation that every kernel
// (CPU, CUDA, Meta) runs before it touches anything, so bad input fails with
// the same message on every device and at trace time.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>

namespace torchext {

struct ASGDArgs {
  at::TensorList params, grads, axs, mus, etas, steps;
  double lr = 0.0;                      // used when lr_tensor is empty
  std::optional<at::Tensor> lr_tensor;  // the 0-d tensor-lr overload
  double lambd = 0.0, alpha = 0.0, t0 = 0.0, weight_decay = 0.0;
  bool maximize = false;
  std::optional<at::Tensor> grad_scale, found_inf;
};

// Throws c10::Error (ValueError/TypeError/RuntimeError in Python) naming the
// first problem found. Mutates nothing.
void check_asgd_args(const ASGDArgs& a);

// The two registered signatures of asgd_ (float lr and tensor lr) as
// wrappers around one implementation taking ASGDArgs, for every device:
//   m.impl("asgd_", &ASGDKernel<impl>::float_lr);
//   m.impl("asgd_.tensor_lr", &ASGDKernel<impl>::tensor_lr);
template <void (*Impl)(const ASGDArgs&)>
struct ASGDKernel {
  static void float_lr(at::TensorList params, at::TensorList grads, at::TensorList axs,
                       at::TensorList mus, at::TensorList etas, at::TensorList steps, double lr,
                       double lambd, double alpha, double t0, double weight_decay, bool maximize,
                       const std::optional<at::Tensor>& grad_scale,
                       const std::optional<at::Tensor>& found_inf) {
    Impl({params, grads, axs, mus, etas, steps, lr, std::nullopt, lambd, alpha, t0, weight_decay,
          maximize, grad_scale, found_inf});
  }
  static void tensor_lr(at::TensorList params, at::TensorList grads, at::TensorList axs,
                        at::TensorList mus, at::TensorList etas, at::TensorList steps,
                        const at::Tensor& lr, double lambd, double alpha, double t0,
                        double weight_decay, bool maximize,
                        const std::optional<at::Tensor>& grad_scale,
                        const std::optional<at::Tensor>& found_inf) {
    Impl({params, grads, axs, mus, etas, steps, 0.0, lr, lambd, alpha, t0, weight_decay,
          maximize, grad_scale, found_inf});
  }
};

// Reads a 1-element float/double/int tensor that lives on the CPU.
double read_cpu_scalar(const at::Tensor& t);

// Validation shared by the AMP ops.
void check_found_inf(const char* op, const at::Tensor& found_inf,
                     const c10::Device& device);
void check_amp_tensors(const char* op, at::TensorList tensors,
                       const at::Tensor& found_inf, bool allow_fp16 = true);
void check_unscale_args(at::TensorList tensors, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale);
void check_update_scale_args(const at::Tensor& scale,
                             const at::Tensor& growth_tracker,
                             const at::Tensor& hysteresis_tracker,
                             const at::Tensor& found_inf,
                             double growth_factor, double backoff_factor,
                             int64_t growth_interval, int64_t hysteresis,
                             std::optional<double> min_scale,
                             std::optional<double> max_scale);

}  // namespace torchext

namespace torchext {

// Validation of swap_: equal lengths; each pair defined, strided, same dtype,
// shape and device, not overlapping in memory; one device for all.
void check_swap_args(at::TensorList tensors, at::TensorList others);

}  // namespace torchext

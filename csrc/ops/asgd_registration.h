// Registers one implementation of asgd_ for both overloads on one dispatch
// key, as typed kernels that read their lists in place (ASGDArgs over the
// dispatcher's c10::List: no tensor is copied). The CPU, CUDA and Meta
// kernels register through it.
#pragma once

#include "asgd_args.h"

#include <torch/library.h>

namespace torchext {

template <void (*Impl)(const ASGDArgs&)>
void asgd_lists_kernel(const TensorListArg& params, const TensorListArg& grads,
                       const TensorListArg& axs, const TensorListArg& mus,
                       const TensorListArg& etas, const TensorListArg& steps,
                       const at::Tensor& lr, double lambd, double alpha, double t0,
                       double weight_decay, bool maximize,
                       const std::optional<at::Tensor>& grad_scale,
                       const std::optional<at::Tensor>& found_inf) {
  ASGDArgs a = asgd_args(TensorRefs(params), TensorRefs(grads), TensorRefs(axs), lr,
                         {lambd, alpha, t0, weight_decay, maximize}, grad_scale, found_inf);
  a.mus = TensorRefs(mus);
  a.etas = TensorRefs(etas);
  a.steps = TensorRefs(steps);
  Impl(a);
}

template <void (*Impl)(const ASGDArgs&)>
void asgd_packed_kernel(const TensorListArg& params, const TensorListArg& grads,
                        const TensorListArg& axs, const at::Tensor& mus, const at::Tensor& etas,
                        const at::Tensor& steps, const at::Tensor& lr, double lambd,
                        double alpha, double t0, double weight_decay, bool maximize,
                        const std::optional<at::Tensor>& grad_scale,
                        const std::optional<at::Tensor>& found_inf) {
  ASGDArgs a = asgd_args(TensorRefs(params), TensorRefs(grads), TensorRefs(axs), lr,
                         {lambd, alpha, t0, weight_decay, maximize}, grad_scale, found_inf);
  a.packed_mus = mus;
  a.packed_etas = etas;
  a.packed_steps = steps;
  Impl(a);
}

template <void (*Impl)(const ASGDArgs&)>
void register_asgd_kernels(torch::Library& m) {
  m.impl("asgd_", TORCH_FN(asgd_lists_kernel<Impl>));
  m.impl("asgd_.packed", TORCH_FN(asgd_packed_kernel<Impl>));
}

}  // namespace torchext

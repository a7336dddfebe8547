// Registers one implementation of asgd_ for both overloads on one dispatch
// key, as one typed kernel that reads its lists in place (ASGDArgs over the
// dispatcher's c10::List: no tensor is copied). The CPU, CUDA and Meta
// kernels register through it.
#pragma once

#include "asgd_args.h"

#include <torch/library.h>

namespace torchext {

// The typed kernel of both overloads: `State` is the schedule state's type,
// TensorListArg (asgd_: lists of 0-d tensors) or at::Tensor (asgd_.packed:
// one 1-D tensor each). The dispatcher checks this signature against each
// schema at registration; the hyperparameters come in ASGDHyperparams'
// order (asgd_args.h), which asgd_op() checks against the schema's names.
// The schedule state as asgd_args takes it: a list as references into it,
// a packed tensor as it is.
inline TensorRefs state_arg(const TensorListArg& list) { return TensorRefs(list); }
inline const at::Tensor& state_arg(const at::Tensor& packed) { return packed; }

template <void (*Impl)(const ASGDArgs&), typename State>
void asgd_kernel(const TensorListArg& params, const TensorListArg& grads,
                 const TensorListArg& axs, const State& mus, const State& etas,
                 const State& steps, const at::Tensor& lr, double lambd, double alpha,
                 double t0, double weight_decay, bool maximize,
                 const std::optional<at::Tensor>& grad_scale,
                 const std::optional<at::Tensor>& found_inf,
                 const std::optional<at::Tensor>& clip_coef,
                 std::optional<int64_t> rounding_seed, at::OptionalIntArrayRef rounding_ids,
                 at::OptionalIntArrayRef rounding_offsets) {
  ASGDArgs a = asgd_args(TensorRefs(params), TensorRefs(grads), TensorRefs(axs), state_arg(mus),
                         state_arg(etas), state_arg(steps), lr,
                         {lambd, alpha, t0, weight_decay, maximize}, grad_scale, found_inf,
                         clip_coef);
  a.rounding_seed = rounding_seed;
  a.rounding_ids = rounding_ids;
  a.rounding_offsets = rounding_offsets;
  Impl(a);
}

template <void (*Impl)(const ASGDArgs&)>
void register_asgd_kernels(torch::Library& m) {
  m.impl("asgd_", TORCH_FN((asgd_kernel<Impl, TensorListArg>)));
  m.impl("asgd_.packed", TORCH_FN((asgd_kernel<Impl, at::Tensor>)));
}

}  // namespace torchext

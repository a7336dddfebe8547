// An asgd_ call's arguments as the kernels read them (ASGDArgs), and the
// handles of the op's two overloads. The schemas are plain strings in
// schemas.cpp; the kernel is typed (asgd_registration.h) and the dispatcher
// checks its signature against the schema at registration.
//
// A new hyperparameter: the two schemas; ASGDHyperparams below (its field,
// kNames, from, from_values) and asgd_stack, the one C++ home of their order
// (asgd_op() checks kNames against the schema); the kernel's signature in
// asgd_registration.h; one field in the math; and a key of the same name in
// the optimizer's param groups / ASGDOptions. Python reads the names from
// the registered schema (torchext/optim/_op.py) and hands the C++ holder
// their values in that order (from_values).
#pragma once

#include "../utils/cpu_scalars.h"
#include "../utils/tensor_refs.h"

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/util/OptionalArrayRef.h>

#include <optional>
#include <vector>

namespace torchext {

// The keyword-only scalars of asgd_, between `lr` and `grad_scale`, in
// schema order: the fields, kNames, from_values and asgd_stack all follow it.
struct ASGDHyperparams {
  double lambd = 0.0;
  double alpha = 0.0;
  double t0 = 0.0;
  double weight_decay = 0.0;
  bool maximize = false;

  static constexpr const char* kNames[] = {"lambd", "alpha", "t0", "weight_decay", "maximize"};

  // From any object with these names as getters (ASGDOptions).
  template <typename Options>
  static ASGDHyperparams from(const Options& o) {
    return {o.lambd(), o.alpha(), o.t0(), o.weight_decay(), o.maximize()};
  }
  // From their values in schema order, bools as 0/1 (what Python's
  // _op.hyper_list gives the C++ holder).
  static ASGDHyperparams from_values(const std::vector<double>& values);
};

struct ASGDArgs : ASGDHyperparams {
  TensorRefs params, grads, axs;
  // The schedule state: lists of one-element tensors, or (.packed) one 1-D
  // tensor each, element i for params[i].
  TensorRefs mus, etas, steps;
  at::Tensor packed_mus, packed_etas, packed_steps;  // defined for .packed
  // A 1-element floating tensor, on the CPU (read on the host: no sync) or
  // on the params' device (read there, so a changing lr neither syncs nor
  // recompiles).
  at::Tensor lr;
  std::optional<at::Tensor> grad_scale, found_inf;
  // A gradient clip's coefficient (float32 or float64, one element): the
  // unscaled grads are multiplied by it, a second factor after grad_scale's.
  std::optional<at::Tensor> clip_coef;
  // Stochastic rounding of fp16/bf16 params (the schema's rounding_*): the
  // seed, or nullopt (round to nearest), and per entry its id and the index
  // of its first element in the unsharded tensor (default: i and 0).
  std::optional<int64_t> rounding_seed;
  at::OptionalIntArrayRef rounding_ids, rounding_offsets;

  bool packed() const { return packed_steps.defined(); }
  // Entry i takes part in the step only when it has a gradient: a param
  // whose grad is undefined (only C++ callers can pass one) is left alone
  // (nothing of it is read or written, its ax may be undefined), as
  // torch.optim skips params without grads.
  bool active(size_t i) const { return grads[i].defined(); }
  // Where entry i's mu/eta/step live (float or double: ASGDCall::state_dtype).
  void* mu_ptr(size_t i) const;
  void* eta_ptr(size_t i) const;
  void* step_ptr(size_t i) const;
  // Entry i's random stream (math::sr_stream) and its first element's index.
  uint64_t rounding_stream(size_t i) const;
  int64_t rounding_offset(size_t i) const {
    return rounding_offsets.has_value() ? (*rounding_offsets)[i] : 0;
  }
  // lr on the host; only valid when lr lives on the CPU.
  double lr_on_host() const { return read_cpu_scalar(lr); }
};

// A Tensor[] argument. As a typed kernel's `const c10::List<at::Tensor>&`
// the dispatcher hands over the caller's list itself (one reference), where
// std::vector<at::Tensor> or at::TensorList would copy every tensor in it.
using TensorListArg = c10::List<at::Tensor>;

constexpr const char* kASGDOverloads[] = {"asgd_", "asgd_.packed"};
enum class ASGDState { kLists, kPacked };

// How C++ callers (the C++ API, the Python optimizer's group holder) call
// the op: boxed, as Python does, with the arguments pushed in schema order
// (asgd_stack) and asgd_op(state).callBoxed(&stack). A boxed call picks the
// kernel from every tensor argument, the lists' included. An unboxed call
// (TypedOperatorHandle::call) would not: the dispatcher reads no device
// from a c10::List<at::Tensor> argument, only from lr and the optional
// tensors, so meta or CUDA params with a CPU lr would reach the CPU kernel.
const c10::OperatorHandle& asgd_op(ASGDState state);
// The rounding_* arguments as C++ callers push them: ids and offsets as
// IValues (None, or an int list a caller may keep and push again each step).
struct ASGDRoundingArgs {
  std::optional<int64_t> seed;
  c10::IValue ids, offsets;
};
torch::jit::Stack asgd_stack(c10::IValue params, c10::IValue grads, c10::IValue axs,
                             c10::IValue mus, c10::IValue etas, c10::IValue steps,
                             const at::Tensor& lr, const ASGDHyperparams& hyper,
                             const std::optional<at::Tensor>& grad_scale,
                             const std::optional<at::Tensor>& found_inf,
                             const std::optional<at::Tensor>& clip_coef = std::nullopt,
                             const ASGDRoundingArgs& rounding = {});

// ASGDArgs over one call's arguments. The TensorRefs point into the
// caller's lists: use the result while they live. Without state (left to
// the caller), with the state as lists (asgd_), or packed (asgd_.packed).
ASGDArgs asgd_args(TensorRefs params, TensorRefs grads, TensorRefs axs, const at::Tensor& lr,
                   const ASGDHyperparams& hyper, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf,
                   const std::optional<at::Tensor>& clip_coef = std::nullopt);
ASGDArgs asgd_args(TensorRefs params, TensorRefs grads, TensorRefs axs, TensorRefs mus,
                   TensorRefs etas, TensorRefs steps, const at::Tensor& lr,
                   const ASGDHyperparams& hyper, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf,
                   const std::optional<at::Tensor>& clip_coef = std::nullopt);
ASGDArgs asgd_args(TensorRefs params, TensorRefs grads, TensorRefs axs, const at::Tensor& mus,
                   const at::Tensor& etas, const at::Tensor& steps, const at::Tensor& lr,
                   const ASGDHyperparams& hyper, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf,
                   const std::optional<at::Tensor>& clip_coef = std::nullopt);

}  // namespace torchext

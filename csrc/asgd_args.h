// The arguments of torchext::asgd_ and the validation that every kernel
// (CPU, CUDA, Meta) runs before it touches anything, so bad input fails with
// the same message on every device and at trace time.
#pragma once

#include "prefetch.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace torchext {

// A list argument as the kernels see it: references into the caller's list
// (the dispatcher's IValues, or a C++ ArrayRef). Copying a Tensor[] argument
// into std::vector<at::Tensor>, as unboxed kernels get it, costs two atomic
// refcount updates per tensor, the largest kernel-side cost per tensor.
class TensorRefs {
 public:
  TensorRefs() = default;
  explicit TensorRefs(at::TensorList ts);
  explicit TensorRefs(c10::ArrayRef<c10::IValue> vs);
  size_t size() const { return ptrs_.size(); }
  bool empty() const { return ptrs_.empty(); }
  const at::Tensor& operator[](size_t i) const { return *ptrs_[i]; }

 private:
  std::vector<const at::Tensor*> ptrs_;
};

struct ASGDArgs {
  TensorRefs params, grads, axs;
  // The schedule state: lists of one-element tensors, or (the .packed
  // overloads) one 1-D tensor each, element i for params[i].
  TensorRefs mus, etas, steps;
  double lr = 0.0;                      // used when lr_tensor is empty
  std::optional<at::Tensor> lr_tensor;  // the 0-d tensor-lr overload
  double lambd = 0.0, alpha = 0.0, t0 = 0.0, weight_decay = 0.0;
  bool maximize = false;
  std::optional<at::Tensor> grad_scale, found_inf;
  at::Tensor packed_mus, packed_etas, packed_steps;  // defined for .packed

  bool packed() const { return packed_steps.defined(); }
  // Where entry i's mu/eta/step live (float or double, see state_dtype()).
  void* mu_ptr(size_t i) const;
  void* eta_ptr(size_t i) const;
  void* step_ptr(size_t i) const;
  at::ScalarType state_dtype() const {
    return packed() ? packed_steps.scalar_type() : steps[0].scalar_type();
  }
};

// Throws c10::Error (ValueError/TypeError/RuntimeError in Python) naming the
// first problem found. Mutates nothing. It is check_asgd_header, then
// check_asgd_entry for every index; a kernel may run those itself, to read
// each entry's pointers in the same pass that checks it (with thousands of
// small tensors the step's cost is fetching their metadata into cache), as
// long as it writes nothing before the last entry was checked.
void check_asgd_args(const ASGDArgs& a);
// Call before check_asgd_entry(a, i, ...) in a loop over i: asks for the
// metadata of the entries a few ahead (prefetch.h), so that their cache
// misses overlap instead of coming one after the other.
inline void prefetch_asgd_ahead(const ASGDArgs& a, size_t i) {
  const size_t n = a.params.size();
  const auto each = [&](size_t j, auto&& fn) {
    if (j >= n) return;
    fn(a.params[j].unsafeGetTensorImpl());
    fn(a.grads[j].unsafeGetTensorImpl());
    fn(a.axs[j].unsafeGetTensorImpl());
    if (!a.packed()) {
      fn(a.mus[j].unsafeGetTensorImpl());
      fn(a.etas[j].unsafeGetTensorImpl());
      fn(a.steps[j].unsafeGetTensorImpl());
    }
  };
  each(i + kPrefetchImpl, prefetch_impl);
  each(i + kPrefetchStorage, prefetch_storage);
}
// The list lengths, the hyperparameters, lr/grad_scale/found_inf, and that
// params[0] and steps[0] (which give the device and the state dtype) exist.
void check_asgd_header(const ASGDArgs& a);
// Entry i of every list, against params[0]'s device and steps[0]'s dtype.
void check_asgd_entry(const ASGDArgs& a, size_t i, const c10::Device& device,
                      at::ScalarType state_dtype);

// The arguments of any asgd_ overload (float or tensor lr, state in lists or
// packed), read from the top of the dispatcher's stack without copying the
// tensor lists.
constexpr size_t kASGDNumArgs = 14;
ASGDArgs asgd_args_from_stack(const torch::jit::Stack& stack);

template <void (*Impl)(const ASGDArgs&)>
void asgd_boxed(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  Impl(asgd_args_from_stack(*stack));
  torch::jit::drop(*stack, kASGDNumArgs);
}

// Registers Impl for every overload of asgd_ on one dispatch key, as a boxed
// kernel (see TensorRefs; C++ callers of the typed op get boxed once by the
// dispatcher, which costs what the unboxed kernel's copy did).
constexpr const char* kASGDOverloads[] = {"asgd_", "asgd_.tensor_lr", "asgd_.packed",
                                           "asgd_.packed_tensor_lr"};

template <void (*Impl)(const ASGDArgs&)>
void register_asgd_kernels(torch::Library& m) {
  for (const char* name : kASGDOverloads) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&asgd_boxed<Impl>>());
  }
}

// The two overloads of asgd_ as typed dispatcher handles, for C++ callers
// (the C++ API and the Python optimizer's C++ plan call the op exactly as
// Python does).
using AsgdOp = void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                    at::TensorList, at::TensorList, double, double, double, double, double,
                    bool, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&);
using AsgdTensorLrOp = void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                            at::TensorList, at::TensorList, const at::Tensor&, double, double,
                            double, double, bool, const std::optional<at::Tensor>&,
                            const std::optional<at::Tensor>&);
const c10::TypedOperatorHandle<AsgdOp>& asgd_op();
const c10::TypedOperatorHandle<AsgdTensorLrOp>& asgd_tensor_lr_op();
// The .packed overloads, called boxed (by the Python optimizer's C++ plan).
const c10::OperatorHandle& asgd_packed_op(bool tensor_lr);

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

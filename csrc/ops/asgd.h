// The arguments of torchext::asgd_, named in one table, and the validation
// that every kernel (CPU, CUDA, Meta) runs before it touches anything, so bad
// input fails with the same message on every device and at trace time.
//
// One table: TORCHEXT_ASGD_HYPERPARAMS below lists the op's scalar
// hyperparameters in schema order. The schema (ops.cpp) is generated from
// it, the kernels decode the dispatcher's stack by name (asgd_args_from_stack),
// C++ callers push arguments through push_asgd_args, and Python reads the
// names from the registered schema (torchext/optim/_op.py). Adding a
// hyperparameter means one line here, one field in the math, and a key of
// the same name in the optimizer's param groups / ASGDOptions.
#pragma once

#include "../utils/cpu_scalars.h"
#include "../utils/prefetch.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <c10/util/ArrayRef.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

namespace torchext {

// X(name, C++ type, schema type): the keyword-only scalars of asgd_, between
// `lr` and `grad_scale`, in schema order.
#define TORCHEXT_ASGD_HYPERPARAMS(X) \
  X(lambd, double, "float")          \
  X(alpha, double, "float")          \
  X(t0, double, "float")             \
  X(weight_decay, double, "float")   \
  X(maximize, bool, "bool")

// The two overloads: the schedule state as lists of one-element tensors
// ("asgd_"), or packed, one 1-D tensor each with element i for params[i]
// ("asgd_.packed"). Everything else is the same.
enum class ASGDState { kLists, kPacked };
std::string asgd_schema(ASGDState state);
constexpr const char* kASGDOverloads[] = {"asgd_", "asgd_.packed"};

// A list argument as the kernels see it: references into the caller's list
// (the dispatcher's IValues, or a C++ ArrayRef). Copying a Tensor[] argument
// into std::vector<at::Tensor>, as unboxed kernels get it, costs two atomic
// refcount updates per tensor, the largest kernel-side cost per tensor.
// An undefined tensor (or a None) in a list reads as an undefined tensor.
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

// The hyperparameters as a struct, fields named by the table.
struct ASGDHyperparams {
#define TORCHEXT_ASGD_FIELD(name, type, schema_type) type name{};
  TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_FIELD)
#undef TORCHEXT_ASGD_FIELD

  // From any object with the table's names as getters (ASGDOptions).
  template <typename Options>
  static ASGDHyperparams from(const Options& o) {
    ASGDHyperparams h;
#define TORCHEXT_ASGD_GET(name, type, schema_type) h.name = o.name();
    TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_GET)
#undef TORCHEXT_ASGD_GET
    return h;
  }
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

  bool packed() const { return packed_steps.defined(); }
  // Entry i takes part in the step only when it has a gradient: a param
  // whose grad is undefined (only C++ callers can pass one) is left alone
  // (nothing of it is read or written, its ax may be undefined), as
  // torch.optim skips params without grads.
  bool active(size_t i) const { return grads[i].defined(); }
  // Where entry i's mu/eta/step live (float or double, see state_dtype()).
  void* mu_ptr(size_t i) const;
  void* eta_ptr(size_t i) const;
  void* step_ptr(size_t i) const;
  // lr on the host; only valid when lr lives on the CPU.
  double lr_on_host() const { return read_cpu_scalar(lr); }
};

// Decodes any asgd_ overload from the top of the dispatcher's stack, by
// argument name, without copying the tensor lists.
ASGDArgs asgd_args_from_stack(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
size_t asgd_num_args();

// Pushes one asgd_ call's arguments onto `stack` in schema order.
void push_asgd_args(torch::jit::Stack& stack, c10::IValue params, c10::IValue grads,
                    c10::IValue axs, c10::IValue mus, c10::IValue etas, c10::IValue steps,
                    const at::Tensor& lr, const ASGDHyperparams& hyper,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf);

// The overload's handle, for C++ callers (the C++ API and the Python
// optimizer's group holder call the op through the dispatcher, boxed,
// exactly as Python does).
const c10::OperatorHandle& asgd_op(ASGDState state);

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
    const auto* g = a.grads[j].unsafeGetTensorImpl();
    if (a.grads[j].defined()) fn(g);
    if (a.axs[j].defined()) fn(a.axs[j].unsafeGetTensorImpl());
    if (!a.packed()) {
      fn(a.mus[j].unsafeGetTensorImpl());
      fn(a.etas[j].unsafeGetTensorImpl());
      fn(a.steps[j].unsafeGetTensorImpl());
    }
  };
  each(i + kPrefetchImpl, prefetch_impl);
  each(i + kPrefetchStorage, prefetch_storage);
}
// The list lengths, the hyperparameters, lr/grad_scale/found_inf, and the
// packed state. Returns the call's device and state dtype (those of its
// first active entry, which every other entry must share), or nullopt when
// no entry is active: the call then changes nothing.
struct ASGDCall {
  c10::Device device;
  at::ScalarType state_dtype;
};
std::optional<ASGDCall> check_asgd_header(const ASGDArgs& a);
// Entry i of every list (nothing when it is not active), against the call's
// device and state dtype.
void check_asgd_entry(const ASGDArgs& a, size_t i, const c10::Device& device,
                      at::ScalarType state_dtype);

// Registers Impl for every overload of asgd_ on one dispatch key, as a boxed
// kernel (see TensorRefs).
template <void (*Impl)(const ASGDArgs&)>
void asgd_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Impl(asgd_args_from_stack(op, *stack));
  torch::jit::drop(*stack, asgd_num_args());
}

template <void (*Impl)(const ASGDArgs&)>
void register_asgd_kernels(torch::Library& m) {
  for (const char* name : kASGDOverloads) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&asgd_boxed<Impl>>());
  }
}

}  // namespace torchext

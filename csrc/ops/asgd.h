// Validation of torchext::asgd_: what every kernel (CPU, CUDA, Meta) runs
// before it touches anything, so bad input fails with the same message on
// every device and at trace time. The arguments are named in one table
// (asgd_schema.h) and read as ASGDArgs (asgd_stack.h).
#pragma once

#include "asgd_stack.h"
#include "../utils/prefetch.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>

namespace torchext {

// Throws c10::Error (ValueError/TypeError/RuntimeError in Python) naming the
// first problem found. Mutates nothing. It is check_asgd_header, then
// check_asgd_entry for every index; a kernel may run those itself, to read
// each entry's pointers in the same pass that checks it (with thousands of
// small tensors the step's cost is fetching their metadata into cache), as
// long as it writes nothing before the last entry was checked.
void check_asgd_args(const ASGDArgs& a);
// Call before check_asgd_entry(a, i, ...) in a loop over i: asks for the
// metadata of the entries a few ahead (utils/prefetch.h), so that their cache
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
// check_asgd_args, returning what check_asgd_header returned.
std::optional<ASGDCall> check_asgd_call(const ASGDArgs& a);

}  // namespace torchext

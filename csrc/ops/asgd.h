// Validation of torchext::asgd_: what every kernel (CPU, CUDA, Meta) runs
// before it touches anything, so bad input fails with the same message on
// every device and at trace time. The kernels read their arguments as
// ASGDArgs (asgd_args.h).
#pragma once

#include "asgd_args.h"
#include "../utils/dense_views.h"
#include "../utils/prefetch.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <vector>

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
// The list lengths, the hyperparameters, lr/grad_scale/found_inf/clip_coef, and the
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

// One active entry, checked, as the flat real memory a kernel walks.
struct ASGDFlatEntry {
  size_t index;          // in the call's lists
  at::ScalarType dtype;  // real: a complex tensor is walked as interleaved pairs
  void* p;
  void* ax;
  at::ScalarType ax_dtype;  // dtype, or float for half/bfloat16 (a float32 average)
  const void* g;
  int64_t numel;  // of dtype
};

// The per-entry pass every kernel with memory (CPU, CUDA) makes: checks each
// active entry (check_asgd_entry) in the same pass that takes its pointers,
// and calls visit(entry) for it, in list order. Tensors that can be walked
// as flat memory (the common case) are used in place, without making views;
// the others go through DenseTriple temporaries appended to `copies`, which
// the caller writes back after its kernels ran. Writes nothing, so a kernel
// that writes only after the pass keeps bad input from changing anything.
template <typename Visit>
void for_each_checked_entry(const ASGDArgs& a, const ASGDCall& call,
                            std::vector<DenseTriple>& copies, Visit&& visit) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    prefetch_asgd_ahead(a, i);
    if (!a.active(i)) continue;
    check_asgd_entry(a, i, call.device, call.state_dtype);
    const at::Tensor& p = a.params[i];
    const at::Tensor& g = a.grads[i];
    const at::Tensor& ax = a.axs[i];
    if (is_flat_triple(p, g, ax)) {
      const at::ScalarType dtype = p.scalar_type();
      const bool complex = at::isComplexType(dtype);
      const at::ScalarType real = complex ? c10::toRealValueType(dtype) : dtype;
      visit(ASGDFlatEntry{i, real, p.data_ptr(), ax.data_ptr(),
                          complex ? real : ax.scalar_type(), g.const_data_ptr(),
                          p.numel() * (complex ? 2 : 1)});
    } else {
      const DenseTriple& d = copies.emplace_back(make_dense_triple(p, g, ax));
      visit(ASGDFlatEntry{i, d.p.scalar_type(), d.p.data_ptr(), d.ax.data_ptr(),
                          d.ax.scalar_type(), d.g.const_data_ptr(), d.p.numel()});
    }
  }
}

}  // namespace torchext

#include "swap.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

namespace torchext {

void check_swap_args(at::TensorList tensors, at::TensorList others) {
  TORCH_CHECK_VALUE(tensors.size() == others.size(),
                    "swap_: tensors and others must have the same length, got ", tensors.size(),
                    " and ", others.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& a = tensors[i];
    const at::Tensor& b = others[i];
    TORCH_CHECK(a.defined() && b.defined(), "swap_: tensors[", i, "] or others[", i,
                "] is undefined");
    TORCH_CHECK(a.layout() == at::kStrided && b.layout() == at::kStrided, "swap_: tensors[", i,
                "] and others[", i, "] must be strided (dense) tensors");
    TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "swap_: tensors[", i, "] has dtype ",
                     a.scalar_type(), " but others[", i, "] has dtype ", b.scalar_type());
    // sym_sizes: under tracing (Meta/fake tensors) the sizes may be symbolic.
    TORCH_CHECK_VALUE(a.sym_sizes() == b.sym_sizes(), "swap_: tensors[", i, "] has shape ",
                      a.sym_sizes(), " but others[", i, "] has shape ", b.sym_sizes());
    TORCH_CHECK(a.device() == tensors[0].device() && b.device() == tensors[0].device(),
                "swap_: all tensors must be on one device; tensors[0] is on ", tensors[0].device(),
                " but tensors[", i, "] is on ", a.device(), " and others[", i, "] on ",
                b.device());
    if (a.is_meta()) continue;  // no memory to overlap (and sizes may be symbolic)
    TORCH_CHECK(at::has_internal_overlap(a) != at::MemOverlap::Yes &&
                    at::has_internal_overlap(b) != at::MemOverlap::Yes,
                "swap_: tensors[", i, "] or others[", i,
                "] has elements that share memory (e.g. an expanded tensor)");
    // TooHard: layouts too irregular to tell, so sharing a storage counts as overlap.
    const auto overlap = at::get_overlap_status(a, b);
    TORCH_CHECK(overlap == at::MemOverlapStatus::No ||
                    (overlap == at::MemOverlapStatus::TooHard && !a.is_alias_of(b)),
                "swap_: tensors[", i, "] and others[", i, "] overlap in memory");
  }
}

}  // namespace torchext

// CPU kernel of tensor_norms: every tensor's vector norm in one read of the
// tensors, chunks spanning all tensors under at::parallel_for (as the ASGD
// and AMP kernels), and with inv_scale/found_inf the norms of the unscaled
// tensors and the inf/NaN check in that same read (the fused clip of
// GradScaler.clip_grad_norm_).
#include "../amp.h"
#include "../norms.h"
#include "../../utils/cpu_scalars.h"
#include "../../utils/dense_views.h"
#include "../../utils/prefetch.h"
#include "chunks.h"
#include "isa_kernels.h"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <vector>

namespace torchext {
namespace {

// A norm rounded to the dtype torch's per-tensor norm has (the tensor's real
// dtype), as torch.stack then holds it in the result's dtype.
double round_to(at::ScalarType dtype, double v) {
  double r = v;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "norm_round", [&] {
    r = static_cast<double>(static_cast<scalar_t>(static_cast<at::opmath_type<scalar_t>>(v)));
  });
  return r;
}

at::Tensor tensor_norms_cpu(at::TensorList tensors, double ord,
                            const std::optional<at::Tensor>& inv_scale,
                            const std::optional<at::Tensor>& found_inf) {
  check_tensor_norms_args(tensors, ord, inv_scale, found_inf);
  const size_t n = tensors.size();
  const auto kind = math::norm_kind(ord);
  const bool scale = inv_scale.has_value();
  const float inv = scale ? static_cast<float>(read_cpu_scalar(*inv_scale)) : 1.0f;

  std::vector<DenseOne> dense;  // only for tensors that are not flat memory
  dense.reserve(n);
  std::vector<int64_t> numels(n), first_chunk(n + 1, 0);
  std::vector<const char*> ptrs(n);
  std::vector<at::ScalarType> dtypes(n);
  std::vector<bool> pairs(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchImpl < n) prefetch_impl(tensors[i + kPrefetchImpl].unsafeGetTensorImpl());
    if (i + kPrefetchStorage < n) {
      prefetch_storage(tensors[i + kPrefetchStorage].unsafeGetTensorImpl());
    }
    const at::Tensor* t = &tensors[i];
    pairs[i] = t->is_complex();
    if (pairs[i] || !t->is_non_overlapping_and_dense()) {
      dense.push_back(make_dense_one(*t));
      t = &dense.back().t;
    }
    numels[i] = t->numel();
    dtypes[i] = t->scalar_type();
    ptrs[i] = static_cast<const char*>(t->const_data_ptr());
    first_chunk[i + 1] = first_chunk[i] + (numels[i] + cpu::kChunk - 1) / cpu::kChunk;
  }
  // One running value per chunk, combined per tensor in chunk order below:
  // the result does not depend on the number of threads.
  std::vector<double> partial(first_chunk[n]);
  std::atomic<bool> bad{false};
  const auto& isa = cpu::kernels();
  cpu::for_each_chunk(numels, [&](const cpu::Chunk& ch) {
    const at::ScalarType dtype = dtypes[ch.tensor];
    const char* x = ptrs[ch.tensor] + ch.begin * static_cast<int64_t>(c10::elementSize(dtype));
    bool chunk_bad = false;
    partial[first_chunk[ch.tensor] + ch.begin / cpu::kChunk] =
        isa.norm_span(dtype, x, ch.end - ch.begin, pairs[ch.tensor], kind, ord, scale, inv,
                      &chunk_bad);
    if (chunk_bad) bad.store(true, std::memory_order_relaxed);
  });

  at::Tensor out = at::empty({static_cast<int64_t>(n)},
                             at::TensorOptions().dtype(tensor_norms_dtype(tensors)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "norms_out", [&] {
    auto* o = out.data_ptr<scalar_t>();
    for (size_t i = 0; i < n; ++i) {
      double acc = math::norm_identity<double>(kind);
      for (int64_t c = first_chunk[i]; c < first_chunk[i + 1]; ++c) {
        acc = math::norm_combine(kind, acc, partial[c]);
      }
      const bool float_sums = c10::toRealValueType(dtypes[i]) != at::kDouble;
      o[i] = static_cast<scalar_t>(
          round_to(dtypes[i], math::norm_finish(kind, acc, ord, float_sums)));
    }
  });
  if (found_inf && bad.load()) write_cpu_scalar(*found_inf, 1.0);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("tensor_norms", &tensor_norms_cpu);
}

}  // namespace torchext

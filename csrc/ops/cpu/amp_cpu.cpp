// CPU kernels of the AMP ops: check_finite_ (read-only), unscale_ (multiply
// and check in one pass) and update_scale_ (both overloads). Chunks span all
// tensors and run under at::parallel_for, like the ASGD kernel.
#include "../amp.h"
#include "../update_scale_registration.h"
#include "../../utils/cpu_scalars.h"
#include "../../utils/prefetch.h"
#include "../../utils/dense_views.h"
#include "chunks.h"
#include "isa_kernels.h"
#include "torchext/elementwise_math.h"

#include <torch/library.h>

#include <atomic>
#include <vector>

namespace torchext {
namespace {

// Runs scan_span over every tensor, chunked and in parallel; returns whether
// any element was not finite.
bool scan_tensors(at::TensorList tensors, bool scale, float inv_scale, bool clipped = false,
                  double clip = 1.0) {
  const size_t n = tensors.size();
  std::vector<DenseOne> dense;  // only for tensors that are not flat real memory
  std::vector<int64_t> numels(n);
  std::vector<char*> ptrs(n);  // taken on the calling thread, not in the workers
  std::vector<at::ScalarType> dtypes(n);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchImpl < n) prefetch_impl(tensors[i + kPrefetchImpl].unsafeGetTensorImpl());
    if (i + kPrefetchStorage < n) prefetch_storage(tensors[i + kPrefetchStorage].unsafeGetTensorImpl());
    const at::Tensor* t = &tensors[i];
    if (t->is_complex() || !t->is_non_overlapping_and_dense()) {
      dense.push_back(make_dense_one(*t));
      t = &dense.back().t;
    }
    numels[i] = t->numel();
    dtypes[i] = t->scalar_type();
    // Read-only callers (scale == false) never write through this pointer.
    ptrs[i] = static_cast<char*>(scale ? t->data_ptr() : const_cast<void*>(t->const_data_ptr()));
  }
  std::atomic<bool> found{false};
  const auto& isa = cpu::kernels();
  cpu::for_each_chunk(numels, [&](const cpu::Chunk& ch) {
    const at::ScalarType dtype = dtypes[ch.tensor];
    char* x = ptrs[ch.tensor] + ch.begin * static_cast<int64_t>(c10::elementSize(dtype));
    if (isa.scan_span(dtype, x, ch.end - ch.begin, scale, inv_scale, clipped, clip)) {
      found.store(true, std::memory_order_relaxed);
    }
  });
  if (scale) {
    for (auto& d : dense) d.write_back();
  }
  return found.load();
}

void check_finite_cpu(at::TensorList tensors, const at::Tensor& found_inf) {
  check_amp_tensors("check_finite_", tensors, found_inf);
  if (scan_tensors(tensors, /*scale=*/false, 1.0f)) {
    write_cpu_scalar(found_inf, 1.0);
  }
}

void unscale_cpu(at::TensorList tensors, const at::Tensor& found_inf,
                 const at::Tensor& inv_scale, const std::optional<at::Tensor>& clip_coef) {
  check_unscale_args(tensors, found_inf, inv_scale, clip_coef);
  const float inv = static_cast<float>(read_cpu_scalar(inv_scale));
  const bool clipped = clip_coef.has_value();
  const double clip = clipped ? read_cpu_scalar(*clip_coef) : 1.0;
  // Like torch: a 1.0 inv_scale only checks, it does not rewrite the grads.
  if (scan_tensors(tensors, /*scale=*/inv != 1.0f || clipped, inv, clipped, clip)) {
    write_cpu_scalar(found_inf, 1.0);
  }
}

// Both overloads: the update, and for .counted the skip record.
void update_scale_cpu(const UpdateScaleArgs& a) {
  check_update_scale_args(a);
  const bool found_inf = read_cpu_scalar(a.found_inf) != 0.0;
  const auto r = math::update_scale(static_cast<float>(read_cpu_scalar(a.scale)),
                                    static_cast<int32_t>(read_cpu_scalar(a.growth_tracker)),
                                    static_cast<int32_t>(read_cpu_scalar(a.hysteresis_tracker)),
                                    found_inf, a.settings);
  write_cpu_scalar(a.scale, r.scale);
  write_cpu_scalar(a.growth_tracker, r.growth_tracker);
  write_cpu_scalar(a.hysteresis_tracker, r.hysteresis_tracker);
  if (a.counted()) {
    *a.last_step_skipped.mutable_data_ptr<bool>() = found_inf;
    *a.skipped_steps.mutable_data_ptr<int64_t>() += found_inf ? 1 : 0;
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("check_finite_", &check_finite_cpu);
  m.impl("unscale_", &unscale_cpu);
  register_update_scale_kernels<update_scale_cpu>(m);
}

}  // namespace torchext

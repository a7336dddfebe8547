// The AMP ops on an accelerator (check_finite_, unscale_, update_scale_):
// kernel bodies (C10_HOST_DEVICE) and the host-side plan, a template over
// the executor like asgd_kernels.h (csrc/ops/cuda/amp_cuda.cu,
// cpp_tests/host_runner.h).
#pragma once

#include "../../amp.h"
#include "../../../utils/cpu_scalars.h"
#include "../../../utils/prefetch.h"
#include "../../../utils/dense_views.h"
#include "multi_tensor_apply.h"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

namespace torchext {
namespace kernels {

// The factors of a scan: inv_scale == nullptr only checks; otherwise the
// elements are multiplied by *inv_scale (unless it is exactly 1 and there is
// no clip, as torch does) and, with clip_coef, then by it.
struct ScanFactors {
  const float* inv_scale;
  const void* clip_coef;  // nullptr: no clip; float or double (clip_is_double)
  bool clip_is_double;
};

// One pointer per tensor; the other arguments are found_inf and the factors.
template <ParamLayout L>
using ScanMeta = MetaFor<1, L, sizeof(float*) + sizeof(ScanFactors)>;

// found_inf is set to 1 by any thread that saw an inf or NaN: every writer
// stores the same value.
template <typename scalar_t, typename Meta>
struct ScanBody {
  static constexpr const char* kName = "scan";
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, const Meta& meta, float* found_inf,
                                  const ScanFactors& f) const {
    using opmath_t = at::opmath_type<scalar_t>;
    const BlockChunk bc = block_chunk(meta, ctx.block);
    if (bc.n <= 0) return;
    const opmath_t inv = f.inv_scale != nullptr ? static_cast<opmath_t>(*f.inv_scale)
                                                : opmath_t(1);
    const bool clipped = f.inv_scale != nullptr && f.clip_coef != nullptr;
    const opmath_t clip =
        clipped ? static_cast<opmath_t>(load_scalar(f.clip_coef, f.clip_is_double))
                : opmath_t(1);
    const bool write = f.inv_scale != nullptr && (inv != opmath_t(1) || clipped);
    scalar_t* const ptrs[1] = {static_cast<scalar_t*>(meta.ptrs[0][bc.slot]) + bc.begin};
    bool bad = false;
    chunk_loop(ctx, ptrs, bc.n, write ? 1 : 0, [&](scalar_t (&r)[1][kILP]) {
      TORCHEXT_UNROLL
      for (int ii = 0; ii < kILP; ++ii) {
        const opmath_t v = static_cast<opmath_t>(r[0][ii]);
        bad = bad || math::non_finite(v);
        if (write) {
          r[0][ii] = static_cast<scalar_t>(math::mul(v, inv));
          // The clip multiplies what unscale_ stored (rounded to the dtype).
          if (clipped) r[0][ii] = static_cast<scalar_t>(math::mul(static_cast<opmath_t>(r[0][ii]), clip));
        }
      }
    });
    if (bad) *found_inf = 1.f;
  }
  static int64_t work(unsigned nblocks, unsigned, const Meta& meta, float*, const ScanFactors&) {
    return elements_in_launch(meta, nblocks);
  }
};

// Checks (and with inv_scale, unscales) every tensor. Dense tensors are
// walked in place as flat real memory (a check or a multiply by a real scalar
// does not care about element order, nor about complex pairs); only tensors
// that are not dense go through temporaries (written back when unscaling).
template <typename Exec>
void scan_launch(at::TensorList tensors, const at::Tensor& found_inf, const ScanFactors& factors,
                 Exec& exec) {
  const float* inv_scale = factors.inv_scale;
  if (tensors.empty()) return;
  exec.enter(found_inf.device());
  const LaunchLimits limits = exec.limits();
  std::vector<std::pair<at::ScalarType, std::vector<TensorEntry<1>>>> groups;
  std::vector<DenseOne> copies;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i + kPrefetchImpl < tensors.size()) {
      prefetch_impl(tensors[i + kPrefetchImpl].unsafeGetTensorImpl());
    }
    if (i + kPrefetchStorage < tensors.size()) {
      prefetch_storage(tensors[i + kPrefetchStorage].unsafeGetTensorImpl());
    }
    const at::Tensor& t = tensors[i];
    if (t.numel() == 0) continue;
    void* ptr;
    int64_t numel = t.numel();
    at::ScalarType dtype = t.scalar_type();
    // (A lazily conjugated tensor goes the CPU kernel's way: view_as_real refuses it.)
    if (t.is_non_overlapping_and_dense() && !t.is_conj()) {
      // Read-only scans (inv_scale == nullptr) never write through it.
      ptr = inv_scale != nullptr ? t.data_ptr() : const_cast<void*>(t.const_data_ptr());
      if (at::isComplexType(dtype)) {
        dtype = c10::toRealValueType(dtype);
        numel *= 2;
      }
    } else {
      DenseOne& d = copies.emplace_back(make_dense_one(t));
      ptr = d.t.data_ptr();
      dtype = d.t.scalar_type();
      numel = d.t.numel();
    }
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& grp) { return grp.first == dtype; });
    if (it == groups.end()) {
      groups.emplace_back(dtype, std::vector<TensorEntry<1>>{});
      it = std::prev(groups.end());
      it->second.reserve(tensors.size());
    }
    it->second.push_back({{ptr}, numel});
  }
  float* found = found_inf.data_ptr<float>();
  with_param_layout<Exec::kLargeParams>(limits.layout, [&](auto layout) {
    using Meta = ScanMeta<decltype(layout)::value>;
    for (auto& [dtype, entries] : groups) {
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "scan_launch", [&] {
        multi_tensor_apply<Meta>(
            entries, limits, EmptyTensors::kSkip, [&](const Meta& meta, int nblocks) {
              exec.template launch<ScanBody<scalar_t, Meta>>(
                  static_cast<unsigned>(nblocks), limits.block_size, meta, found, factors);
            });
      });
    }
  });
  if (inv_scale != nullptr) {
    for (auto& d : copies) d.write_back();
  }
}

template <typename Exec>
void check_finite_launch(at::TensorList tensors, const at::Tensor& found_inf, Exec& exec) {
  check_amp_tensors("check_finite_", tensors, found_inf);
  scan_launch(tensors, found_inf, ScanFactors{nullptr, nullptr, false}, exec);
}

template <typename Exec>
void unscale_launch(at::TensorList tensors, const at::Tensor& found_inf,
                    const at::Tensor& inv_scale, const std::optional<at::Tensor>& clip_coef,
                    Exec& exec) {
  check_unscale_args(tensors, found_inf, inv_scale, clip_coef);
  scan_launch(tensors, found_inf,
              ScanFactors{inv_scale.const_data_ptr<float>(),
                          clip_coef ? clip_coef->const_data_ptr() : nullptr,
                          clip_coef && clip_coef->scalar_type() == at::kDouble},
              exec);
}

// One thread. The settings are the op's own struct, passed by value.
struct UpdateScaleBody {
  static constexpr const char* kName = "update_scale";
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, float* scale, int32_t* growth_tracker,
                                  int32_t* hysteresis_tracker, const float* found_inf,
                                  const UpdateScaleSettings& s) const {
    if (ctx.block != 0 || ctx.thread != 0) return;
    const auto r = math::update_scale(*scale, *growth_tracker, *hysteresis_tracker,
                                      *found_inf != 0.f, s);
    *scale = r.scale;
    *growth_tracker = r.growth_tracker;
    *hysteresis_tracker = r.hysteresis_tracker;
  }
  static int64_t work(unsigned, unsigned, float*, int32_t*, int32_t*, const float*,
                      const UpdateScaleSettings&) {
    return 1;
  }
};

// update_scale_ (not .counted: on this device that is the composite kernel,
// csrc/ops/meta/meta_kernels.cpp).
template <typename Exec>
void update_scale_launch(const UpdateScaleArgs& a, Exec& exec) {
  check_update_scale_args(a);
  TORCH_INTERNAL_ASSERT(!a.counted(), "update_scale_launch: .counted is the composite kernel");
  exec.enter(a.scale.device());
  exec.template launch<UpdateScaleBody>(1, 1, a.scale.data_ptr<float>(),
                                        a.growth_tracker.data_ptr<int32_t>(),
                                        a.hysteresis_tracker.data_ptr<int32_t>(),
                                        a.found_inf.const_data_ptr<float>(), a.settings);
}

}  // namespace kernels
}  // namespace torchext

// CUDA kernels of the AMP ops, on the current stream, with no host sync:
// check_finite_ (read-only), unscale_ (multiply and check in one pass) and
// update_scale_ (one thread; the math is shared with the CPU kernel).
#include "../amp_args.h"
#include "../cpu_scalars.h"
#include "../prefetch.h"
#include "../dense_views.h"
#include "multi_tensor_apply.cuh"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <map>
#include <vector>

namespace torchext {
namespace cuda {
namespace {

// inv_scale == nullptr: only check. Otherwise multiply by *inv_scale too
// (unless it is exactly 1, as torch does).
template <typename scalar_t>
__global__ void __launch_bounds__(kBlockSize)
    scan_kernel(TensorListMeta<1> meta, float* found_inf, const float* inv_scale) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int t = meta.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kChunkSize;
  const int64_t end = ::min(meta.numel[t], begin + kChunkSize);
  auto* x = static_cast<scalar_t*>(meta.ptrs[0][t]);
  const opmath_t inv = inv_scale != nullptr ? static_cast<opmath_t>(*inv_scale) : opmath_t(1);
  const bool write = inv_scale != nullptr && inv != opmath_t(1);
  bool bad = false;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const opmath_t v = static_cast<opmath_t>(x[i]);
    bad = bad || math::non_finite(v);
    if (write) x[i] = static_cast<scalar_t>(v * inv);
  }
  if (bad) *found_inf = 1.f;  // every writer stores the same value: no atomics needed
}

void scan_cuda(at::TensorList tensors, const at::Tensor& found_inf, const float* inv_scale) {
  if (tensors.empty()) return;
  const c10::cuda::CUDAGuard guard(found_inf.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  std::vector<DenseOne> dense;
  dense.reserve(tensors.size());
  std::map<at::ScalarType, std::vector<TensorEntry<1>>> groups;
  for (const auto& t : tensors) {
    dense.push_back(make_dense_one(t));
    groups[dense.back().t.scalar_type()].push_back(
        {{dense.back().t.data_ptr()}, dense.back().t.numel()});
  }
  float* found = found_inf.data_ptr<float>();
  for (auto& [dtype, entries] : groups) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "scan_cuda", [&] {
      multi_tensor_apply<1>(entries, [&](const TensorListMeta<1>& meta, int nblocks) {
        scan_kernel<scalar_t><<<nblocks, kBlockSize, 0, stream>>>(meta, found, inv_scale);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
  if (inv_scale != nullptr) {
    for (auto& d : dense) d.write_back();
  }
}

void check_finite_cuda(at::TensorList tensors, const at::Tensor& found_inf) {
  check_amp_tensors("check_finite_", tensors, found_inf);
  scan_cuda(tensors, found_inf, nullptr);
}

void unscale_cuda(at::TensorList tensors, const at::Tensor& found_inf,
                  const at::Tensor& inv_scale) {
  check_unscale_args(tensors, found_inf, inv_scale);
  scan_cuda(tensors, found_inf, inv_scale.const_data_ptr<float>());
}

struct UpdateScaleArgs {
  double growth_factor, backoff_factor, min_scale, max_scale;
  int64_t growth_interval, hysteresis;
};

__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker,
                                    int32_t* hysteresis_tracker, const float* found_inf,
                                    UpdateScaleArgs a) {
  const auto r = math::update_scale(*scale, *growth_tracker, *hysteresis_tracker,
                                    *found_inf != 0.f, a.growth_factor, a.backoff_factor,
                                    a.growth_interval, a.hysteresis, a.min_scale, a.max_scale);
  *scale = r.scale;
  *growth_tracker = r.growth_tracker;
  *hysteresis_tracker = r.hysteresis_tracker;
}

void update_scale_cuda(const at::Tensor& scale, const at::Tensor& growth_tracker,
                       const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval,
                       int64_t hysteresis, std::optional<double> min_scale,
                       std::optional<double> max_scale) {
  check_update_scale_args(scale, growth_tracker, hysteresis_tracker, found_inf, growth_factor,
                          backoff_factor, growth_interval, hysteresis, min_scale, max_scale);
  const c10::cuda::CUDAGuard guard(scale.device());
  const UpdateScaleArgs a{growth_factor, backoff_factor, min_scale.value_or(0.0),
                          max_scale.value_or(std::numeric_limits<double>::infinity()),
                          growth_interval, hysteresis};
  update_scale_kernel<<<1, 1, 0, c10::cuda::getCurrentCUDAStream()>>>(
      scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
      hysteresis_tracker.data_ptr<int32_t>(), found_inf.const_data_ptr<float>(), a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("check_finite_", &cuda::check_finite_cuda);
  m.impl("unscale_", &cuda::unscale_cuda);
  m.impl("update_scale_", &cuda::update_scale_cuda);
}

}  // namespace torchext

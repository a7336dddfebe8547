// CUDA kernel of torchext::asgd_: multi-tensor apply, one launch per dtype
// group and batch of chunks, on the current stream, with no host sync. The
// per-element math is the header shared with the CPU kernel.
//
// step/eta/mu are updated by a second, small kernel after every elementwise
// launch: a chunk must never see the eta/mu another chunk of the same tensor
// already advanced.
#include "../asgd_args.h"
#include "../cpu_scalars.h"
#include "../dense_views.h"
#include "multi_tensor_apply.cuh"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

namespace torchext {
namespace cuda {
namespace {

// Pointer slots of the elementwise launch: p, g, ax are chunked; eta and mu
// are per-tensor extras.
enum Slot { kP = 0, kG = 1, kAx = 2, kEta = 3, kMu = 4 };
constexpr int kASGDDepth = 5;

struct ASGDKernelArgs {
  const float* found_inf;   // nullptr: never skip
  const float* grad_scale;  // nullptr: grads are not scaled
  double lambd;
  double weight_decay;
  bool maximize;
  bool state_is_double;
};

template <typename scalar_t>
__global__ void __launch_bounds__(kBlockSize)
    asgd_kernel(TensorListMeta<kASGDDepth> meta, ASGDKernelArgs args) {
  if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
  using opmath_t = at::opmath_type<scalar_t>;
  const int t = meta.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kChunkSize;
  const int64_t end = ::min(meta.numel[t], begin + kChunkSize);
  const bool unscale = args.grad_scale != nullptr;
  // Same float32 reciprocal as GradScaler.unscale_.
  const float inv_scale =
      unscale ? static_cast<float>(1.0 / static_cast<double>(*args.grad_scale)) : 1.f;
  const auto c = math::make_asgd_coeffs<opmath_t>(
      load_scalar(meta.ptrs[kEta][t], args.state_is_double),
      load_scalar(meta.ptrs[kMu][t], args.state_is_double), args.lambd, args.weight_decay,
      args.maximize, unscale, inv_scale);
  auto* p = static_cast<scalar_t*>(meta.ptrs[kP][t]);
  const auto* g = static_cast<const scalar_t*>(meta.ptrs[kG][t]);
  auto* ax = static_cast<scalar_t*>(meta.ptrs[kAx][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    opmath_t vp = static_cast<opmath_t>(p[i]);
    opmath_t vax = static_cast<opmath_t>(ax[i]);
    math::asgd_update(vp, vax, static_cast<opmath_t>(g[i]), c);
    p[i] = static_cast<scalar_t>(vp);
    ax[i] = static_cast<scalar_t>(vax);
  }
}

// step += 1, then eta and mu from the new step; one thread per tensor.
constexpr int kMaxScheduleTensors = 128;
struct ScheduleMeta {
  void* step[kMaxScheduleTensors];
  void* eta[kMaxScheduleTensors];
  void* mu[kMaxScheduleTensors];
  int n;
};
static_assert(sizeof(ScheduleMeta) + 128 <= 4096, "kernel argument too large");

struct ScheduleArgs {
  const float* found_inf;
  const void* lr_ptr;  // device lr tensor, or nullptr to use lr_value
  bool lr_is_double;
  double lr_value;
  double lambd, alpha, t0;
  bool state_is_double;
};

__global__ void asgd_schedule_kernel(ScheduleMeta meta, ScheduleArgs args) {
  const int i = threadIdx.x;
  if (i >= meta.n) return;
  if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
  const double lr = args.lr_ptr != nullptr ? load_scalar(args.lr_ptr, args.lr_is_double)
                                           : args.lr_value;
  const double step = load_scalar(meta.step[i], args.state_is_double) + 1.0;
  store_scalar(meta.step[i], args.state_is_double, step);
  store_scalar(meta.eta[i], args.state_is_double,
               math::asgd_eta(lr, args.lambd, args.alpha, step));
  store_scalar(meta.mu[i], args.state_is_double, math::asgd_mu(args.t0, step));
}

// The same for packed state (asgd_.packed): element i of each array.
__global__ void asgd_packed_schedule_kernel(void* steps, void* etas, void* mus, int64_t n,
                                            ScheduleArgs args) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
  const double lr = args.lr_ptr != nullptr ? load_scalar(args.lr_ptr, args.lr_is_double)
                                           : args.lr_value;
  const size_t size = args.state_is_double ? sizeof(double) : sizeof(float);
  void* step_p = static_cast<char*>(steps) + i * size;
  const double step = load_scalar(step_p, args.state_is_double) + 1.0;
  store_scalar(step_p, args.state_is_double, step);
  store_scalar(static_cast<char*>(etas) + i * size, args.state_is_double,
               math::asgd_eta(lr, args.lambd, args.alpha, step));
  store_scalar(static_cast<char*>(mus) + i * size, args.state_is_double,
               math::asgd_mu(args.t0, step));
}

void asgd_cuda_impl(const ASGDArgs& a) {
  const auto call = check_asgd_header(a);
  if (!call) return;  // no param has a grad
  const size_t n = a.params.size();
  const c10::Device device = call->device;
  const at::ScalarType state_dtype = call->state_dtype;
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool state_is_double = state_dtype == at::kDouble;

  ASGDKernelArgs kargs{};
  kargs.found_inf = a.found_inf ? a.found_inf->const_data_ptr<float>() : nullptr;
  kargs.grad_scale = a.grad_scale ? a.grad_scale->const_data_ptr<float>() : nullptr;
  kargs.lambd = a.lambd;
  kargs.weight_decay = a.weight_decay;
  kargs.maximize = a.maximize;
  kargs.state_is_double = state_is_double;

  // Tensors grouped by (real) dtype: one launch series per group. Few
  // dtypes ever occur, so a linear search beats a map. Tensors that can be
  // walked as flat memory are used in place; the others go through
  // DenseTriple temporaries, written back after the launches. Each entry is
  // checked in the same pass that reads its pointers (see check_asgd_args);
  // nothing is launched before the last one was checked (DenseTriple only
  // makes temporaries).
  std::vector<std::pair<at::ScalarType, std::vector<TensorEntry<kASGDDepth>>>> groups;
  std::vector<DenseTriple> copies;
  std::vector<size_t> active;  // entries with a grad, in order
  active.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    prefetch_asgd_ahead(a, i);
    if (!a.active(i)) continue;  // no grad: left alone
    active.push_back(i);
    check_asgd_entry(a, i, device, state_dtype);
    const at::Tensor& p = a.params[i];
    const at::Tensor& g = a.grads[i];
    const at::Tensor& ax = a.axs[i];
    TensorEntry<kASGDDepth> e{{nullptr, nullptr, nullptr, a.eta_ptr(i), a.mu_ptr(i)},
                              p.numel()};
    at::ScalarType dtype = p.scalar_type();
    if (is_flat_triple(p, g, ax)) {
      e.ptrs[kP] = p.data_ptr();
      e.ptrs[kG] = const_cast<void*>(g.const_data_ptr());
      e.ptrs[kAx] = ax.data_ptr();
      if (at::isComplexType(dtype)) {  // complex as interleaved real pairs
        dtype = c10::toRealValueType(dtype);
        e.numel *= 2;
      }
    } else {
      DenseTriple& d = copies.emplace_back(make_dense_triple(p, g, ax));
      e.ptrs[kP] = d.p.data_ptr();
      e.ptrs[kG] = const_cast<void*>(d.g.const_data_ptr());
      e.ptrs[kAx] = d.ax.data_ptr();
      dtype = d.p.scalar_type();
      e.numel = d.p.numel();
    }
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& grp) { return grp.first == dtype; });
    if (it == groups.end()) {
      groups.emplace_back(dtype, std::vector<TensorEntry<kASGDDepth>>{});
      it = std::prev(groups.end());
      it->second.reserve(n);
    }
    it->second.push_back(e);
  }
  for (auto& [dtype, entries] : groups) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "asgd_cuda", [&] {
      multi_tensor_apply<kASGDDepth>(entries, [&](const TensorListMeta<kASGDDepth>& meta,
                                                  int nblocks) {
        asgd_kernel<scalar_t><<<nblocks, kBlockSize, 0, stream>>>(meta, kargs);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
  for (auto& d : copies) d.write_back();

  // The schedule, after every elementwise launch on this stream.
  ScheduleArgs sargs{};
  sargs.found_inf = kargs.found_inf;
  sargs.lambd = a.lambd;
  sargs.alpha = a.alpha;
  sargs.t0 = a.t0;
  sargs.state_is_double = state_is_double;
  at::Tensor lr_device;  // keeps a converted lr alive until the launches are queued
  if (!a.lr.device().is_cpu()) {
    lr_device = a.lr.scalar_type() == at::kDouble ? a.lr : a.lr.to(at::kFloat);
    sargs.lr_ptr = lr_device.const_data_ptr();
    sargs.lr_is_double = lr_device.scalar_type() == at::kDouble;
  } else {
    // A CPU lr tensor is read on the host: no device sync involved.
    sargs.lr_value = a.lr_on_host();
  }
  if (a.packed() && active.size() == n) {
    // Packed state: one launch over the three arrays.
    const int threads = 256;
    const int blocks = static_cast<int>((n + threads - 1) / threads);
    asgd_packed_schedule_kernel<<<blocks, threads, 0, stream>>>(
        a.step_ptr(0), a.eta_ptr(0), a.mu_ptr(0), static_cast<int64_t>(n), sargs);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  ScheduleMeta smeta{};
  for (size_t k = 0; k < active.size(); ++k) {
    const size_t i = active[k];
    smeta.step[smeta.n] = a.step_ptr(i);
    smeta.eta[smeta.n] = a.eta_ptr(i);
    smeta.mu[smeta.n] = a.mu_ptr(i);
    if (++smeta.n == kMaxScheduleTensors || k == active.size() - 1) {
      asgd_schedule_kernel<<<1, kMaxScheduleTensors, 0, stream>>>(smeta, sargs);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      smeta.n = 0;
    }
  }
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  register_asgd_kernels<cuda::asgd_cuda_impl>(m);
}

}  // namespace torchext

// The CUDA executor of the launch plans in csrc/ops/cuda/kernels/: every kernel is
// body_kernel<Body>, a thin __global__ wrapper that calls the body (a
// C10_HOST_DEVICE struct shared with the host runner) with the real block
// and thread indices. Launches go on the current stream of the device the
// op runs on; nothing here syncs with the host.
#pragma once

#include "kernels/multi_tensor_apply.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdlib>
#include <cstring>
#include <optional>

// Large kernel parameters (kernels::ParamLayout::kLarge, up to 32,764 bytes)
// need CUDA 12.1+ on Volta+ and an R530+ driver. As ATen does
// (MultiTensorApply.cuh), torchext uses them only in CUDA 13 builds: those
// compile for sm_75 and newer only and need an R580+ driver, so every GPU
// they run on accepts them.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
#define TORCHEXT_LARGE_KERNEL_PARAMS 1
#else
#define TORCHEXT_LARGE_KERNEL_PARAMS 0
#endif

namespace torchext {
namespace cuda {

// Arguments are __grid_constant__ where the large layout is compiled: the
// bodies take them by reference, and a grid constant is read in place, never
// copied to each thread's local memory.
#if TORCHEXT_LARGE_KERNEL_PARAMS
#define TORCHEXT_KERNEL_ARGS const __grid_constant__ Args... args
#else
#define TORCHEXT_KERNEL_ARGS Args... args
#endif
template <typename Body, typename... Args>
__global__ void __launch_bounds__(kernels::kBlockSize) body_kernel(TORCHEXT_KERNEL_ARGS) {
  Body{}(kernels::ThreadCtx{blockIdx.x, threadIdx.x, blockDim.x}, args...);
}
// A phased body (multi_tensor_apply.h): its phases in turn, a block-wide
// barrier between two, its Shared in shared memory.
template <typename Body, typename... Args>
__global__ void __launch_bounds__(kernels::kBlockSize) phased_body_kernel(TORCHEXT_KERNEL_ARGS) {
  __shared__ typename Body::Shared shared;
  const kernels::ThreadCtx ctx{blockIdx.x, threadIdx.x, blockDim.x};
  const int phases = Body::phases(blockDim.x);
  for (int phase = 0; phase < phases; ++phase) {
    if (phase > 0) __syncthreads();
    Body{}(ctx, phase, shared, args...);
  }
}
#undef TORCHEXT_KERNEL_ARGS

// Whether launches captured into a CUDA graph may use the large layout.
// Default: no. No CUDA document we found says that graph capture takes
// kernel nodes with more than 4 KB of parameters (NVIDIA's CUDA 12.1
// announcement of large parameters speaks of launches only), and
// cudaGraphAddKernelNode crashed on them in CUDA 12 (openxla/xla PR #19252,
// 2024). So while the stream captures, launches fall back to the classic
// 4 KB layout: a captured step has more kernel nodes, replayed without host
// cost. TORCHEXT_CUDA_GRAPH_LARGE_PARAMS=1 captures the large layout
// instead (scripts/gpu_check.sh runs a captured step both ways against
// eager, bit for bit).
inline bool large_params_in_graphs() {
  const char* v = std::getenv("TORCHEXT_CUDA_GRAPH_LARGE_PARAMS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

class CudaExecutor {
 public:
  static constexpr bool kLargeParams = TORCHEXT_LARGE_KERNEL_PARAMS;

  // Called by the plan once it knows the device (after validation).
  void enter(const c10::Device& device) {
    device_ = device;
    guard_.emplace(device);
    stream_ = c10::cuda::getCurrentCUDAStream(device.index());
  }
  // The production launch shape; the layout as large_params_in_graphs says.
  kernels::LaunchLimits limits() const {
    kernels::LaunchLimits limits;
    limits.layout = kernels::ParamLayout::kClassic;
    if constexpr (kLargeParams) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      C10_CUDA_CHECK(cudaStreamIsCapturing(stream_, &status));
      if (status == cudaStreamCaptureStatusNone || large_params_in_graphs()) {
        limits.layout = kernels::ParamLayout::kLarge;
      }
    }
    return limits;
  }
  // Whether a kernel must load this scalar itself: reading it on the host
  // would sync with the device.
  bool kernel_reads(const at::Tensor& t) const { return !t.device().is_cpu(); }
  // Device scratch for `count` pointers, from the caching allocator (stream
  // ordered; under graph capture, from the graph's pool).
  at::Tensor pointer_table(int64_t count) const {
    return at::empty({count}, at::TensorOptions().dtype(at::kLong).device(device_));
  }
  // Device scratch of `bytes` bytes, uninitialized, from the caching
  // allocator like pointer_table.
  at::Tensor scratch(int64_t bytes) const {
    return at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device_));
  }
  template <typename Body, typename... Args>
  void launch(unsigned blocks, unsigned threads, const Args&... args) const {
    static_assert(kernels::kernel_param_bytes<Args...>() <=
                      kernels::param_budget(kLargeParams ? kernels::ParamLayout::kLarge
                                                         : kernels::ParamLayout::kClassic),
                  "kernel arguments too large");
    if constexpr (kernels::is_phased_body<Body>::value) {
      phased_body_kernel<Body, Args...><<<blocks, threads, 0, stream_>>>(args...);
    } else {
      body_kernel<Body, Args...><<<blocks, threads, 0, stream_>>>(args...);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

 private:
  c10::Device device_{c10::kCUDA};
  std::optional<c10::cuda::CUDAGuard> guard_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace cuda
}  // namespace torchext

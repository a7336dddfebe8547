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

#include <optional>
#include <tuple>

namespace torchext {
namespace cuda {

template <typename Body, typename... Args>
__global__ void __launch_bounds__(kernels::kBlockSize) body_kernel(Args... args) {
  Body{}(kernels::ThreadCtx{blockIdx.x, threadIdx.x, blockDim.x}, args...);
}

class CudaExecutor {
 public:
  // Called by the plan once it knows the device (after validation).
  void enter(const c10::Device& device) {
    device_ = device;
    guard_.emplace(device);
    stream_ = c10::cuda::getCurrentCUDAStream(device.index());
  }
  kernels::LaunchLimits limits() const { return {}; }
  // Whether a kernel must load this scalar itself: reading it on the host
  // would sync with the device.
  bool kernel_reads(const at::Tensor& t) const { return !t.device().is_cpu(); }
  // Device scratch for `count` pointers, from the caching allocator (stream
  // ordered; under graph capture, from the graph's pool).
  at::Tensor pointer_table(int64_t count) const {
    return at::empty({count}, at::TensorOptions().dtype(at::kLong).device(device_));
  }
  template <typename Body, typename... Args>
  void launch(unsigned blocks, unsigned threads, const Args&... args) const {
    static_assert(sizeof(std::tuple<Args...>) <= kernels::kMaxKernelArgBytes,
                  "kernel arguments too large");
    body_kernel<Body, Args...><<<blocks, threads, 0, stream_>>>(args...);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

 private:
  c10::Device device_{c10::kCUDA};
  std::optional<c10::cuda::CUDAGuard> guard_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace cuda
}  // namespace torchext

// CUDA kernel of tensor_norms: the plan and the kernel bodies are
// csrc/ops/cuda/kernels/norms_kernels.h (run on the CPU by the host runner's
// tests too); this file only launches them, on the current stream, with no
// host sync. Registered for CUDA, so CUDA no longer runs the composite kernel
// (meta_kernels.cpp: ATen's _foreach_norm + check_finite_, two reads).
#include "kernels/norms_kernels.h"
#include "launch.cuh"

#include <torch/library.h>

namespace torchext {
namespace cuda {
namespace {

at::Tensor tensor_norms_cuda(at::TensorList tensors, double ord,
                             const std::optional<at::Tensor>& inv_scale,
                             const std::optional<at::Tensor>& found_inf) {
  CudaExecutor exec;
  return kernels::tensor_norms_launch(tensors, ord, inv_scale, found_inf, exec);
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("tensor_norms", &cuda::tensor_norms_cuda);
}

}  // namespace torchext

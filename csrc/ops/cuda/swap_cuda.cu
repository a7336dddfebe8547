// CUDA kernels of swap_: the plan and kernel bodies are csrc/ops/cuda/kernels/swap_kernels.h
// (run on the CPU by the host runner's tests too); this file only launches
// them, on the current stream, with no host sync and no scratch memory.
#include "kernels/swap_kernels.h"
#include "launch.cuh"

#include <torch/library.h>

namespace torchext {
namespace cuda {
namespace {

void swap_cuda(at::TensorList tensors, at::TensorList others) {
  CudaExecutor exec;
  kernels::swap_launch(tensors, others, exec);
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) { m.impl("swap_", &cuda::swap_cuda); }

}  // namespace torchext

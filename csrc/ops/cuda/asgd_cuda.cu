// CUDA kernel of torchext::asgd_: the plan and the kernel bodies are
// csrc/ops/cuda/kernels/asgd_kernels.h (run on the CPU by the host runner's tests too); this
// file only launches them, on the current stream, with no host sync.
#include "../asgd_registration.h"
#include "kernels/asgd_kernels.h"
#include "launch.cuh"

#include <torch/library.h>

namespace torchext {
namespace cuda {
namespace {

void asgd_cuda_impl(const ASGDArgs& a) {
  CudaExecutor exec;
  kernels::asgd_launch(a, exec);
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  register_asgd_kernels<cuda::asgd_cuda_impl>(m);
}

}  // namespace torchext

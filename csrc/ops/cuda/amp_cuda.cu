// CUDA kernels of the AMP ops (check_finite_, unscale_, update_scale_): the
// plans and kernel bodies are csrc/ops/cuda/kernels/amp_kernels.h (run on the CPU by the host
// runner's tests too); this file only launches them, on the current stream,
// with no host sync.
#include "../update_scale_registration.h"
#include "kernels/amp_kernels.h"
#include "launch.cuh"

#include <torch/library.h>

namespace torchext {
namespace cuda {
namespace {

void check_finite_cuda(at::TensorList tensors, const at::Tensor& found_inf) {
  CudaExecutor exec;
  kernels::check_finite_launch(tensors, found_inf, exec);
}

void unscale_cuda(at::TensorList tensors, const at::Tensor& found_inf,
                  const at::Tensor& inv_scale, const std::optional<at::Tensor>& clip_coef) {
  CudaExecutor exec;
  kernels::unscale_launch(tensors, found_inf, inv_scale, clip_coef, exec);
}

void update_scale_cuda(const UpdateScaleArgs& a) {
  CudaExecutor exec;
  kernels::update_scale_launch(a, exec);
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("check_finite_", &cuda::check_finite_cuda);
  m.impl("unscale_", &cuda::unscale_cuda);
  // update_scale_.counted: the composite kernel (meta_kernels.cpp).
  register_update_scale_kernels<cuda::update_scale_cuda>(m, UpdateScaleOverloads::kPlainOnly);
}

}  // namespace torchext

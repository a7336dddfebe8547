// CUDA kernels of the AMP ops (check_finite_, unscale_, update_scale_): the
// plans and kernel bodies are csrc/ops/cuda/kernels/amp_kernels.h (run on the CPU by the host
// runner's tests too); this file only launches them, on the current stream,
// with no host sync.
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

void update_scale_cuda(const at::Tensor& scale, const at::Tensor& growth_tracker,
                       const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval,
                       int64_t hysteresis, std::optional<double> min_scale,
                       std::optional<double> max_scale) {
  CudaExecutor exec;
  kernels::update_scale_launch(scale, growth_tracker, hysteresis_tracker, found_inf,
                               growth_factor, backoff_factor, growth_interval, hysteresis,
                               min_scale, max_scale, exec);
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) {
  m.impl("check_finite_", &cuda::check_finite_cuda);
  m.impl("unscale_", &cuda::unscale_cuda);
  m.impl("update_scale_", &cuda::update_scale_cuda);
}

}  // namespace torchext

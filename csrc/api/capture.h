// Whether a CUDA graph is being captured on the current stream of a tensor's
// device (Python's torch.cuda.is_current_stream_capturing()): then no host
// read may happen. Used by GradScaler::step (the skip is then decided on the
// device) and by the clips (error_if_nonfinite is refused).
#pragma once

#include <ATen/core/Tensor.h>

#ifdef TORCHEXT_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace torchext {
namespace api {

inline bool capturing(const at::Tensor& on) {
#ifdef TORCHEXT_WITH_CUDA
  if (on.is_cuda()) {
    return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  }
#endif
  (void)on;
  return false;
}

}  // namespace api
}  // namespace torchext

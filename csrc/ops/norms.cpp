#include "norms.h"

#include "amp.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cmath>

namespace torchext {

void check_tensor_norms_args(at::TensorList tensors, double ord,
                             const std::optional<at::Tensor>& inv_scale,
                             const std::optional<at::Tensor>& found_inf) {
  const char* op = "tensor_norms";
  // Which device the list is on: the first tensor's (the scalars must match).
  std::optional<c10::Device> device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined(), op, ": tensors[", i, "] is undefined");
    TORCH_CHECK(t.layout() == at::kStrided, op, ": tensors[", i,
                "] must be a strided (dense) tensor; sparse gradients are not supported");
    const auto dt = t.scalar_type();
    TORCH_CHECK_TYPE(at::isFloatingType(dt) || at::isComplexType(dt), op, ": tensors[", i,
                     "] has unsupported dtype ", dt, " (floating point or complex expected)");
    if (!device) device = t.device();
    TORCH_CHECK(t.device() == *device, op, ": tensors[", i, "] is on ", t.device(),
                " but tensors[0] is on ", *device, "; call it once per device");
    // torch.linalg.vector_norm refuses these orders on an empty tensor.
    // (sym_numel: the Meta kernel runs on symbolic shapes; asked only for
    // those orders, so only they guard on the size.)
    TORCH_CHECK((ord >= 0.0 && !std::isinf(ord)) || t.sym_numel() != 0, op, ": tensors[", i,
                "] is empty: the ", ord,
                " norm of an empty tensor is undefined (the reduction has no identity)");
  }
  if (inv_scale) {
    TORCH_CHECK_TYPE(inv_scale->scalar_type() == at::kFloat,
                     op, ": inv_scale must be a float32 tensor, got ", inv_scale->scalar_type());
    TORCH_CHECK_VALUE(inv_scale->numel() == 1, op,
                      ": inv_scale must hold exactly one element, got shape ",
                      inv_scale->sizes());
    TORCH_CHECK(!device || inv_scale->device() == *device, op, ": inv_scale is on ",
                inv_scale->device(), " but the tensors are on ", *device);
  }
  if (found_inf) {
    check_found_inf(op, *found_inf, device.value_or(found_inf->device()));
  }
}

at::ScalarType tensor_norms_dtype(at::TensorList tensors) {
  at::ScalarType dtype = at::kFloat;  // an empty list: torch's default dtype
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::ScalarType real = c10::toRealValueType(tensors[i].scalar_type());
    dtype = i == 0 ? real : c10::promoteTypes(dtype, real);
  }
  return dtype;
}

}  // namespace torchext

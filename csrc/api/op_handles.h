// The C++ front end's typed handles of the AMP and norm ops, looked up once in
// the dispatcher (asgd_ has its own: asgd_op in ../ops/asgd_args.h, and
// update_scale_ its call: call_update_scale in ../ops/update_scale_args.h).
// Calls through them dispatch exactly as Python's torch.ops.torchext.<op>.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <optional>

namespace torchext {
namespace api {

using CheckFiniteOp = void(at::TensorList, const at::Tensor&);
using UnscaleOp = void(at::TensorList, const at::Tensor&, const at::Tensor&,
                       const std::optional<at::Tensor>&);
using TensorNormsOp = at::Tensor(at::TensorList, double, const std::optional<at::Tensor>&,
                                 const std::optional<at::Tensor>&);

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}
inline const c10::TypedOperatorHandle<CheckFiniteOp>& check_finite_op() {
  static const auto op = find_op<CheckFiniteOp>("torchext::check_finite_");
  return op;
}
inline const c10::TypedOperatorHandle<UnscaleOp>& unscale_op() {
  static const auto op = find_op<UnscaleOp>("torchext::unscale_");
  return op;
}
inline const c10::TypedOperatorHandle<TensorNormsOp>& tensor_norms_op() {
  static const auto op = find_op<TensorNormsOp>("torchext::tensor_norms");
  return op;
}

}  // namespace api
}  // namespace torchext

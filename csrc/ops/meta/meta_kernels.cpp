// Kernels that only validate: the Meta kernels (same validation as the real
// kernels, so bad input fails at trace time with the same message, and no
// data is touched), plus two kinds of refusal that would otherwise be the
// dispatcher's bare "Could not run ..." error:
// - Sparse*: a sparse tensor was passed (validation names it);
// - CompositeExplicitAutograd: what the dispatcher runs for a call with no
//   tensor at all (empty lists: a no-op, as documented) and for devices with
//   no torchext kernel (a clear error).
#include "../amp.h"
#include "../asgd.h"
#include "../asgd_registration.h"
#include "../norms.h"
#include "../swap.h"
#include "../update_scale_registration.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/stack.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace torchext {
namespace {

void check_finite_meta(at::TensorList tensors, const at::Tensor& found_inf) {
  check_amp_tensors("check_finite_", tensors, found_inf);
}

void unscale_meta(at::TensorList tensors, const at::Tensor& found_inf,
                  const at::Tensor& inv_scale, const std::optional<at::Tensor>& clip_coef) {
  check_unscale_args(tensors, found_inf, inv_scale, clip_coef);
}

void swap_meta(at::TensorList tensors, at::TensorList others) {
  check_swap_args(tensors, others);
}

// update_scale_.counted on every device without a kernel of its own (CUDA
// among them): the checks, then update_scale_ (which has one) and the skip
// record as two ATen ops on the device. No host sync (CUDA-graph safe).
void update_scale_counted_composite(const UpdateScaleArgs& a) {
  check_update_scale_args(a);
  call_update_scale({.scale = a.scale,
                     .growth_tracker = a.growth_tracker,
                     .hysteresis_tracker = a.hysteresis_tracker,
                     .found_inf = a.found_inf,
                     .settings = a.settings});
  // found_inf counts overflows (>= 0): nonzero is "skipped".
  a.last_step_skipped.copy_(a.found_inf);
  a.skipped_steps.add_(a.last_step_skipped);
}

at::Tensor tensor_norms_meta(at::TensorList tensors, double ord,
                             const std::optional<at::Tensor>& inv_scale,
                             const std::optional<at::Tensor>& found_inf) {
  check_tensor_norms_args(tensors, ord, inv_scale, found_inf);
  return at::empty({static_cast<int64_t>(tensors.size())},
                   at::TensorOptions().dtype(tensor_norms_dtype(tensors)).device(at::kMeta));
}

// tensor_norms on every device without a kernel of its own (CPU and CUDA
// have theirs) and for an empty list: ATen's multi-tensor norm, then the
// inf/NaN check as a second read. No host sync. The norm is homogeneous, so the norms of tensors * inv_scale are the
// norms times inv_scale (a power of two for a loss scale: exact). fp16/bf16
// norms are accumulated into float32 and rounded to the output dtype only
// after inv_scale is applied: the norm of scaled fp16 grads passes 65504 long
// before the unscaled one does (the CPU kernel's contract).
at::Tensor tensor_norms_composite(at::TensorList tensors, double ord,
                                  const std::optional<at::Tensor>& inv_scale,
                                  const std::optional<at::Tensor>& found_inf) {
  check_tensor_norms_args(tensors, ord, inv_scale, found_inf);
  if (tensors.empty()) {
    const auto device = found_inf ? found_inf->device()
                        : inv_scale ? inv_scale->device() : c10::Device(at::kCPU);
    return at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(device));
  }
  if (found_inf) {
    static const auto check = c10::Dispatcher::singleton()
                                  .findSchemaOrThrow("torchext::check_finite_", "")
                                  .typed<void(at::TensorList, const at::Tensor&)>();
    check.call(tensors, *found_inf);
  }
  // One ATen call per real dtype (each norm is rounded to its tensor's
  // real dtype, then the list is held in the promoted dtype, as torch.stack
  // holds torch._foreach_norm's results).
  std::vector<at::ScalarType> real(tensors.size());
  std::vector<at::ScalarType> kinds;
  for (size_t i = 0; i < tensors.size(); ++i) {
    real[i] = c10::toRealValueType(tensors[i].scalar_type());
    if (std::find(kinds.begin(), kinds.end(), real[i]) == kinds.end()) kinds.push_back(real[i]);
  }
  std::vector<at::Tensor> norms(tensors.size());
  for (const auto kind : kinds) {
    std::vector<at::Tensor> group;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (real[i] == kind) group.push_back(tensors[i]);
    }
    const bool low = kind == at::kHalf || kind == at::kBFloat16;
    at::Tensor g = at::stack(low ? at::_foreach_norm(group, ord, at::kFloat)
                                 : at::_foreach_norm(group, ord));
    if (inv_scale && ord != 0.0) g = at::mul(g, inv_scale->reshape({}));  // 0-d: g's dtype
    g = g.to(kind);
    for (size_t i = 0, k = 0; i < tensors.size(); ++i) {
      if (real[i] == kind) norms[i] = g[static_cast<int64_t>(k++)];
    }
  }
  if (kinds.size() == 1) {
    return norms.size() == 1 ? norms[0].unsqueeze(0) : at::stack(norms);
  }
  return at::stack(norms).to(tensor_norms_dtype(tensors));
}

template <auto Validate, typename... Args>
void reject_sparse(Args... args) {
  Validate(args...);
  TORCH_CHECK(false, "torchext ops do not support sparse tensors");
}

void reject_sparse_asgd(const ASGDArgs& a) {
  reject_sparse<&check_asgd_args, const ASGDArgs&>(a);
}

template <auto Validate, typename... Args>
void no_kernel_for_device(at::TensorList tensors, Args... args) {
  Validate(tensors, args...);
  TORCH_CHECK(tensors.empty(), "torchext has no kernel for device ", tensors[0].device(),
              "; its ops run on CPU and CUDA (and Meta for tracing)");
}

void no_asgd_kernel_for_device(const ASGDArgs& a) {
  const auto call = check_asgd_call(a);
  TORCH_CHECK(!call, "torchext has no kernel for device ", call->device,
              "; its ops run on CPU and CUDA (and Meta for tracing)");
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Meta, m) {
  register_asgd_kernels<check_asgd_args>(m);
  m.impl("check_finite_", &check_finite_meta);
  m.impl("unscale_", &unscale_meta);
  register_update_scale_kernels<check_update_scale_args>(m);
  m.impl("swap_", &swap_meta);
  m.impl("tensor_norms", &tensor_norms_meta);
}

#define TORCHEXT_REGISTER_SPARSE_REJECTS(m)                                             \
  register_asgd_kernels<reject_sparse_asgd>(m);                                         \
  m.impl("check_finite_",                                                               \
         &reject_sparse<&check_finite_meta, at::TensorList, const at::Tensor&>);       \
  m.impl("unscale_",                                                                    \
         &reject_sparse<&unscale_meta, at::TensorList, const at::Tensor&, const at::Tensor&,   \
                        const std::optional<at::Tensor>&>);                             \
  m.impl("swap_", &reject_sparse<&swap_meta, at::TensorList, at::TensorList>);      \
  m.impl("tensor_norms", &tensor_norms_meta); /* its validator names the sparse tensor */

TORCH_LIBRARY_IMPL(torchext, SparseCPU, m) {
  TORCHEXT_REGISTER_SPARSE_REJECTS(m)
}
TORCH_LIBRARY_IMPL(torchext, SparseCUDA, m) {
  TORCHEXT_REGISTER_SPARSE_REJECTS(m)
}

TORCH_LIBRARY_IMPL(torchext, CompositeExplicitAutograd, m) {
  register_asgd_kernels<no_asgd_kernel_for_device>(m);
  m.impl("check_finite_", &no_kernel_for_device<&check_finite_meta, const at::Tensor&>);
  m.impl("unscale_",
         &no_kernel_for_device<&unscale_meta, const at::Tensor&, const at::Tensor&,
                               const std::optional<at::Tensor>&>);
  m.impl("swap_", &no_kernel_for_device<&swap_meta, at::TensorList>);
  m.impl("tensor_norms", &tensor_norms_composite);
  register_update_scale_kernels<update_scale_counted_composite>(
      m, UpdateScaleOverloads::kCountedOnly);
}

}  // namespace torchext

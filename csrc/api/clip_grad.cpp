// Gradient clipping by norm (csrc/api/clip_grad.h), on the tensor_norms and
// unscale_ ops called through the dispatcher. Between the op calls, the
// arithmetic is Python's (torchext/nn/utils/clip_grad.py), each Python
// operator written as the ATen call it makes, so the two give the same bits.
#include "clip_grad.h"

#include <torchext/nn/clip_grad.h>

#include "../ops/amp.h"
#include "../ops/norms.h"
#include "capture.h"
#include "device_groups.h"
#include "op_handles.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <limits>

namespace torchext {
namespace api {

std::vector<NormsCall> norms_calls_by_device(const std::vector<at::Tensor>& tensors,
                                             const at::Tensor& inv_scale) {
  std::vector<NormsCall> calls;
  for (const auto& [device, idx] : index_by_device(tensors)) {
    NormsCall c{pick(tensors, idx), std::nullopt, std::nullopt};
    if (inv_scale.defined()) {
      c.inv_scale = inv_scale.to(device, /*non_blocking=*/true);
      c.found_inf = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    }
    calls.push_back(std::move(c));
  }
  return calls;
}

Measured measure(const std::vector<NormsCall>& calls, double norm_type) {
  Measured m;
  if (calls.empty()) {
    m.total = at::zeros({});  // torch's tensor(0.)
    return m;
  }
  for (const auto& c : calls) {
    check_tensor_norms_args(c.tensors, norm_type, c.inv_scale, c.found_inf);
  }
  const c10::Device device = calls.front().tensors.front().device();
  std::vector<at::Tensor> norms;
  for (const auto& c : calls) {
    norms.push_back(
        tensor_norms_op().call(c.tensors, norm_type, c.inv_scale, c.found_inf).to(device));
    m.found_inf.push_back(c.found_inf.value_or(at::Tensor()));
  }
  // torch.linalg.vector_norm(torch.cat(norms), norm_type)
  m.total = at::linalg_vector_norm(at::cat(norms), norm_type);
  return m;
}

void check_host_read(const at::Tensor& on, bool error_if_nonfinite) {
  TORCH_CHECK(!error_if_nonfinite || !capturing(on),
              "error_if_nonfinite=true reads the total norm on the host, which cannot happen "
              "inside a CUDA-graph capture; pass error_if_nonfinite=false there (a non-finite "
              "norm then clips with a coefficient of 0 or NaN, as in torch)");
}

bool refuses_nonfinite(const at::Tensor& total_norm, bool error_if_nonfinite) {
  if (!error_if_nonfinite) return false;
  check_host_read(total_norm, error_if_nonfinite);
  return at::logical_or(total_norm.isnan(), total_norm.isinf()).item<bool>();
}

void throw_nonfinite(double norm_type) {
  TORCH_CHECK(false, "The total norm of order ", norm_type, " for gradients from `parameters` "
              "is non-finite, so it cannot be clipped. To disable this error and scale the "
              "gradients by the non-finite norm anyway, set `error_if_nonfinite=false`");
}

at::Tensor clip_coef(const at::Tensor& total_norm, double max_norm) {
  if (max_norm == std::numeric_limits<double>::infinity()) return at::Tensor();
  // Python's `max_norm / (total_norm + 1e-6)` is Tensor.__rtruediv__:
  // reciprocal() * max_norm (not ATen's Scalar / Tensor, a division).
  return at::clamp((total_norm + 1e-6).reciprocal() * max_norm, std::nullopt, 1.0);
}

at::Tensor as_factor(const at::Tensor& coef) {
  if (!coef.defined()) return coef;
  const auto dt = coef.scalar_type();
  return dt == at::kDouble || dt == at::kFloat ? coef : coef.to(at::kFloat);
}

void multiply_(const std::vector<Multiply>& parts, const at::Tensor& coef) {
  struct Pass {
    std::vector<at::Tensor> tensors;
    at::Tensor found_inf, inv_scale;  // found_inf: unscale_'s flag, read by nobody
    std::optional<at::Tensor> coef;
  };
  std::vector<Pass> passes;
  for (const auto& part : parts) {
    if (part.tensors.empty() || (!part.inv_scale.defined() && !coef.defined())) continue;
    for (const auto& [device, idx] : index_by_device(part.tensors)) {
      Pass p{pick(part.tensors, idx), at::zeros({}, at::TensorOptions().device(device)), {}, {}};
      p.inv_scale = part.inv_scale.defined()
                        ? part.inv_scale.to(device, at::kFloat, /*non_blocking=*/true)
                        : at::ones({}, at::TensorOptions().device(device));
      if (coef.defined()) {
        p.coef = as_factor(coef).to(device, /*non_blocking=*/true);
      }
      check_unscale_args(p.tensors, p.found_inf, p.inv_scale, p.coef);
      passes.push_back(std::move(p));
    }
  }
  // All or nothing: every part and device checked above, before this first write.
  for (const auto& p : passes) unscale_op().call(p.tensors, p.found_inf, p.inv_scale, p.coef);
}

void multiply_(const std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale,
               const at::Tensor& coef) {
  multiply_(std::vector<Multiply>{{tensors, inv_scale}}, coef);
}

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

std::vector<at::Tensor> grads_of(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> grads;
  for (const auto& group : optimizer.param_groups()) {
    const auto g = grads_of(group.params());
    grads.insert(grads.end(), g.begin(), g.end());
  }
  return grads;
}

std::vector<at::Tensor> params_of(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> params;
  for (const auto& group : optimizer.param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  return params;
}

void refuse_fp16(const std::vector<at::Tensor>& grads) {
  for (const auto& g : grads) {
    TORCH_CHECK_VALUE(g.scalar_type() != at::kHalf, "Attempting to unscale FP16 gradients.");
  }
}

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                           double norm_type, bool error_if_nonfinite) {
  // See Note [Clip: applied when called, folded only inside one call].
  at::NoGradGuard no_grad;
  const auto grads = grads_of(params);
  const auto total = measure(norms_calls_by_device(grads), norm_type).total;
  if (refuses_nonfinite(total, error_if_nonfinite)) throw_nonfinite(norm_type);
  multiply_(grads, at::Tensor(), clip_coef(total, max_norm));
  return total;
}

}  // namespace api

double nn::utils::clip_grad_norm_(const std::vector<torch::Tensor>& parameters, double max_norm,
                                  double norm_type, bool error_if_nonfinite) {
  return api::clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite)
      .item<double>();
}

}  // namespace torchext

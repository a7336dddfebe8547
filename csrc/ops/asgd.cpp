#include "asgd.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <utility>

namespace torchext {

namespace {

bool is_supported_param_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kComplexFloat:
    case at::kComplexDouble:
      return true;
    default:
      return false;
  }
}

void check_state_scalar(const char* name, size_t i, const at::Tensor& t,
                        const c10::Device& device) {
  TORCH_CHECK(t.defined(), "asgd_: ", name, "[", i, "] is undefined");
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
                   "asgd_: ", name, "[", i, "] must be a float32 or float64 tensor, got ",
                   t.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == 1, "asgd_: ", name, "[", i,
                    "] must hold exactly one element, got shape ", t.sizes());
  TORCH_CHECK(t.device() == device, "asgd_: ", name, "[", i, "] is on ", t.device(),
              " but params[", i, "] is on ", device,
              "; optimizer state must live on the parameter's device");
}

// The .packed overload's mus, etas and steps: one 1-D tensor each, an
// element per param, one float dtype and one device, not overlapping.
void check_packed_state(const ASGDArgs& a) {
  const size_t n = a.params.size();
  const std::pair<const char*, const at::Tensor*> state[] = {
      {"mus", &a.packed_mus}, {"etas", &a.packed_etas}, {"steps", &a.packed_steps}};
  for (const auto& [name, t] : state) {
    TORCH_CHECK(t->layout() == at::kStrided, "asgd_: ", name, " must be a strided (dense) tensor");
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat || t->scalar_type() == at::kDouble,
                     "asgd_: ", name, " must be a float32 or float64 tensor, got ",
                     t->scalar_type());
    TORCH_CHECK_TYPE(t->scalar_type() == a.packed_steps.scalar_type(),
                     "asgd_: mus, etas and steps must share one dtype; steps is ",
                     a.packed_steps.scalar_type(), " but ", name, " is ", t->scalar_type());
    TORCH_CHECK_VALUE(t->dim() == 1 && t->sym_size(0) == static_cast<int64_t>(n),
                      "asgd_: ", name, " must be a 1-D tensor with one element per param (",
                      n, "), got shape ", t->sym_sizes());
    TORCH_CHECK_VALUE(t->is_contiguous(), "asgd_: ", name, " must be contiguous");
    TORCH_CHECK(t->device() == a.packed_steps.device(), "asgd_: ", name, " is on ",
                t->device(), " but steps is on ", a.packed_steps.device());
  }
  if (a.packed_steps.is_meta()) return;  // no memory to overlap
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = i + 1; j < 3; ++j) {
      TORCH_CHECK(at::get_overlap_status(*state[i].second, *state[j].second) ==
                      at::MemOverlapStatus::No,
                  "asgd_: ", state[i].first, " and ", state[j].first, " overlap in memory");
    }
  }
}

void check_one_element(const char* what, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.numel() == 1, "asgd_: ", what, " must hold exactly one element, got shape ",
                    t.sizes());
}

}  // namespace

std::optional<ASGDCall> check_asgd_header(const ASGDArgs& a) {
  const size_t n = a.params.size();
  if (a.packed()) {
    TORCH_CHECK_VALUE(a.grads.size() == n && a.axs.size() == n,
                      "asgd_: params, grads and axs must have the same length, got ", n, ", ",
                      a.grads.size(), " and ", a.axs.size());
  } else {
    TORCH_CHECK_VALUE(
        a.grads.size() == n && a.axs.size() == n && a.mus.size() == n &&
            a.etas.size() == n && a.steps.size() == n,
        "asgd_: params, grads, axs, mus, etas and steps must have the same length, got ",
        n, ", ", a.grads.size(), ", ", a.axs.size(), ", ", a.mus.size(), ", ",
        a.etas.size(), " and ", a.steps.size());
  }

  TORCH_CHECK(a.lr.defined(), "asgd_: lr is undefined");
  check_one_element("lr", a.lr);
  TORCH_CHECK_TYPE(at::isFloatingType(a.lr.scalar_type()),
                   "asgd_: lr must be a floating point tensor, got ", a.lr.scalar_type());
  // Its value can only be checked where reading it costs no device sync.
  if (a.lr.device().is_cpu() && !a.lr.is_meta()) {
    const double v = read_cpu_scalar(a.lr);
    TORCH_CHECK_VALUE(v >= 0.0 && std::isfinite(v), "asgd_: invalid learning rate: ", v,
                      " (must be finite and >= 0)");
  }
  // inf turns the step's params and state to NaN; t0 = inf means never average.
  TORCH_CHECK_VALUE(a.lambd >= 0.0 && std::isfinite(a.lambd), "asgd_: invalid lambd value: ",
                    a.lambd, " (must be finite and >= 0)");
  TORCH_CHECK_VALUE(a.alpha >= 0.0 && std::isfinite(a.alpha), "asgd_: invalid alpha value: ",
                    a.alpha, " (must be finite and >= 0)");
  TORCH_CHECK_VALUE(a.weight_decay >= 0.0 && std::isfinite(a.weight_decay),
                    "asgd_: invalid weight_decay value: ", a.weight_decay,
                    " (must be finite and >= 0)");
  TORCH_CHECK_VALUE(!std::isnan(a.t0), "asgd_: invalid t0 value: ", a.t0, " (must not be NaN)");
  if (a.packed()) check_packed_state(a);
  if (a.rounding_seed.has_value()) {
    TORCH_CHECK_VALUE(!a.rounding_ids.has_value() || a.rounding_ids->size() == n,
                      "asgd_: rounding_ids must have one id per param (", n, "), got ",
                      a.rounding_ids->size());
    TORCH_CHECK_VALUE(!a.rounding_offsets.has_value() || a.rounding_offsets->size() == n,
                      "asgd_: rounding_offsets must have one offset per param (", n, "), got ",
                      a.rounding_offsets->size());
    if (a.rounding_offsets.has_value()) {
      for (size_t i = 0; i < n; ++i) {
        TORCH_CHECK_VALUE((*a.rounding_offsets)[i] >= 0, "asgd_: rounding_offsets[", i,
                          "] is ", (*a.rounding_offsets)[i], " (must be >= 0)");
      }
    }
  } else {
    TORCH_CHECK_VALUE(!a.rounding_ids.has_value() && !a.rounding_offsets.has_value(),
                      "asgd_: rounding_ids and rounding_offsets need rounding_seed (stochastic "
                      "rounding is off without it)");
  }

  size_t first = 0;
  while (first < n && !a.active(first)) ++first;
  if (first == n) return std::nullopt;  // nothing to step
  TORCH_CHECK(a.params[first].defined(), "asgd_: params[", first, "] is undefined");
  const c10::Device device = a.params[first].device();
  at::ScalarType state_dtype;
  if (a.packed()) {
    TORCH_CHECK(a.packed_steps.device() == device, "asgd_: steps is on ",
                a.packed_steps.device(), " but params[", first, "] is on ", device,
                "; optimizer state must live on the parameters' device");
    state_dtype = a.packed_steps.scalar_type();
  } else {
    TORCH_CHECK(a.steps[first].defined(), "asgd_: steps[", first, "] is undefined");
    state_dtype = a.steps[first].scalar_type();
  }
  TORCH_CHECK(a.lr.device() == device || a.lr.device().is_cpu(),
              "asgd_: lr must be on the CPU or on ", device, ", got ", a.lr.device());
  if (a.grad_scale.has_value()) {
    const auto& s = *a.grad_scale;
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "asgd_: grad_scale must be a float32 tensor, got ",
                     s.scalar_type());
    check_one_element("grad_scale", s);
    TORCH_CHECK(s.device() == device, "asgd_: grad_scale is on ", s.device(),
                " but the params are on ", device);
  }
  if (a.found_inf.has_value()) {
    const auto& f = *a.found_inf;
    TORCH_CHECK_TYPE(f.scalar_type() == at::kFloat,
                     "asgd_: found_inf must be a float32 tensor, got ", f.scalar_type());
    check_one_element("found_inf", f);
    TORCH_CHECK(f.device() == device, "asgd_: found_inf is on ", f.device(),
                " but the tensors are on ", device);
  }
  if (a.clip_coef.has_value()) {
    const auto& c = *a.clip_coef;
    TORCH_CHECK_TYPE(c.scalar_type() == at::kFloat || c.scalar_type() == at::kDouble,
                     "asgd_: clip_coef must be a float32 or float64 tensor, got ",
                     c.scalar_type());
    check_one_element("clip_coef", c);
    TORCH_CHECK(c.device() == device, "asgd_: clip_coef is on ", c.device(),
                " but the params are on ", device);
  }
  return ASGDCall{device, state_dtype};
}

void check_asgd_entry(const ASGDArgs& a, size_t i, const c10::Device& device,
                      at::ScalarType state_dtype) {
  if (!a.active(i)) return;  // no grad: left alone
  const at::Tensor& p = a.params[i];
  const at::Tensor& g = a.grads[i];
  const at::Tensor& ax = a.axs[i];
  TORCH_CHECK(p.defined(), "asgd_: params[", i, "] is undefined");
  TORCH_CHECK(ax.defined(), "asgd_: axs[", i, "] is undefined");
  TORCH_CHECK(!g.is_sparse(), "asgd_: ASGD does not support sparse gradients (grads[", i, "] is sparse)");
  TORCH_CHECK(p.layout() == at::kStrided && g.layout() == at::kStrided &&
                  ax.layout() == at::kStrided,
              "asgd_: params[", i, "], grads[", i, "] and axs[", i, "] must be strided (dense) tensors");
  TORCH_CHECK_TYPE(is_supported_param_dtype(p.scalar_type()), "asgd_: params[", i,
                   "] has unsupported dtype ", p.scalar_type(),
                   "; supported: float32, float64, float16, bfloat16, complex64, complex128");
  TORCH_CHECK_TYPE(g.scalar_type() == p.scalar_type(), "asgd_: grads[", i, "] has dtype ",
                   g.scalar_type(), " but params[", i, "] has dtype ", p.scalar_type());
  // ax: the parameter's dtype, or float32 for a float16/bfloat16 parameter
  // (a float32 average: elementwise_math.h, asgd_average).
  TORCH_CHECK_TYPE(ax.scalar_type() == p.scalar_type() ||
                       (ax.scalar_type() == at::kFloat && (p.scalar_type() == at::kHalf ||
                                                           p.scalar_type() == at::kBFloat16)),
                   "asgd_: axs[", i, "] has dtype ", ax.scalar_type(), " but params[", i,
                   "] has dtype ", p.scalar_type(), " (ax must have the parameter's dtype, or "
                   "float32 for a float16/bfloat16 parameter)");
  TORCH_CHECK_VALUE(g.sizes() == p.sizes(), "asgd_: grads[", i, "] has shape ", g.sizes(),
                    " but params[", i, "] has shape ", p.sizes());
  TORCH_CHECK_VALUE(ax.sizes() == p.sizes(), "asgd_: axs[", i, "] has shape ", ax.sizes(),
                    " but params[", i, "] has shape ", p.sizes());
  TORCH_CHECK(p.device() == device, "asgd_: all tensors must be on one device; the first "
              "param with a grad is on ", device, " but params[", i, "] is on ", p.device());
  TORCH_CHECK(g.device() == device, "asgd_: grads[", i, "] is on ", g.device(),
              " but params[", i, "] is on ", device);
  TORCH_CHECK(ax.device() == device, "asgd_: axs[", i, "] is on ", ax.device(),
              " but params[", i, "] is on ", device);
  TORCH_CHECK(!ax.is_alias_of(p) && !g.is_alias_of(p) && !ax.is_alias_of(g),
              "asgd_: params[", i, "], grads[", i, "] and axs[", i, "] must not share memory");
  if (a.packed()) return;  // checked as a whole by check_asgd_header
  check_state_scalar("mus", i, a.mus[i], device);
  check_state_scalar("etas", i, a.etas[i], device);
  check_state_scalar("steps", i, a.steps[i], device);
  TORCH_CHECK_TYPE(a.mus[i].scalar_type() == state_dtype &&
                       a.etas[i].scalar_type() == state_dtype &&
                       a.steps[i].scalar_type() == state_dtype,
                   "asgd_: mus, etas and steps must all share one dtype (float32, or float64 "
                   "when the default dtype is float64); the call's is ", state_dtype,
                   " but entry ", i, " has ", a.mus[i].scalar_type(), ", ",
                   a.etas[i].scalar_type(), ", ", a.steps[i].scalar_type());
}

std::optional<ASGDCall> check_asgd_call(const ASGDArgs& a) {
  const auto call = check_asgd_header(a);
  if (!call) return call;
  for (size_t i = 0; i < a.params.size(); ++i) {
    prefetch_asgd_ahead(a, i);
    check_asgd_entry(a, i, call->device, call->state_dtype);
  }
  return call;
}

void check_asgd_args(const ASGDArgs& a) { check_asgd_call(a); }

}  // namespace torchext

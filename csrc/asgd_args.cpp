#include "asgd_args.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

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

}  // namespace

TensorRefs::TensorRefs(at::TensorList ts) {
  ptrs_.reserve(ts.size());
  for (const at::Tensor& t : ts) ptrs_.push_back(&t);
}

TensorRefs::TensorRefs(c10::ArrayRef<c10::IValue> vs) {
  // An undefined tensor in a list is stored as None; it is validated (and
  // rejected) like any other undefined tensor.
  static const at::Tensor kUndefined;
  ptrs_.reserve(vs.size());
  for (const c10::IValue& v : vs) ptrs_.push_back(v.isTensor() ? &v.toTensor() : &kUndefined);
}

ASGDArgs asgd_args_from_stack(const torch::jit::Stack& stack) {
  TORCH_INTERNAL_ASSERT(stack.size() >= kASGDNumArgs);
  const c10::IValue* v = stack.data() + (stack.size() - kASGDNumArgs);
  ASGDArgs a;
  a.params = TensorRefs(v[0].toListRef());
  a.grads = TensorRefs(v[1].toListRef());
  a.axs = TensorRefs(v[2].toListRef());
  if (v[5].isTensor()) {  // a .packed overload
    a.packed_mus = v[3].toTensor();
    a.packed_etas = v[4].toTensor();
    a.packed_steps = v[5].toTensor();
  } else {
    a.mus = TensorRefs(v[3].toListRef());
    a.etas = TensorRefs(v[4].toListRef());
    a.steps = TensorRefs(v[5].toListRef());
  }
  if (v[6].isTensor()) {
    a.lr_tensor = v[6].toTensor();
  } else {
    a.lr = v[6].toDouble();
  }
  a.lambd = v[7].toDouble();
  a.alpha = v[8].toDouble();
  a.t0 = v[9].toDouble();
  a.weight_decay = v[10].toDouble();
  a.maximize = v[11].toBool();
  a.grad_scale = v[12].toOptional<at::Tensor>();
  a.found_inf = v[13].toOptional<at::Tensor>();
  return a;
}

namespace {
void* element_ptr(const at::Tensor& packed, size_t i) {
  return static_cast<char*>(packed.data_ptr()) + i * packed.element_size();
}
}  // namespace

void* ASGDArgs::mu_ptr(size_t i) const {
  return packed() ? element_ptr(packed_mus, i) : mus[i].data_ptr();
}
void* ASGDArgs::eta_ptr(size_t i) const {
  return packed() ? element_ptr(packed_etas, i) : etas[i].data_ptr();
}
void* ASGDArgs::step_ptr(size_t i) const {
  return packed() ? element_ptr(packed_steps, i) : steps[i].data_ptr();
}

const c10::OperatorHandle& asgd_packed_op(bool tensor_lr) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "packed");
  static const auto op_tensor_lr =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "packed_tensor_lr");
  return tensor_lr ? op_tensor_lr : op;
}

const c10::TypedOperatorHandle<AsgdOp>& asgd_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "").typed<AsgdOp>();
  return op;
}

const c10::TypedOperatorHandle<AsgdTensorLrOp>& asgd_tensor_lr_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchext::asgd_", "tensor_lr")
                             .typed<AsgdTensorLrOp>();
  return op;
}

double read_cpu_scalar(const at::Tensor& t) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat: return *static_cast<const float*>(p);
    case at::kDouble: return *static_cast<const double*>(p);
    case at::kInt: return *static_cast<const int32_t*>(p);
    case at::kLong: return static_cast<double>(*static_cast<const int64_t*>(p));
    default: return t.item<double>();
  }
}

void check_found_inf(const char* op, const at::Tensor& found_inf,
                     const c10::Device& device) {
  TORCH_CHECK_TYPE(found_inf.scalar_type() == at::kFloat, op,
                   ": found_inf must be a float32 tensor, got ", found_inf.scalar_type());
  TORCH_CHECK_VALUE(found_inf.numel() == 1, op,
                    ": found_inf must hold exactly one element, got shape ",
                    found_inf.sizes());
  TORCH_CHECK(found_inf.device() == device, op, ": found_inf is on ",
              found_inf.device(), " but the tensors are on ", device);
}

// The .packed overloads' mus, etas and steps: one 1-D tensor each, an
// element per param, one float dtype and one device, not overlapping.
static void check_packed_state(const ASGDArgs& a) {
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

void check_asgd_header(const ASGDArgs& a) {
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

  if (a.lr_tensor.has_value()) {
    const at::Tensor& lr = *a.lr_tensor;
    TORCH_CHECK_VALUE(lr.numel() == 1, "asgd_: a tensor lr must hold exactly one element, got shape ",
                      lr.sizes());
    TORCH_CHECK_TYPE(at::isFloatingType(lr.scalar_type()),
                     "asgd_: a tensor lr must be floating point, got ", lr.scalar_type());
    // Its value can only be checked where reading it costs no device sync.
    if (lr.device().is_cpu()) {
      const double v = read_cpu_scalar(lr);
      TORCH_CHECK_VALUE(v >= 0.0, "asgd_: invalid learning rate: ", v, " (must be >= 0)");
    }
  } else {
    TORCH_CHECK_VALUE(a.lr >= 0.0, "asgd_: invalid learning rate: ", a.lr, " (must be >= 0)");
  }
  TORCH_CHECK_VALUE(a.lambd >= 0.0, "asgd_: invalid lambd value: ", a.lambd, " (must be >= 0)");
  TORCH_CHECK_VALUE(a.alpha >= 0.0, "asgd_: invalid alpha value: ", a.alpha, " (must be >= 0)");
  TORCH_CHECK_VALUE(a.weight_decay >= 0.0, "asgd_: invalid weight_decay value: ",
                    a.weight_decay, " (must be >= 0)");
  if (a.packed()) check_packed_state(a);
  if (n == 0) return;
  TORCH_CHECK(a.params[0].defined(), "asgd_: params[0] is undefined");
  if (!a.packed()) TORCH_CHECK(a.steps[0].defined(), "asgd_: steps[0] is undefined");
  const c10::Device device = a.params[0].device();
  if (a.packed()) {
    TORCH_CHECK(a.packed_steps.device() == device, "asgd_: steps is on ",
                a.packed_steps.device(), " but params[0] is on ", device,
                "; optimizer state must live on the parameters' device");
  }
  if (a.lr_tensor.has_value()) {
    const auto& lr = *a.lr_tensor;
    TORCH_CHECK(lr.device() == device || lr.device().is_cpu(), "asgd_: a tensor lr must be on the CPU or on ",
                device, ", got ", lr.device());
  }
  if (a.grad_scale.has_value()) {
    const auto& s = *a.grad_scale;
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "asgd_: grad_scale must be a float32 tensor, got ",
                     s.scalar_type());
    TORCH_CHECK_VALUE(s.numel() == 1, "asgd_: grad_scale must hold exactly one element, got shape ",
                      s.sizes());
    TORCH_CHECK(s.device() == device, "asgd_: grad_scale is on ", s.device(),
                " but the params are on ", device);
  }
  if (a.found_inf.has_value()) {
    check_found_inf("asgd_", *a.found_inf, device);
  }
}

void check_asgd_entry(const ASGDArgs& a, size_t i, const c10::Device& device,
                      at::ScalarType state_dtype) {
  const at::Tensor& p = a.params[i];
  const at::Tensor& g = a.grads[i];
  const at::Tensor& ax = a.axs[i];
  TORCH_CHECK(p.defined(), "asgd_: params[", i, "] is undefined");
  TORCH_CHECK(g.defined(), "asgd_: grads[", i, "] is undefined (leave params without a grad out of the lists)");
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
  TORCH_CHECK_TYPE(ax.scalar_type() == p.scalar_type(), "asgd_: axs[", i, "] has dtype ",
                   ax.scalar_type(), " but params[", i, "] has dtype ", p.scalar_type());
  TORCH_CHECK_VALUE(g.sizes() == p.sizes(), "asgd_: grads[", i, "] has shape ", g.sizes(),
                    " but params[", i, "] has shape ", p.sizes());
  TORCH_CHECK_VALUE(ax.sizes() == p.sizes(), "asgd_: axs[", i, "] has shape ", ax.sizes(),
                    " but params[", i, "] has shape ", p.sizes());
  TORCH_CHECK(p.device() == device, "asgd_: all tensors must be on one device; params[0] is on ",
              device, " but params[", i, "] is on ", p.device());
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
                   "when the default dtype is float64); steps[0] is ", state_dtype,
                   " but entry ", i, " has ", a.mus[i].scalar_type(), ", ",
                   a.etas[i].scalar_type(), ", ", a.steps[i].scalar_type());
}

void check_asgd_args(const ASGDArgs& a) {
  check_asgd_header(a);
  if (a.params.empty()) return;
  const c10::Device device = a.params[0].device();
  const at::ScalarType state_dtype = a.state_dtype();
  for (size_t i = 0; i < a.params.size(); ++i) {
    prefetch_asgd_ahead(a, i);
    check_asgd_entry(a, i, device, state_dtype);
  }
}

void check_amp_tensors(const char* op, at::TensorList tensors, const at::Tensor& found_inf,
                       bool allow_fp16) {
  const c10::Device device = found_inf.device();
  check_found_inf(op, found_inf, device);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i + kPrefetchImpl < tensors.size()) {
      prefetch_impl(tensors[i + kPrefetchImpl].unsafeGetTensorImpl());
    }
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined(), op, ": tensors[", i, "] is undefined");
    TORCH_CHECK(t.layout() == at::kStrided, op, ": tensors[", i,
                "] must be a strided (dense) tensor; sparse gradients are not supported");
    const auto dt = t.scalar_type();
    TORCH_CHECK_TYPE(dt == at::kFloat || dt == at::kDouble || dt == at::kHalf ||
                         dt == at::kBFloat16 || dt == at::kComplexFloat ||
                         dt == at::kComplexDouble,
                     op, ": tensors[", i, "] has unsupported dtype ", dt);
    TORCH_CHECK(t.device() == device, op, ": tensors[", i, "] is on ", t.device(),
                " but found_inf is on ", device);
  }
}

void check_unscale_args(at::TensorList tensors, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale) {
  check_amp_tensors("unscale_", tensors, found_inf);
  TORCH_CHECK_TYPE(inv_scale.scalar_type() == at::kFloat,
                   "unscale_: inv_scale must be a float32 tensor, got ", inv_scale.scalar_type());
  TORCH_CHECK_VALUE(inv_scale.numel() == 1,
                    "unscale_: inv_scale must hold exactly one element, got shape ",
                    inv_scale.sizes());
  TORCH_CHECK(inv_scale.device() == found_inf.device(), "unscale_: inv_scale is on ",
              inv_scale.device(), " but found_inf is on ", found_inf.device());
}

void check_update_scale_args(const at::Tensor& scale, const at::Tensor& growth_tracker,
                             const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                             double growth_factor, double backoff_factor, int64_t growth_interval,
                             int64_t hysteresis, std::optional<double> min_scale,
                             std::optional<double> max_scale) {
  const char* op = "update_scale_";
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat, op,
                   ": scale must be a float32 tensor, got ", scale.scalar_type());
  TORCH_CHECK_VALUE(scale.numel() == 1, op, ": scale must hold exactly one element, got shape ",
                    scale.sizes());
  const c10::Device device = scale.device();
  TORCH_CHECK_TYPE(growth_tracker.scalar_type() == at::kInt, op,
                   ": growth_tracker must be an int32 tensor, got ", growth_tracker.scalar_type());
  TORCH_CHECK_VALUE(growth_tracker.numel() == 1, op,
                    ": growth_tracker must hold exactly one element, got shape ",
                    growth_tracker.sizes());
  TORCH_CHECK(growth_tracker.device() == device, op, ": growth_tracker is on ",
              growth_tracker.device(), " but scale is on ", device);
  TORCH_CHECK_TYPE(hysteresis_tracker.scalar_type() == at::kInt, op,
                   ": hysteresis_tracker must be an int32 tensor, got ",
                   hysteresis_tracker.scalar_type());
  TORCH_CHECK_VALUE(hysteresis_tracker.numel() == 1, op,
                    ": hysteresis_tracker must hold exactly one element, got shape ",
                    hysteresis_tracker.sizes());
  TORCH_CHECK(hysteresis_tracker.device() == device, op, ": hysteresis_tracker is on ",
              hysteresis_tracker.device(), " but scale is on ", device);
  check_found_inf(op, found_inf, device);
  TORCH_CHECK_VALUE(growth_factor > 1.0, op, ": growth_factor must be > 1, got ", growth_factor);
  TORCH_CHECK_VALUE(backoff_factor > 0.0 && backoff_factor < 1.0, op,
                    ": backoff_factor must be in (0, 1), got ", backoff_factor);
  TORCH_CHECK_VALUE(growth_interval >= 1, op, ": growth_interval must be >= 1, got ",
                    growth_interval);
  TORCH_CHECK_VALUE(hysteresis >= 1, op, ": hysteresis must be >= 1, got ", hysteresis);
  const double lo = min_scale.value_or(0.0);
  const double hi = max_scale.value_or(std::numeric_limits<double>::infinity());
  TORCH_CHECK_VALUE(lo >= 0.0 && lo <= hi, op, ": need 0 <= min_scale <= max_scale, got min_scale=",
                    lo, ", max_scale=", hi);
}

}  // namespace torchext

#include <ATen/MemoryOverlap.h>

namespace torchext {

void check_swap_args(at::TensorList tensors, at::TensorList others) {
  TORCH_CHECK_VALUE(tensors.size() == others.size(),
                    "swap_: tensors and others must have the same length, got ", tensors.size(),
                    " and ", others.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& a = tensors[i];
    const at::Tensor& b = others[i];
    TORCH_CHECK(a.defined() && b.defined(), "swap_: tensors[", i, "] or others[", i,
                "] is undefined");
    TORCH_CHECK(a.layout() == at::kStrided && b.layout() == at::kStrided, "swap_: tensors[", i,
                "] and others[", i, "] must be strided (dense) tensors");
    TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "swap_: tensors[", i, "] has dtype ",
                     a.scalar_type(), " but others[", i, "] has dtype ", b.scalar_type());
    // sym_sizes: under tracing (Meta/fake tensors) the sizes may be symbolic.
    TORCH_CHECK_VALUE(a.sym_sizes() == b.sym_sizes(), "swap_: tensors[", i, "] has shape ",
                      a.sym_sizes(), " but others[", i, "] has shape ", b.sym_sizes());
    TORCH_CHECK(a.device() == tensors[0].device() && b.device() == tensors[0].device(),
                "swap_: all tensors must be on one device; tensors[0] is on ", tensors[0].device(),
                " but tensors[", i, "] is on ", a.device(), " and others[", i, "] on ",
                b.device());
    if (a.is_meta()) continue;  // no memory to overlap (and sizes may be symbolic)
    TORCH_CHECK(at::has_internal_overlap(a) != at::MemOverlap::Yes &&
                    at::has_internal_overlap(b) != at::MemOverlap::Yes,
                "swap_: tensors[", i, "] or others[", i,
                "] has elements that share memory (e.g. an expanded tensor)");
    // TooHard: layouts too irregular to tell, so sharing a storage counts as overlap.
    const auto overlap = at::get_overlap_status(a, b);
    TORCH_CHECK(overlap == at::MemOverlapStatus::No ||
                    (overlap == at::MemOverlapStatus::TooHard && !a.is_alias_of(b)),
                "swap_: tensors[", i, "] and others[", i, "] overlap in memory");
  }
}

}  // namespace torchext

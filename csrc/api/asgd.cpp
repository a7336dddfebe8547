// torchext::optim::ASGD (LibTorch). The update itself is the registered
// torchext::asgd_ op, called through the dispatcher exactly as Python calls
// torch.ops.torchext.asgd_.
#include <torchext/optim/asgd.h>

#include "../ops/asgd.h"
#include "asgd_state.h"
#include "clip_grad.h"
#include "device_groups.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace torchext {
namespace optim {
namespace {

using torch::optim::OptimizerParamGroup;

// The one device rule, as Python's (torchext/_devices.py: KERNEL_DEVICES):
// the ops have kernels for cpu, cuda and meta (its validation, no data).
// fused unset means fused when every param is on such a device.
bool fused_device(const c10::Device& d) { return d.is_cpu() || d.is_cuda() || d.is_meta(); }

// The lr as the op takes it: the tensor lr, or a float lr as a CPU tensor
// (read on the host, no sync).
at::Tensor op_lr(const ASGDOptions& o) {
  return o.has_tensor_lr() ? o.lr_tensor() : at::scalar_tensor(o.lr(), at::kDouble);
}

// The op's arguments for one op call: a group's params on one device with
// one t0 (Python's slot group). The op validates exactly these.
struct DeviceCall {
  std::vector<at::Tensor> params, grads, axs, mus, etas, steps;
  std::optional<at::Tensor> grad_scale, found_inf, clip_coef;
  double t0 = 0.0;  // the group's t0, or its t0_per_param value for these params
  // Stochastic rounding: the group's seed (nullopt: round to nearest) and
  // each param's id, its group's index << 32 | its index in the group
  // (Python's _op.rounding_id), whatever op call it lands in.
  std::optional<int64_t> rounding_seed;
  std::vector<int64_t> rounding_ids;

  ASGDHyperparams hyper(const ASGDOptions& o) const {
    auto h = ASGDHyperparams::from(o);
    h.t0 = t0;
    return h;
  }

  ASGDArgs args(const ASGDOptions& o, const at::Tensor& lr) const {
    // (TensorRefs point into this DeviceCall's lists: use the args while it lives.)
    auto a = asgd_args(TensorRefs(params), TensorRefs(grads), TensorRefs(axs), TensorRefs(mus),
                       TensorRefs(etas), TensorRefs(steps), lr, hyper(o), grad_scale, found_inf,
                       clip_coef);
    a.rounding_seed = rounding_seed;
    if (rounding_seed.has_value()) a.rounding_ids = c10::IntArrayRef(rounding_ids);
    return a;
  }

  // The op's rounding_* arguments (offsets: none, no param is a shard).
  ASGDRoundingArgs rounding() const {
    if (!rounding_seed.has_value()) return {};
    return {rounding_seed, c10::IValue(c10::List<int64_t>(rounding_ids)), c10::IValue()};
  }

  // One asgd_ call through the dispatcher, as Python makes it.
  void run(const ASGDOptions& o, const at::Tensor& lr) const {
    auto stack = asgd_stack(TensorListArg(params), TensorListArg(grads), TensorListArg(axs),
                            TensorListArg(mus), TensorListArg(etas), TensorListArg(steps), lr,
                            hyper(o), grad_scale, found_inf, clip_coef, rounding());
    asgd_op(ASGDState::kLists).callBoxed(&stack);
  }
};

// torch.optim.ASGD's for-loop update, op for op (fused=false): with
// capturable=false it reads step/eta/mu (and found_inf) on the host and copies
// ax while mu == 1, as torch does; capturable=true is its sync-free tensor
// form, which skips on the device. grad_scale/found_inf follow the fused op's
// contract (grads multiplied by the float32 reciprocal of grad_scale).
// Python's torchext.optim.functional.reference_asgd is the same, op for op
// (each Python operator written as the ATen call it makes, so the bits
// match; compared by cpp_tests UnfusedStep.*).
void reference_step(const DeviceCall& c, const ASGDOptions& o) {
  const bool capturable = o.capturable();
  if (c.found_inf.has_value() && !capturable && c.found_inf->item<double>() != 0) return;
  std::optional<at::Tensor> inv_scale;
  if (c.grad_scale.has_value()) {
    inv_scale = c.grad_scale->to(at::kDouble).reciprocal().to(at::kFloat);
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> olds;  // capturable skip on the device
  if (capturable && c.found_inf.has_value()) {
    for (const auto* list : {&c.params, &c.axs, &c.mus, &c.etas, &c.steps}) {
      for (const auto& t : *list) olds.emplace_back(t, t.clone());
    }
  }
  const double lambd = o.lambd(), alpha = o.alpha(), t0 = c.t0;
  for (const auto i : c10::irange(c.params.size())) {
    at::Tensor param = c.params[i], ax = c.axs[i], grad = c.grads[i];
    const at::Tensor &mu = c.mus[i], &eta = c.etas[i], &step_t = c.steps[i];
    if (inv_scale.has_value()) grad = grad * inv_scale->to(grad.device());
    if (c.clip_coef.has_value()) grad = grad * c.clip_coef->to(grad.device());
    if (o.maximize()) grad = -grad;
    if (param.is_complex()) {
      grad = at::view_as_real(grad);
      param = at::view_as_real(param);
      ax = at::view_as_real(ax);
    }
    step_t.add_(1);
    if (o.weight_decay() != 0) grad = grad.add(param, o.weight_decay());
    if (capturable) {
      // Python's `lr / ((1 + lambd * lr * step_t) ** alpha)` evaluates as
      // ((step_t * (lambd * lr) + 1) ** alpha).reciprocal() * lr.
      param.mul_(1 - lambd * eta);
      param.addcmul_(grad, eta, -1);
      ax.add_(param.sub(ax).mul_(mu));
      if (o.has_tensor_lr()) {
        // `lr / ((1 + lambd * lr * step_t) ** alpha)` with a tensor lr: a division.
        const auto lr = o.lr_tensor().reshape({});
        eta.copy_(lr / (lr * lambd * step_t + 1).pow(alpha));
      } else {
        eta.copy_((step_t * (lambd * o.lr()) + 1).pow(alpha).reciprocal() * o.lr());
      }
      mu.copy_(at::maximum(step_t - t0, at::ones_like(step_t)).reciprocal());
    } else {
      const double eta_value = eta.item<double>();
      param.mul_(1 - lambd * eta_value);
      param.add_(grad, -eta_value);
      if (mu.item<double>() != 1) {
        ax.add_(param.sub(ax).mul_(mu));
      } else {
        ax.copy_(param);
      }
      const double step = step_t.item<double>();
      if (o.has_tensor_lr()) {  // tensor arithmetic, in the lr's dtype, as Python's
        const auto lr = o.lr_tensor().reshape({});
        eta.copy_(lr / (lr * lambd * step + 1).pow(alpha));
      } else {
        const double lr = o.lr();
        eta.fill_(lr / std::pow(1 + lambd * lr * step, alpha));
      }
      mu.fill_(1 / std::max(1.0, step - t0));
    }
  }
  if (!olds.empty()) {
    const auto skip = *c.found_inf != 0;
    for (auto& [t, old] : olds) t.copy_(at::where(skip.to(t.device()), old, t));
  }
}

}  // namespace

at::ScalarType scalar_state_dtype() {
  return c10::typeMetaToScalarType(at::get_default_dtype()) == at::kDouble ? at::kDouble
                                                                           : at::kFloat;
}

std::unique_ptr<ASGDParamState> initial_state(const at::Tensor& p, const ASGDOptions& o) {
  auto st = std::make_unique<ASGDParamState>();
  const auto opts = at::TensorOptions().dtype(scalar_state_dtype()).device(p.device());
  st->step(at::zeros({}, opts));
  st->eta(o.has_tensor_lr() ? o.lr_tensor().detach().to(opts, false, /*copy=*/true).reshape({})
                            : at::full({}, o.lr(), opts));
  st->mu(at::ones({}, opts));
  st->ax(at::zeros_like(p, p.options().dtype(o.average_dtype_for(p)), at::MemoryFormat::Preserve));
  return st;
}

void check_loaded_state(const ASGDParamState& st, const at::Tensor& p, const std::string& where) {
  const std::pair<const char*, const at::Tensor*> entries[] = {
      {"step", &st.step()}, {"eta", &st.eta()}, {"mu", &st.mu()}, {"ax", &st.ax()}};
  for (const auto& [key, t] : entries) {
    TORCH_CHECK_VALUE(t->defined(), where, " lacks '", key,
                      "' (an ASGD state has step, eta, mu and ax)");
  }
  const auto& ax = st.ax();
  TORCH_CHECK_VALUE(ax.layout() == at::kStrided, where,
                    "['ax'] must be a strided (dense) tensor, got ", ax.layout());
  TORCH_CHECK_VALUE(ax.sizes() == p.sizes(), where, "['ax'] has shape ", ax.sizes(),
                    " but the parameter has shape ", p.sizes());
  TORCH_CHECK_TYPE(at::isComplexType(ax.scalar_type()) == at::isComplexType(p.scalar_type()) &&
                       (at::isFloatingType(ax.scalar_type()) ||
                        at::isComplexType(ax.scalar_type())),
                   where, "['ax'] has dtype ", ax.scalar_type(), " but the parameter has dtype ",
                   p.scalar_type());
  TORCH_CHECK_VALUE(!ax.is_meta() || p.is_meta(), where,
                    "['ax'] is on meta (it holds no values) but the parameter is on ",
                    p.device());
  for (const auto& [key, t] : entries) {
    if (t == &st.ax()) continue;
    const auto dt = t->scalar_type();
    TORCH_CHECK_VALUE(t->numel() == 1, where, "['", key, "'] must hold one element, got shape ",
                      t->sizes());
    TORCH_CHECK_VALUE(t->layout() == at::kStrided && !at::isComplexType(dt) && dt != at::kBool,
                      where, "['", key, "'] must be one real number, got ", dt, " ",
                      t->layout());
    if (t->is_meta()) continue;  // no value to read (a meta parameter's state)
    const double v = t->item<double>();  // a host read: loading may sync
    TORCH_CHECK_VALUE(std::isfinite(v) && v >= 0.0, where, "['", key,
                      "'] must be finite and >= 0, got ", v);
  }
}

void adopt_loaded_state(ASGDParamState& st, const at::Tensor& p, const ASGDOptions& o,
                        const std::string& where) {
  check_loaded_state(st, p, where);
  const auto sdtype = scalar_state_dtype();
  auto scalar = [&](const at::Tensor& t) {
    const auto s = t.scalar_type();
    const auto dt = s == at::kDouble || s == at::kFloat ? s : sdtype;
    return t.detach().to(p.device(), dt, /*non_blocking=*/false, /*copy=*/true).reshape({});
  };
  auto step = scalar(st.step()), eta = scalar(st.eta()), mu = scalar(st.mu());
  // By the rule (average_dtype_for), whatever dtype was saved: a bf16 ax
  // (torch's checkpoint, an old torchext one) widens to float32, a float32
  // one narrows where the group opted out (average_dtype nullopt).
  st.ax(st.ax().detach().to(p.device(), o.average_dtype_for(p), false, /*copy=*/true));
  st.step(step);
  st.eta(eta);
  st.mu(mu);
}

// ---- ASGDOptions -------------------------------------------------------

ASGDOptions::ASGDOptions(double lr) : lr_(lr) {}

ASGDOptions::ASGDOptions(torch::Tensor lr) { this->lr(std::move(lr)); }

ASGDOptions& ASGDOptions::lr(torch::Tensor new_lr) {
  TORCH_CHECK_VALUE(new_lr.defined(), "ASGDOptions: a tensor lr must be defined");
  lr_tensor_ = std::move(new_lr);
  return *this;
}

bool operator==(const ASGDOptions& lhs, const ASGDOptions& rhs) {
  const bool same_lr = lhs.has_tensor_lr() || rhs.has_tensor_lr()
                           ? lhs.lr_tensor().is_same(rhs.lr_tensor())
                           : lhs.lr() == rhs.lr();
  return same_lr && lhs.lambd() == rhs.lambd() && lhs.alpha() == rhs.alpha() &&
         lhs.t0() == rhs.t0() && lhs.t0_per_param() == rhs.t0_per_param() &&
         lhs.weight_decay() == rhs.weight_decay() &&
         lhs.maximize() == rhs.maximize() && lhs.capturable() == rhs.capturable() &&
         lhs.fused() == rhs.fused() && lhs.average_dtype() == rhs.average_dtype() &&
         lhs.stochastic_rounding() == rhs.stochastic_rounding() &&
         lhs.rounding_seed() == rhs.rounding_seed();
}

at::ScalarType ASGDOptions::average_dtype_for(const at::Tensor& param) const {
  const auto dt = param.scalar_type();
  if ((dt == at::kHalf || dt == at::kBFloat16) && average_dtype().has_value()) return at::kFloat;
  return dt;
}

void ASGDOptions::validate() const {
  // Python's check_average_dtype (torchext/optim/_checkpoint.py).
  TORCH_CHECK_VALUE(!average_dtype().has_value() || *average_dtype() == at::kFloat,
                    "ASGDOptions: average_dtype must be at::kFloat (a float32 average for "
                    "float16/bfloat16 parameters) or nullopt (the parameter's dtype), got ",
                    *average_dtype());
  // Python's check_rounding: the bits are drawn by the fused op's kernels;
  // torch's unfused path rounds to nearest, so the flag is refused there
  // rather than ignored.
  TORCH_CHECK_VALUE(!stochastic_rounding() || fused().value_or(true),
                    "ASGDOptions: stochastic_rounding=true needs the fused op, but fused=false "
                    "takes torch's unfused path, which rounds to nearest");
  // The op's own option rules (empty lists: only the options are checked),
  // with t0 and with each t0_per_param value.
  DeviceCall none;
  none.t0 = t0();
  const auto lr = op_lr(*this);
  check_asgd_args(none.args(*this, lr));
  for (const auto i : c10::irange(t0_per_param().size())) {
    none.t0 = t0_per_param()[i];
    try {
      check_asgd_args(none.args(*this, lr));
    } catch (c10::Error& e) {
      e.add_context(c10::str("in t0_per_param[", i, "]"));
      throw;
    }
  }
}

void check_t0_per_param_size(const ASGDOptions& o, size_t num_params, const std::string& where) {
  TORCH_CHECK_VALUE(o.t0_per_param().empty() || o.t0_per_param().size() == num_params, where,
                    ": t0_per_param has ", o.t0_per_param().size(),
                    " values but the group has ", num_params, " params");
}

void ASGDOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lambd);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(alpha);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(t0);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(maximize);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(capturable);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(fused);
  if (has_tensor_lr()) archive.write("lr_tensor", lr_tensor());
  if (!t0_per_param().empty()) archive.write("t0_per_param", c10::IValue(t0_per_param()));
  // The ScalarType as an int, or None (opted out).
  archive.write("average_dtype", average_dtype().has_value()
                                     ? c10::IValue(static_cast<int64_t>(*average_dtype()))
                                     : c10::IValue());
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(stochastic_rounding);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(rounding_seed);
}

void ASGDOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lambd);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, alpha);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, t0);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, maximize);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, capturable);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG_OPTIONAL(bool, fused);
  c10::IValue t;
  if (archive.try_read("lr_tensor", t)) {
    TORCH_CHECK_VALUE(t.isTensor(), "ASGDOptions: 'lr_tensor' must be a tensor, got ",
                      t.tagKind());
    lr(t.toTensor());
  }
  c10::IValue t0s;
  if (archive.try_read("t0_per_param", t0s)) {
    TORCH_CHECK_VALUE(t0s.isDoubleList(), "ASGDOptions: 't0_per_param' must be a list of "
                      "floats, got ", t0s.tagKind());
    t0_per_param(t0s.toDoubleVector());
  } else {
    t0_per_param({});
  }
  c10::IValue avg;
  if (!archive.try_read("average_dtype", avg)) {
    average_dtype(at::kFloat);  // an archive from before the option: the default
  } else if (avg.isNone()) {
    average_dtype(std::nullopt);
  } else {
    TORCH_CHECK_VALUE(avg.isInt() && avg.toInt() == static_cast<int64_t>(at::kFloat),
                      "ASGDOptions: 'average_dtype' must be float32 (",
                      static_cast<int64_t>(at::kFloat), ") or None, got ",
                      avg.isInt() ? c10::str(avg.toInt()) : std::string(avg.tagKind()));
    average_dtype(at::kFloat);
  }
  // Absent (an archive from before the options): left as they are (ASGD::load
  // gives them the optimizer's defaults).
  c10::IValue sr, seed;
  if (archive.try_read("stochastic_rounding", sr)) {
    TORCH_CHECK_VALUE(sr.isBool(), "ASGDOptions: 'stochastic_rounding' must be a bool, got ",
                      sr.tagKind());
    stochastic_rounding(sr.toBool());
  }
  if (archive.try_read("rounding_seed", seed)) {
    TORCH_CHECK_VALUE(seed.isInt(), "ASGDOptions: 'rounding_seed' must be an int (int64), got ",
                      seed.tagKind());
    rounding_seed(seed.toInt());
  }
}

double ASGDOptions::get_lr() const {
  return has_tensor_lr() ? lr_tensor().item<double>() : lr();
}

void ASGDOptions::set_lr(const double lr) {
  if (has_tensor_lr()) {
    at::NoGradGuard no_grad;
    lr_tensor_.fill_(lr);
  } else {
    this->lr(lr);
  }
}

// ---- ASGDParamState ----------------------------------------------------

void ASGDParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eta);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(mu);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(ax);
}

void ASGDParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, eta);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, mu);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, ax);
}

// ---- ASGD --------------------------------------------------------------

ASGD::ASGD(const std::vector<OptimizerParamGroup>& param_groups, ASGDOptions defaults)
    : Optimizer(std::vector<OptimizerParamGroup>{}, std::make_unique<ASGDOptions>(defaults)) {
  defaults.validate();
  for (const auto& group : param_groups) {
    add_param_group(group);
  }
}

ASGD::ASGD(std::vector<torch::Tensor> params, ASGDOptions defaults)
    : ASGD(std::vector<OptimizerParamGroup>{OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

void ASGD::add_param_group(const OptimizerParamGroup& param_group) {
  std::unique_ptr<torch::optim::OptimizerOptions> options;
  if (param_group.has_options()) {
    const auto* asgd_options = dynamic_cast<const ASGDOptions*>(&param_group.options());
    TORCH_CHECK_TYPE(asgd_options != nullptr,
                     "ASGD.add_param_group: the group's options must be "
                     "torchext::optim::ASGDOptions");
    asgd_options->validate();
    options = param_group.options().clone();
  } else {
    options = defaults_->clone();
  }
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) seen.insert(p.unsafeGetTensorImpl());
  }
  std::unordered_set<const c10::TensorImpl*> in_group;
  for (const auto i : c10::irange(param_group.params().size())) {
    const auto& p = param_group.params()[i];
    TORCH_CHECK(p.defined(), "ASGD.add_param_group: params[", i, "] is undefined");
    TORCH_CHECK(p.is_leaf(), "ASGD.add_param_group: can't optimize a non-leaf Tensor (params[", i,
                "])");
    TORCH_CHECK_VALUE(!seen.count(p.unsafeGetTensorImpl()),
                      "ASGD.add_param_group: some parameters appear in more than one "
                      "parameter group (params[", i, "])");
    TORCH_CHECK_VALUE(in_group.insert(p.unsafeGetTensorImpl()).second,
                      "ASGD.add_param_group: params[", i, "] appears twice in the group");
    if (static_cast<const ASGDOptions&>(*options).fused().value_or(false)) {
      TORCH_CHECK(fused_device(p.device()), "ASGD: `fused=True` requires all the params to be "
                  "on CPU or CUDA devices (or meta), params[", i, "] is on ",
                  p.device());
    }
  }
  check_t0_per_param_size(static_cast<const ASGDOptions&>(*options), param_group.params().size(),
                          "ASGD.add_param_group");
  param_groups_.emplace_back(param_group.params(), std::move(options));
}

torch::Tensor ASGD::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_impl(nullptr, nullptr, nullptr);
  return loss;
}

torch::Tensor ASGD::step_with_amp(const torch::Tensor& grad_scale, const torch::Tensor& found_inf,
                                  const torch::Tensor& clip_coef) {
  step_impl(grad_scale.defined() ? &grad_scale : nullptr,
            found_inf.defined() ? &found_inf : nullptr,
            clip_coef.defined() ? &clip_coef : nullptr);
  return torch::Tensor();  // what step() returns without a closure
}

ASGD::~ASGD() = default;

bool ASGD::amp_step_must_not_sync() const {
  if (param_groups_.empty()) return false;
  for (const auto& group : param_groups_) {
    if (!static_cast<const ASGDOptions&>(group.options()).capturable()) return false;
  }
  return true;
}

torch::Tensor ASGD::clip_grad_norm_(double max_norm, double norm_type, bool error_if_nonfinite) {
  // See Note [Clip: applied when called, folded only inside one call]
  // (csrc/api/clip_grad.h, also in torchext/_clip.py): the clip in place.
  return api::clip_grad_norm_(api::params_of(*this), max_norm, norm_type, error_if_nonfinite);
}

ClipAndStep ASGD::clip_and_step(double max_norm, double norm_type, bool error_if_nonfinite,
                                LossClosure closure) {
  // See Note [Clip: applied when called, folded only inside one call]
  // (csrc/api/clip_grad.h, also in torchext/_clip.py): no user code runs
  // between the measure and the step, so the coefficient goes to the step.
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  const auto total =
      api::measure(api::norms_calls_by_device(api::grads_of(*this)), norm_type).total;
  if (api::refuses_nonfinite(total, error_if_nonfinite)) api::throw_nonfinite(norm_type);
  const auto coef = api::as_factor(api::clip_coef(total, max_norm));
  step_impl(nullptr, nullptr, coef.defined() ? &coef : nullptr);
  return {total, loss};
}

void ASGD::check_not_averaged(const char* what) const {
  TORCH_CHECK(!averaged_in_, what, ": the parameters hold their averages (an "
              "AveragedParameters guard is alive), which would be saved as the training "
              "weights; save after it goes out of scope");
}

void ASGD::step_impl(const torch::Tensor* grad_scale, const torch::Tensor* found_inf,
                       const torch::Tensor* clip_coef) {
  TORCH_CHECK(!averaged_in_, "ASGD.step: the parameters hold their averages (an "
              "AveragedParameters guard is alive); step after it goes out of scope");
  at::NoGradGuard no_grad;
  // All or nothing: plan every group's op calls and run the op's validator
  // on each, then create the missing state, then write. A step that is one
  // fused call is not validated first: the op validates before it writes
  // (as Python's run_calls), and the state it was to create is dropped when
  // it refuses.
  if (grad_scale != nullptr) {
    TORCH_CHECK_TYPE(grad_scale->scalar_type() == at::kFloat && grad_scale->numel() == 1,
                     "ASGD.step_with_amp: grad_scale must be a 1-element float32 tensor");
  }
  if (found_inf != nullptr) {
    TORCH_CHECK_TYPE(found_inf->scalar_type() == at::kFloat && found_inf->numel() == 1,
                     "ASGD.step_with_amp: found_inf must be a 1-element float32 tensor");
  }
  if (clip_coef != nullptr) {
    TORCH_CHECK_TYPE((clip_coef->scalar_type() == at::kFloat ||
                      clip_coef->scalar_type() == at::kDouble) && clip_coef->numel() == 1,
                     "ASGD.step_with_amp: clip_coef must be a 1-element float32 or float64 "
                     "tensor");
  }
  struct GroupPlan {
    const ASGDOptions* options;
    bool fused;
    at::Tensor lr;
    size_t index;  // in param_groups_
    std::vector<DeviceCall> calls;
  };
  std::vector<GroupPlan> plans;
  std::vector<std::pair<void*, std::unique_ptr<ASGDParamState>>> created;
  for (const auto gi : c10::irange(param_groups_.size())) {
    const auto& group = param_groups_[gi];
    const auto& o = static_cast<const ASGDOptions&>(group.options());
    check_t0_per_param_size(o, group.params().size(),
                            c10::str("ASGD.step: param_groups[", gi, "]"));
    const at::Tensor lr = op_lr(o);
    DeviceCall all;
    std::vector<double> t0s;  // per param of `all`
    if (o.stochastic_rounding()) all.rounding_seed = o.rounding_seed();
    for (const auto k : c10::irange(group.params().size())) {
      const auto& p = group.params()[k];
      if (!p.grad().defined()) continue;
      const ASGDParamState* st = nullptr;
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it != state_.end()) {
        st = static_cast<const ASGDParamState*>(it->second.get());
      } else {  // kept only if the step runs
        auto fresh = initial_state(p, o);
        st = fresh.get();
        created.emplace_back(p.unsafeGetTensorImpl(), std::move(fresh));
      }
      all.params.push_back(p);
      all.grads.push_back(p.grad());
      all.axs.push_back(st->ax());
      all.mus.push_back(st->mu());
      all.etas.push_back(st->eta());
      all.steps.push_back(st->step());
      t0s.push_back(o.t0_per_param().empty() ? o.t0() : o.t0_per_param()[k]);
      if (all.rounding_seed.has_value()) {
        all.rounding_ids.push_back(
            static_cast<int64_t>((static_cast<uint64_t>(gi) << 32) | static_cast<uint64_t>(k)));
      }
    }
    if (all.params.empty()) continue;
    // The fused default is decided over every param of the group, with a
    // grad or not, as Python's (functional.use_fused over the group's params,
    // fixed when its slot groups are built): a param without a grad on a
    // device without kernels makes the group unfused in both.
    bool all_fused_devices = true;
    for (const auto& p : group.params()) all_fused_devices = all_fused_devices && fused_device(p.device());
    GroupPlan plan{&o, o.fused().value_or(all_fused_devices), lr, gi, {}};
    // Python's check_rounding_route, before anything is written or created.
    if (all.rounding_seed.has_value() && !plan.fused) {
      std::string why = "fused=false";
      if (!o.fused().has_value()) {
        for (const auto& p : group.params()) {
          if (!fused_device(p.device())) {
            why = c10::str("parameters on ", p.device(), " (no torchext kernels)");
            break;
          }
        }
      }
      TORCH_CHECK_VALUE(false, "ASGD.step: param_groups[", gi, "]: stochastic_rounding=true "
                        "needs the fused op, but this step takes torch's unfused path (", why,
                        "), which rounds to nearest; nothing was changed");
    }
    // One op call per device and t0, as Python's slot groups (the op itself
    // groups by dtype).
    for (const auto& [device, t0, sub] : api::index_by_device_and_t0(all.params, t0s)) {
      DeviceCall c{api::pick(all.params, sub), api::pick(all.grads, sub),
                   api::pick(all.axs, sub),    api::pick(all.mus, sub),
                   api::pick(all.etas, sub),   api::pick(all.steps, sub),
                   std::nullopt,               std::nullopt,
                   std::nullopt,               t0};
      if (grad_scale != nullptr) c.grad_scale = grad_scale->to(device, /*non_blocking=*/true);
      if (found_inf != nullptr) c.found_inf = found_inf->to(device, /*non_blocking=*/true);
      if (clip_coef != nullptr) c.clip_coef = clip_coef->to(device, /*non_blocking=*/true);
      c.rounding_seed = all.rounding_seed;
      if (c.rounding_seed.has_value()) c.rounding_ids = api::pick(all.rounding_ids, sub);
      plan.calls.push_back(std::move(c));
    }
    plans.push_back(std::move(plan));
  }
  const auto in_group = [](const GroupPlan& plan, const DeviceCall& c) {
    return c10::str("ASGD.step: in param_groups[", plan.index, "] (its tensors on ",
                    c.params.front().device(), "); nothing was changed");
  };
  const bool one_fused_call = plans.size() == 1 && plans[0].calls.size() == 1 && plans[0].fused;
  if (!one_fused_call) {
    for (const auto& plan : plans) {
      for (const auto& c : plan.calls) {
        try {
          check_asgd_args(c.args(*plan.options, plan.lr));
        } catch (c10::Error& e) {
          e.add_context(in_group(plan, c));
          throw;
        }
      }
    }
  }
  std::vector<void*> created_keys;
  for (auto& [key, st] : created) {
    created_keys.push_back(key);
    state_[key] = std::move(st);
  }
  if (one_fused_call) {
    const auto& plan = plans[0];
    const auto& c = plan.calls[0];
    try {
      c.run(*plan.options, plan.lr);
    } catch (c10::Error& e) {  // refused before it wrote: keep no state it was to create
      for (auto* key : created_keys) state_.erase(key);
      e.add_context(in_group(plan, c));
      throw;
    }
    return;
  }
  for (const auto& plan : plans) {
    const auto& o = *plan.options;
    for (const auto& c : plan.calls) {
      if (plan.fused) {
        c.run(o, plan.lr);
      } else {
        reference_step(c, o);
      }
    }
  }
}

void ASGD::save(torch::serialize::OutputArchive& archive) const {
  check_not_averaged("ASGD.save");
  torch::optim::serialize<ASGDParamState, ASGDOptions>(archive, *this);
}

void ASGD::load(torch::serialize::InputArchive& archive) {
  // Load into a scratch optimizer over the same parameters, check it, then
  // take its state and options: a bad archive changes nothing here.
  std::vector<OptimizerParamGroup> groups;
  for (const auto& g : param_groups_) groups.emplace_back(g.params(), g.options().clone());
  ASGD scratch(groups, static_cast<const ASGDOptions&>(*defaults_));
  try {
    torch::optim::serialize<ASGDParamState, ASGDOptions>(archive, scratch);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "ASGD.load: the archive is not a matching torchext ASGD checkpoint: ",
                e.what_without_backtrace());
  } catch (const std::exception& e) {  // e.g. torch::jit::ObjectAttributeError
    TORCH_CHECK(false, "ASGD.load: the archive is not a torchext ASGD checkpoint: ", e.what());
  }
  // Options from before stochastic rounding: the optimizer's defaults, as
  // Python's __setstate__ gives a group without the keys its constructor's.
  const auto& defaults = static_cast<const ASGDOptions&>(*defaults_);
  torch::serialize::InputArchive groups_archive;
  archive.read("param_groups", groups_archive);
  for (const auto gi : c10::irange(scratch.param_groups_.size())) {
    torch::serialize::InputArchive group_archive, options_archive;
    groups_archive.read(c10::str("param_groups/", gi), group_archive);
    group_archive.read("options", options_archive);
    auto& o = static_cast<ASGDOptions&>(scratch.param_groups_[gi].options());
    c10::IValue unused;
    if (!options_archive.try_read("stochastic_rounding", unused)) {
      o.stochastic_rounding(defaults.stochastic_rounding());
    }
    if (!options_archive.try_read("rounding_seed", unused)) {
      o.rounding_seed(defaults.rounding_seed());
    }
  }
  for (const auto gi : c10::irange(scratch.param_groups_.size())) {
    const auto& g = scratch.param_groups_[gi];
    const std::string where = c10::str("ASGD.load: param_groups[", gi, "]");
    const auto& o = static_cast<const ASGDOptions&>(g.options());
    try {
      o.validate();
    } catch (c10::Error& e) {
      e.add_context(c10::str("in ", where, "; nothing was changed"));
      throw;
    }
    check_t0_per_param_size(o, g.params().size(), where);
    for (const auto pi : c10::irange(g.params().size())) {
      const auto& p = g.params()[pi];
      auto it = scratch.state_.find(p.unsafeGetTensorImpl());
      if (it == scratch.state_.end()) continue;
      adopt_loaded_state(static_cast<ASGDParamState&>(*it->second), p, o,
                         c10::str("ASGD.load: the state of param_groups[", gi, "].params[", pi,
                                  "]"));
    }
  }
  state_ = std::move(scratch.state_);
  for (const auto gi : c10::irange(param_groups_.size())) {
    param_groups_[gi].set_options(scratch.param_groups_[gi].options().clone());
  }
}

}  // namespace optim
}  // namespace torchext

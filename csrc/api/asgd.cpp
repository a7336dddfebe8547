// torchext::optim::ASGD (LibTorch). The update itself is the registered
// torchext::asgd_ op, called through the dispatcher exactly as Python calls
// torch.ops.torchext.asgd_.
#include <torchext/optim/asgd.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <torch/autograd.h>

#include <map>
#include <unordered_set>

namespace torchext {
namespace optim {
namespace {

using torch::optim::OptimizerParamGroup;

struct DeviceLess {
  bool operator()(const c10::Device& a, const c10::Device& b) const {
    return std::make_pair(static_cast<int>(a.type()), static_cast<int>(a.index())) <
           std::make_pair(static_cast<int>(b.type()), static_cast<int>(b.index()));
  }
};

using AsgdOp = void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                    at::TensorList, at::TensorList, double, double, double, double, double,
                    bool, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&);

const c10::TypedOperatorHandle<AsgdOp>& asgd_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "").typed<AsgdOp>();
  return op;
}

// Same rule as torch.optim: float64 state when the default dtype is float64.
at::ScalarType scalar_state_dtype() {
  return c10::typeMetaToScalarType(at::get_default_dtype()) == at::kDouble ? at::kDouble
                                                                           : at::kFloat;
}

bool fused_device(const c10::Device& d) { return d.is_cpu() || d.is_cuda(); }

// The tensor-op form of the same update (torch.optim.ASGD's capturable
// for-loop path): runs anywhere, never syncs. grad_scale/found_inf follow
// the fused op's contract.
void reference_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                    const std::vector<at::Tensor>& axs, const std::vector<at::Tensor>& mus,
                    const std::vector<at::Tensor>& etas, const std::vector<at::Tensor>& steps,
                    const ASGDOptions& o, const at::Tensor* grad_scale,
                    const at::Tensor* found_inf) {
  for (const auto i : c10::irange(params.size())) {
    at::Tensor param = params[i], ax = axs[i], grad = grads[i];
    const at::Tensor &mu = mus[i], &eta = etas[i], &step = steps[i];
    const auto dev = param.device();
    std::vector<at::Tensor> olds;
    if (found_inf != nullptr) {
      olds = {param.clone(), ax.clone(), mu.clone(), eta.clone(), step.clone()};
    }
    if (grad_scale != nullptr && grad_scale->defined()) {
      grad = grad * grad_scale->to(dev).to(at::kDouble).reciprocal().to(at::kFloat);
    }
    if (o.maximize()) grad = -grad;
    if (param.is_complex()) {
      grad = at::view_as_real(grad);
      param = at::view_as_real(param);
      ax = at::view_as_real(ax);
    }
    step.add_(1);
    if (o.weight_decay() != 0) grad = grad.add(param, o.weight_decay());
    param.mul_(1 - o.lambd() * eta);
    param.addcmul_(grad, eta, -1);
    ax.add_(param.sub(ax).mul_(mu));
    const double lr = o.lr();
    eta.copy_(lr / (1 + o.lambd() * lr * step.to(at::kDouble)).pow(o.alpha()));
    mu.copy_(1 / at::maximum(step - o.t0(), at::ones_like(step)));
    if (found_inf != nullptr) {
      const auto skip = found_inf->to(dev) != 0;
      const std::vector<at::Tensor> news = {params[i], axs[i], mu, eta, step};
      for (const auto k : c10::irange(news.size())) {
        news[k].copy_(at::where(skip, olds[k], news[k]));
      }
    }
  }
}

}  // namespace

// ---- ASGDOptions -------------------------------------------------------

ASGDOptions::ASGDOptions(double lr) : lr_(lr) {}

bool operator==(const ASGDOptions& lhs, const ASGDOptions& rhs) {
  return lhs.lr() == rhs.lr() && lhs.lambd() == rhs.lambd() && lhs.alpha() == rhs.alpha() &&
         lhs.t0() == rhs.t0() && lhs.weight_decay() == rhs.weight_decay() &&
         lhs.maximize() == rhs.maximize() && lhs.capturable() == rhs.capturable() &&
         lhs.fused() == rhs.fused();
}

void ASGDOptions::validate() const {
  TORCH_CHECK_VALUE(lr() >= 0.0, "ASGD: invalid learning rate: ", lr(), " (must be >= 0)");
  TORCH_CHECK_VALUE(lambd() >= 0.0, "ASGD: invalid lambd value: ", lambd(), " (must be >= 0)");
  TORCH_CHECK_VALUE(alpha() >= 0.0, "ASGD: invalid alpha value: ", alpha(), " (must be >= 0)");
  TORCH_CHECK_VALUE(weight_decay() >= 0.0, "ASGD: invalid weight_decay value: ", weight_decay(),
                    " (must be >= 0)");
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
}

double ASGDOptions::get_lr() const { return lr(); }
void ASGDOptions::set_lr(const double lr) { this->lr(lr); }

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
                  "on CPU or CUDA devices, params[", i, "] is on ", p.device());
    }
  }
  param_groups_.emplace_back(param_group.params(), std::move(options));
}

torch::Tensor ASGD::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_impl(nullptr, nullptr);
  return loss;
}

void ASGD::step_with_amp(const torch::Tensor& grad_scale, const torch::Tensor& found_inf) {
  TORCH_CHECK(found_inf.defined(), "ASGD.step_with_amp: found_inf must be a defined tensor");
  step_impl(grad_scale.defined() ? &grad_scale : nullptr, &found_inf);
}

void ASGD::step_impl(const torch::Tensor* grad_scale, const torch::Tensor* found_inf) {
  TORCH_CHECK(!averaged_in_, "ASGD.step: the parameters hold their averages (an "
              "AveragedParameters guard is alive); step after it goes out of scope");
  at::NoGradGuard no_grad;
  // Check every gradient before anything changes (the op checks again).
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      const auto& g = p.grad();
      if (!g.defined()) continue;
      TORCH_CHECK(!g.is_sparse(), "ASGD does not support sparse gradients");
      TORCH_CHECK_TYPE(at::isFloatingType(p.scalar_type()) || at::isComplexType(p.scalar_type()),
                       "ASGD.step: a parameter has unsupported dtype ", p.scalar_type(),
                       " (floating point and complex only)");
      TORCH_CHECK_VALUE(g.sizes() == p.sizes(), "ASGD.step: a gradient has shape ", g.sizes(),
                        " but its parameter has shape ", p.sizes());
      TORCH_CHECK_TYPE(g.scalar_type() == p.scalar_type(), "ASGD.step: a gradient has dtype ",
                       g.scalar_type(), " but its parameter has dtype ", p.scalar_type());
      TORCH_CHECK(g.device() == p.device(), "ASGD.step: a gradient is on ", g.device(),
                  " but its parameter is on ", p.device());
    }
  }
  if (grad_scale != nullptr) {
    TORCH_CHECK_TYPE(grad_scale->scalar_type() == at::kFloat && grad_scale->numel() == 1,
                     "ASGD.step_with_amp: grad_scale must be a 1-element float32 tensor");
  }
  if (found_inf != nullptr) {
    TORCH_CHECK_TYPE(found_inf->scalar_type() == at::kFloat && found_inf->numel() == 1,
                     "ASGD.step_with_amp: found_inf must be a 1-element float32 tensor");
  }
  const auto sdtype = scalar_state_dtype();
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const ASGDOptions&>(group.options());
    std::vector<at::Tensor> params, grads, axs, mus, etas, steps;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {  // lazily, as Python: step=0, eta=lr, mu=1, ax=zeros_like(p)
        auto st = std::make_unique<ASGDParamState>();
        const auto opts = at::TensorOptions().dtype(sdtype).device(p.device());
        st->step(at::zeros({}, opts));
        st->eta(at::full({}, o.lr(), opts));
        st->mu(at::ones({}, opts));
        st->ax(at::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<ASGDParamState&>(*slot);
      params.push_back(p);
      grads.push_back(p.grad());
      axs.push_back(st.ax());
      mus.push_back(st.mu());
      etas.push_back(st.eta());
      steps.push_back(st.step());
    }
    if (params.empty()) continue;
    bool all_fused_devices = true;
    for (const auto& p : params) all_fused_devices = all_fused_devices && fused_device(p.device());
    const bool fused = o.fused().value_or(all_fused_devices);
    if (!fused) {
      reference_step(params, grads, axs, mus, etas, steps, o, grad_scale, found_inf);
      continue;
    }
    // One op call per device (the op itself groups by dtype).
    std::map<c10::Device, std::vector<size_t>, DeviceLess> by_device;
    for (const auto i : c10::irange(params.size())) by_device[params[i].device()].push_back(i);
    for (const auto& [device, idx] : by_device) {
      auto pick = [&](const std::vector<at::Tensor>& xs) {
        if (by_device.size() == 1) return xs;
        std::vector<at::Tensor> out;
        out.reserve(idx.size());
        for (auto i : idx) out.push_back(xs[i]);
        return out;
      };
      std::optional<at::Tensor> gs, fi;
      if (grad_scale != nullptr) gs = grad_scale->to(device, /*non_blocking=*/true);
      if (found_inf != nullptr) fi = found_inf->to(device, /*non_blocking=*/true);
      asgd_op().call(pick(params), pick(grads), pick(axs), pick(mus), pick(etas), pick(steps),
                     o.lr(), o.lambd(), o.alpha(), o.t0(), o.weight_decay(), o.maximize(), gs,
                     fi);
    }
  }
}

void ASGD::save(torch::serialize::OutputArchive& archive) const {
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
  const auto sdtype = scalar_state_dtype();
  for (const auto gi : c10::irange(scratch.param_groups_.size())) {
    const auto& g = scratch.param_groups_[gi];
    static_cast<const ASGDOptions&>(g.options()).validate();
    for (const auto pi : c10::irange(g.params().size())) {
      const auto& p = g.params()[pi];
      auto it = scratch.state_.find(p.unsafeGetTensorImpl());
      if (it == scratch.state_.end()) continue;
      auto& st = static_cast<ASGDParamState&>(*it->second);
      const auto where = [&] {
        return c10::str("param_groups[", gi, "].params[", pi, "]");
      };
      TORCH_CHECK_VALUE(st.ax().defined() && st.step().defined() && st.eta().defined() &&
                            st.mu().defined(),
                        "ASGD.load: the state of ", where(), " lacks step, eta, mu or ax");
      TORCH_CHECK_VALUE(st.ax().sizes() == p.sizes(), "ASGD.load: 'ax' of ", where(),
                        " has shape ", st.ax().sizes(), " but the parameter has shape ",
                        p.sizes());
      for (const auto* t : {&st.step(), &st.eta(), &st.mu()}) {
        TORCH_CHECK_VALUE(t->numel() == 1 && at::isFloatingType(t->scalar_type()),
                          "ASGD.load: step, eta and mu of ", where(),
                          " must be 1-element floating tensors");
      }
      auto scalar = [&](const at::Tensor& t) {
        const auto dt = t.scalar_type() == at::kDouble ? at::kDouble : sdtype;
        return t.to(p.device(), dt, /*non_blocking=*/false, /*copy=*/true).reshape({});
      };
      st.step(scalar(st.step()));
      st.eta(scalar(st.eta()));
      st.mu(scalar(st.mu()));
      st.ax(st.ax().to(p.device(), p.scalar_type(), false, true));
    }
  }
  state_ = std::move(scratch.state_);
  for (const auto gi : c10::irange(param_groups_.size())) {
    param_groups_[gi].set_options(scratch.param_groups_[gi].options().clone());
  }
}

}  // namespace optim
}  // namespace torchext

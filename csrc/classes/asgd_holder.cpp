// torch.classes.torchext.ASGDHolder: the lists of one slot group of
// torchext.optim.ASGD (its params on one device with one t0), held on the
// C++ side between eager steps.
//
// Why: with thousands of small tensors a step's cost is per tensor, and most
// of it was Python handing lists to the dispatcher, each tensor converted on
// its own. The optimizer owns its state from creation (step/eta/mu packed in
// one 1-D tensor each, the state entries views of their elements); the
// holder keeps the params, their axs and the packed tensors as the op takes them, and
// a step only reads each param's .grad here and calls torchext::asgd_.packed
// through the dispatcher, so validation, kernels and autograd bookkeeping
// are exactly those of a call from Python. It has no rules of its own: the
// optimizer (torchext/optim/_state.py) makes a new holder whenever it
// rebuilds the slot group, and never uses one while torch.compile traces.
#include "../ops/asgd_args.h"
#include "../utils/prefetch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/zeros.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <tuple>
#include <vector>

namespace torchext {
namespace {

struct ASGDHolder : torch::CustomClassHolder {
  // The params, read for their .grad.
  const std::vector<at::Tensor> param_vec;
  // Made once, as the op's kernels take them (a c10::List is pushed as one
  // reference): no held tensor is converted or refcounted per step; only
  // grads are refilled.
  c10::List<at::Tensor> params, axs;  // axs[i] undefined: params[i] has no state yet
  c10::List<at::Tensor> grads;  // undefined where a param has no grad: left alone
  at::Tensor mus, etas, steps;  // packed: element i belongs to params[i]
  // The op's rounding_* arguments (stochastic rounding), kept as pushed.
  ASGDRoundingArgs rounding;

  ASGDHolder(std::vector<at::Tensor> params_, std::vector<std::optional<at::Tensor>> axs_,
             at::Tensor mus_, at::Tensor etas_, at::Tensor steps_)
      : param_vec(params_),
        mus(std::move(mus_)), etas(std::move(etas_)), steps(std::move(steps_)) {
    TORCH_CHECK(axs_.size() == param_vec.size(), "ASGDHolder: one ax per param");
    params.reserve(param_vec.size());
    axs.reserve(param_vec.size());
    for (auto& p : params_) params.push_back(std::move(p));
    for (auto& ax : axs_) axs.push_back(ax.has_value() ? *ax : at::Tensor());
    grads.reserve(param_vec.size());
  }

  // Stochastic rounding on (a seed, and per param its id and offset: the
  // op's rounding_* arguments) or off (no seed).
  void set_rounding(std::optional<int64_t> seed, std::optional<std::vector<int64_t>> ids,
                    std::optional<std::vector<int64_t>> offsets) {
    rounding.seed = seed;
    rounding.ids = ids.has_value() ? c10::IValue(c10::List<int64_t>(*ids)) : c10::IValue();
    rounding.offsets =
        offsets.has_value() ? c10::IValue(c10::List<int64_t>(*offsets)) : c10::IValue();
  }

  void set_ax(int64_t i, const std::optional<at::Tensor>& ax) {
    axs.set(i, ax.has_value() ? *ax : at::Tensor());
  }

  // Fills `grads` with every param's current .grad (None where it has
  // none) and returns the indices of params that have a grad but no state.
  std::vector<int64_t> gather_grads() {
    grads.clear();
    std::vector<int64_t> missing;
    const std::vector<at::Tensor>& ps = param_vec;
    const size_t n = ps.size();
    for (size_t i = 0; i < n; ++i) {
      // .grad is three dependent loads per param (TensorImpl, AutogradMeta,
      // the grad's TensorImpl): ask for later params' ones early (prefetch.h).
      if (i + 2 * kPrefetchImpl < n) prefetch_impl(ps[i + 2 * kPrefetchImpl].unsafeGetTensorImpl());
      if (i + kPrefetchImpl < n) {
        if (const auto* meta = ps[i + kPrefetchImpl].unsafeGetTensorImpl()->autograd_meta()) {
          prefetch_lines(meta, 64);
        }
      }
      const at::Tensor& g = ps[i].grad();
      if (g.defined()) {
        grads.push_back(g);
        if (!axs.get(i).defined()) missing.push_back(static_cast<int64_t>(i));
      } else {
        grads.push_back(at::Tensor());
      }
    }
    return missing;
  }

  // Between calls (also after one that raised) the holder holds no grad.
  struct HoldNothing {
    ASGDHolder* holder;
    ~HoldNothing() { holder->grads.clear(); }
  };

  // One step of asgd_.packed over the held lists with every param's current
  // .grad. `hyper`: the op's hyperparameters in schema order (Python's
  // _op.hyper_list; read by ASGDHyperparams::from_values, asgd_args.h).
  // validate_only: the op's Meta kernel (its validation alone, which writes
  // nothing) on the real tensors. Returns the indices of params that have a
  // grad but no state yet, having done nothing, when there are some (the
  // optimizer creates their state, then calls again); an empty list when
  // the call ran.
  std::vector<int64_t> run(bool validate_only, const at::Tensor& lr, const std::vector<double>& hyper,
                           const std::optional<at::Tensor>& grad_scale,
                           const std::optional<at::Tensor>& found_inf,
                           const std::optional<at::Tensor>& clip_coef) {
    const HoldNothing after{this};
    auto missing = gather_grads();
    if (!missing.empty()) return missing;
    auto stack = asgd_stack(params, grads, axs, mus, etas, steps, lr,
                            ASGDHyperparams::from_values(hyper), grad_scale, found_inf,
                            clip_coef, rounding);
    const c10::OperatorHandle& op = asgd_op(ASGDState::kPacked);
    if (validate_only) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
    } else {
      op.callBoxed(&stack);
    }
    return {};
  }

  // Refuses an fp16 grad unless allow_fp16: GradScaler's rule for the
  // gradients torch's recipe unscales in place (unscale_'s own error).
  static void check_fp16(const at::Tensor& g, bool allow_fp16) {
    TORCH_CHECK_VALUE(allow_fp16 || g.scalar_type() != at::kHalf,
                      "Attempting to unscale FP16 gradients.");
  }

  // GradScaler's read-only inf/NaN check of the held params' grads
  // (torchext::check_finite_ into found_inf), without a list from Python.
  // Without a found_inf it makes one (0-d float32 zero on the params'
  // device; cheaper here than a torch.zeros from Python). Returns found_inf,
  // or (no found_inf given and no param has a grad) None: no check was
  // recorded, as torch's unscale_ records none for no grads.
  std::optional<at::Tensor> check_finite(const std::optional<at::Tensor>& found_inf_,
                                         bool allow_fp16) {
    c10::List<at::Tensor> present;
    present.reserve(param_vec.size());
    for (const auto& p : param_vec) {
      const at::Tensor& g = p.grad();
      if (g.defined()) {
        check_fp16(g, allow_fp16);
        present.push_back(g);
      }
    }
    if (present.empty() && !found_inf_.has_value()) return std::nullopt;
    const at::Tensor found_inf = found_inf_.has_value()
        ? *found_inf_
        : at::zeros({}, present.get(0).options().dtype(at::kFloat));
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("torchext::check_finite_", "");
    torch::jit::Stack stack;
    torch::jit::push(stack, std::move(present), found_inf);
    op.callBoxed(&stack);
    return found_inf;
  }

  // The clip's one read of the held params' grads (torchext::tensor_norms),
  // without a list from Python: their norms (of the unscaled grads with
  // inv_scale) and, when `check`, the inf/NaN check into found_inf (made
  // here, as check_finite does, when none is passed). Returns
  // [norms, found_inf] ([norms] without the check; [] when no param has a
  // grad).
  std::vector<at::Tensor> norms(
      double ord, const std::optional<at::Tensor>& inv_scale,
      const std::optional<at::Tensor>& found_inf_, bool check, bool allow_fp16) {
    c10::List<at::Tensor> present;
    present.reserve(param_vec.size());
    for (const auto& p : param_vec) {
      const at::Tensor& g = p.grad();
      if (g.defined()) {
        check_fp16(g, allow_fp16);
        present.push_back(g);
      }
    }
    if (present.empty()) return {};
    std::optional<at::Tensor> found_inf;
    if (check) {
      found_inf = found_inf_.has_value()
          ? *found_inf_
          : at::zeros({}, present.get(0).options().dtype(at::kFloat));
    }
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("torchext::tensor_norms", "");
    torch::jit::Stack stack;
    torch::jit::push(stack, std::move(present), ord, inv_scale, found_inf);
    op.callBoxed(&stack);
    std::vector<at::Tensor> out{stack.back().toTensor()};
    if (found_inf) out.push_back(*found_inf);
    return out;
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchext, m) {
  m.class_<ASGDHolder>("ASGDHolder")
      .def(torch::init<std::vector<at::Tensor>, std::vector<std::optional<at::Tensor>>,
                       at::Tensor, at::Tensor, at::Tensor>())
      .def("set_ax", &ASGDHolder::set_ax)
      .def("set_rounding", &ASGDHolder::set_rounding)
      .def("run", &ASGDHolder::run)
      .def("check_finite", &ASGDHolder::check_finite)
      .def("norms", &ASGDHolder::norms);
}

}  // namespace torchext

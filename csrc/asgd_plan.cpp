// torch.classes.torchext.ASGDPlan: one parameter group's lists, held on the
// C++ side between eager steps of torchext.optim.ASGD.
//
// Why: with thousands of small tensors the step's cost is per tensor, and
// most of it was Python handing six lists (params, grads, axs, mus, etas,
// steps) to the dispatcher at every step, each tensor converted on its own.
// The plan keeps params and axs once, and step/eta/mu packed into one 1-D
// tensor each (the optimizer's state entries are views of their elements);
// a step reads each param's .grad here and calls torchext::asgd_.packed
// through the dispatcher, so the validation, kernels and autograd
// bookkeeping are exactly those of a call from Python. The Python side
// (ASGD._GroupPlan) decides when a plan still holds (same params, same state
// tensors) and never uses one while torch.compile traces.
#include "asgd_args.h"
#include "prefetch.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace torchext {
namespace {

// The lists are held boxed (c10::List, what the dispatcher passes to the
// boxed kernels): a call pushes each list as one IValue, so no tensor of a
// held list is converted or refcounted per step; only grads are refilled.
c10::List<at::Tensor> boxed(std::vector<at::Tensor> ts) {
  c10::List<at::Tensor> l;
  l.reserve(ts.size());
  for (auto& t : ts) l.push_back(std::move(t));
  return l;
}

struct ASGDPlan : torch::CustomClassHolder {
  std::vector<at::Tensor> param_vec;  // the params, read for their .grad
  c10::List<at::Tensor> params, grads, axs;
  at::Tensor mus, etas, steps;  // packed: element i belongs to params[i]
  torch::jit::Stack stack;

  ASGDPlan(std::vector<at::Tensor> params_, std::vector<at::Tensor> axs_, at::Tensor mus_,
           at::Tensor etas_, at::Tensor steps_)
      : param_vec(params_),
        params(boxed(std::move(params_))),
        axs(boxed(std::move(axs_))),
        mus(std::move(mus_)),
        etas(std::move(etas_)),
        steps(std::move(steps_)) {
    grads.reserve(params.size());
    stack.reserve(kASGDNumArgs);
  }

  // Fills `grads` with every param's current .grad; false (and empty) when
  // a param has none.
  bool gather_grads() {
    grads.clear();
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
      if (!g.defined()) {
        grads.clear();
        return false;
      }
      grads.push_back(g);
    }
    return true;
  }

  // GradScaler's read-only inf/NaN check of the group's grads
  // (torchext::check_finite_ into found_inf), without a list from Python.
  // False, having done nothing, when a param has no grad.
  bool check_finite(const at::Tensor& found_inf) {
    if (!gather_grads()) return false;
    const HoldNothing after{this};
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("torchext::check_finite_", "");
    torch::jit::push(stack, grads, found_inf);
    op.callBoxed(&stack);
    return true;
  }

  // Between calls (also after one that raised) the plan holds no grad.
  struct HoldNothing {
    ASGDPlan* plan;
    ~HoldNothing() {
      plan->stack.clear();
      plan->grads.clear();
    }
  };

  // One step of asgd_.packed over the held lists with every param's current
  // .grad. validate_only: the op's Meta kernel (its validation alone, which
  // writes nothing) on the real tensors. Returns false, having done
  // nothing, when a param has no grad: the caller then takes the general
  // path.
  bool run(bool validate_only, const std::optional<at::Tensor>& lr_tensor, double lr,
           double lambd, double alpha, double t0, double weight_decay, bool maximize,
           const std::optional<at::Tensor>& grad_scale,
           const std::optional<at::Tensor>& found_inf) {
    if (!gather_grads()) return false;
    const HoldNothing after{this};
    torch::jit::push(stack, params, grads, axs, mus, etas, steps);
    if (lr_tensor.has_value()) {
      torch::jit::push(stack, *lr_tensor);
    } else {
      torch::jit::push(stack, lr);
    }
    torch::jit::push(stack, lambd, alpha, t0, weight_decay, maximize, grad_scale, found_inf);
    const c10::OperatorHandle& op = asgd_packed_op(lr_tensor.has_value());
    if (validate_only) {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &stack);
    } else {
      op.callBoxed(&stack);
    }
    return true;
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchext, m) {
  m.class_<ASGDPlan>("ASGDPlan")
      .def(torch::init<std::vector<at::Tensor>, std::vector<at::Tensor>, at::Tensor, at::Tensor,
                       at::Tensor>())
      .def("run", &ASGDPlan::run)
      .def("check_finite", &ASGDPlan::check_finite);
}

}  // namespace torchext

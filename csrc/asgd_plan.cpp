// torch.classes.torchext.ASGDPlan: one parameter group's lists, held on the
// C++ side between eager steps of torchext.optim.ASGD.
//
// Why: with thousands of small tensors the step's cost is per tensor, and
// most of it was Python handing six lists (params, grads, axs, mus, etas,
// steps) to the dispatcher at every step, each tensor converted on its own.
// The plan keeps params and state once; a step reads each param's .grad here
// and calls the same torchext::asgd_ op through the dispatcher, so the
// validation, kernels and autograd bookkeeping are exactly those of a call
// from Python. The Python side (ASGD._GroupPlan) decides when a plan still
// holds (same params, same state tensors) and never uses one while
// torch.compile traces.
#include "asgd_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace torchext {
namespace {

struct ASGDPlan : torch::CustomClassHolder {
  std::vector<at::Tensor> params, grads, axs, mus, etas, steps;

  ASGDPlan(std::vector<at::Tensor> params_, std::vector<at::Tensor> axs_,
           std::vector<at::Tensor> mus_, std::vector<at::Tensor> etas_,
           std::vector<at::Tensor> steps_)
      : params(std::move(params_)),
        axs(std::move(axs_)),
        mus(std::move(mus_)),
        etas(std::move(etas_)),
        steps(std::move(steps_)) {
    grads.reserve(params.size());
  }

  // One step of asgd_ over the held lists with every param's current .grad.
  // validate_only: the op's Meta kernel (its validation alone, which writes
  // nothing) on the real tensors. Returns false, having done nothing, when a
  // param has no grad: the caller then takes the general path.
  bool run(bool validate_only, const std::optional<at::Tensor>& lr_tensor, double lr,
           double lambd, double alpha, double t0, double weight_decay, bool maximize,
           const std::optional<at::Tensor>& grad_scale,
           const std::optional<at::Tensor>& found_inf) {
    grads.clear();
    for (const auto& p : params) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) return false;
      grads.push_back(g);
    }
    const auto& float_lr = asgd_op();
    const auto& tensor_lr = asgd_tensor_lr_op();
    const c10::DispatchKeySet meta(c10::DispatchKey::Meta);
    if (lr_tensor.has_value()) {
      if (validate_only) {
        tensor_lr.redispatch(meta, params, grads, axs, mus, etas, steps, *lr_tensor, lambd, alpha,
                             t0, weight_decay, maximize, grad_scale, found_inf);
      } else {
        tensor_lr.call(params, grads, axs, mus, etas, steps, *lr_tensor, lambd, alpha, t0,
                       weight_decay, maximize, grad_scale, found_inf);
      }
    } else if (validate_only) {
      float_lr.redispatch(meta, params, grads, axs, mus, etas, steps, lr, lambd, alpha, t0,
                          weight_decay, maximize, grad_scale, found_inf);
    } else {
      float_lr.call(params, grads, axs, mus, etas, steps, lr, lambd, alpha, t0, weight_decay,
                    maximize, grad_scale, found_inf);
    }
    grads.clear();  // hold no grad between steps
    return true;
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchext, m) {
  m.class_<ASGDPlan>("ASGDPlan")
      .def(torch::init<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                       std::vector<at::Tensor>, std::vector<at::Tensor>>())
      .def("run", &ASGDPlan::run);
}

}  // namespace torchext

#include "asgd_args.h"

#include <utility>

namespace torchext {

namespace {

void* element_ptr(const at::Tensor& packed, size_t i) {
  return static_cast<char*>(packed.data_ptr()) + i * packed.element_size();
}

}  // namespace

const c10::OperatorHandle& asgd_op(ASGDState state) {
  static const auto lists =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "");
  static const auto packed =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "packed");
  return state == ASGDState::kPacked ? packed : lists;
}

torch::jit::Stack asgd_stack(c10::IValue params, c10::IValue grads, c10::IValue axs,
                             c10::IValue mus, c10::IValue etas, c10::IValue steps,
                             const at::Tensor& lr, const ASGDHyperparams& h,
                             const std::optional<at::Tensor>& grad_scale,
                             const std::optional<at::Tensor>& found_inf) {
  torch::jit::Stack stack;
  stack.reserve(14);
  torch::jit::push(stack, std::move(params), std::move(grads), std::move(axs), std::move(mus),
                   std::move(etas), std::move(steps), lr, h.lambd, h.alpha, h.t0,
                   h.weight_decay, h.maximize, grad_scale, found_inf);
  return stack;
}

ASGDArgs asgd_args(TensorRefs params, TensorRefs grads, TensorRefs axs, const at::Tensor& lr,
                   const ASGDHyperparams& hyper, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf) {
  ASGDArgs a;
  static_cast<ASGDHyperparams&>(a) = hyper;
  a.params = std::move(params);
  a.grads = std::move(grads);
  a.axs = std::move(axs);
  a.lr = lr;
  a.grad_scale = grad_scale;
  a.found_inf = found_inf;
  return a;
}

void* ASGDArgs::mu_ptr(size_t i) const {
  return packed() ? element_ptr(packed_mus, i) : mus[i].data_ptr();
}
void* ASGDArgs::eta_ptr(size_t i) const {
  return packed() ? element_ptr(packed_etas, i) : etas[i].data_ptr();
}
void* ASGDArgs::step_ptr(size_t i) const {
  return packed() ? element_ptr(packed_steps, i) : steps[i].data_ptr();
}

}  // namespace torchext

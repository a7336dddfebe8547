#include "asgd_args.h"

namespace torchext {

namespace {

void* element_ptr(const at::Tensor& packed, size_t i) {
  return static_cast<char*>(packed.data_ptr()) + i * packed.element_size();
}

}  // namespace

const c10::TypedOperatorHandle<ASGDListsFn>& asgd_lists_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchext::asgd_", "")
                             .typed<ASGDListsFn>();
  return op;
}

const c10::TypedOperatorHandle<ASGDPackedFn>& asgd_packed_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchext::asgd_", "packed")
                             .typed<ASGDPackedFn>();
  return op;
}

ASGDArgs asgd_args(const TensorListArg& params, const TensorListArg& grads,
                   const TensorListArg& axs, const at::Tensor& lr, const ASGDHyperparams& hyper,
                   const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf) {
  ASGDArgs a;
  static_cast<ASGDHyperparams&>(a) = hyper;
  a.params = TensorRefs(params);
  a.grads = TensorRefs(grads);
  a.axs = TensorRefs(axs);
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

#include "asgd_stack.h"

#include <c10/util/Exception.h>

#include <utility>

namespace torchext {

namespace {

// Where each argument sits in the schema, looked up by name once.
struct ArgIndex {
  size_t params, grads, axs, mus, etas, steps, lr, grad_scale, found_inf;
#define TORCHEXT_ASGD_INDEX(name, type, schema_type) size_t name;
  TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_INDEX)
#undef TORCHEXT_ASGD_INDEX
  size_t num_args;

  explicit ArgIndex(const c10::FunctionSchema& s) {
    const auto at = [&](const char* name) {
      const auto i = s.argumentIndexWithName(name);
      TORCH_INTERNAL_ASSERT(i.has_value(), "asgd_ has no argument '", name, "'");
      return static_cast<size_t>(*i);
    };
    params = at("params");
    grads = at("grads");
    axs = at("axs");
    mus = at("mus");
    etas = at("etas");
    steps = at("steps");
    lr = at("lr");
    grad_scale = at("grad_scale");
    found_inf = at("found_inf");
#define TORCHEXT_ASGD_LOOKUP(name, type, schema_type) name = at(#name);
    TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_LOOKUP)
#undef TORCHEXT_ASGD_LOOKUP
    num_args = s.arguments().size();
  }
};

const ArgIndex& arg_index() {
  // Both overloads come from asgd_schema(): same names, same positions.
  static const ArgIndex index(asgd_op(ASGDState::kLists).schema());
  return index;
}

void* element_ptr(const at::Tensor& packed, size_t i) {
  return static_cast<char*>(packed.data_ptr()) + i * packed.element_size();
}

}  // namespace

size_t asgd_num_args() { return arg_index().num_args; }

ASGDArgs asgd_args_from_stack(const c10::OperatorHandle&, const torch::jit::Stack& stack) {
  const ArgIndex& ix = arg_index();
  TORCH_INTERNAL_ASSERT(stack.size() >= ix.num_args);
  const c10::IValue* v = stack.data() + (stack.size() - ix.num_args);
  ASGDArgs a;
  a.params = TensorRefs(v[ix.params].toListRef());
  a.grads = TensorRefs(v[ix.grads].toListRef());
  a.axs = TensorRefs(v[ix.axs].toListRef());
  if (v[ix.steps].isTensor()) {  // asgd_.packed
    a.packed_mus = v[ix.mus].toTensor();
    a.packed_etas = v[ix.etas].toTensor();
    a.packed_steps = v[ix.steps].toTensor();
  } else {
    a.mus = TensorRefs(v[ix.mus].toListRef());
    a.etas = TensorRefs(v[ix.etas].toListRef());
    a.steps = TensorRefs(v[ix.steps].toListRef());
  }
  a.lr = v[ix.lr].toTensor();
#define TORCHEXT_ASGD_DECODE(name, type, schema_type) a.name = v[ix.name].to<type>();
  TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_DECODE)
#undef TORCHEXT_ASGD_DECODE
  a.grad_scale = v[ix.grad_scale].toOptional<at::Tensor>();
  a.found_inf = v[ix.found_inf].toOptional<at::Tensor>();
  return a;
}

void push_asgd_args(torch::jit::Stack& stack, c10::IValue params, c10::IValue grads,
                    c10::IValue axs, c10::IValue mus, c10::IValue etas, c10::IValue steps,
                    const at::Tensor& lr, const ASGDHyperparams& hyper,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf) {
  // The order of asgd_schema(); arg_index() checks the names at first use.
  torch::jit::push(stack, std::move(params), std::move(grads), std::move(axs), std::move(mus),
                   std::move(etas), std::move(steps), lr);
#define TORCHEXT_ASGD_PUSH(name, type, schema_type) torch::jit::push(stack, hyper.name);
  TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_PUSH)
#undef TORCHEXT_ASGD_PUSH
  torch::jit::push(stack, grad_scale, found_inf);
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

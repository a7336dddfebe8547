#include "asgd_args.h"
#include "torchext/elementwise_math.h"

#include <c10/util/StringUtil.h>

#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace torchext {

namespace {

void* element_ptr(const at::Tensor& packed, size_t i) {
  return static_cast<char*>(packed.data_ptr()) + i * packed.element_size();
}

// ASGDHyperparams' order is the schema's: the names of the keyword-only
// scalars between lr and grad_scale, checked once per overload.
c10::OperatorHandle checked_asgd_op(const char* overload) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", overload);
  std::vector<std::string> names;
  for (const auto& a : op.schema().arguments()) {
    if (a.kwarg_only() && a.name() != "lr" && a.name() != "grad_scale" &&
        a.name() != "found_inf" && a.name() != "clip_coef" &&
        a.name().rfind("rounding_", 0) != 0) {
      names.push_back(a.name());
    }
  }
  const std::vector<std::string> ours(std::begin(ASGDHyperparams::kNames),
                                      std::end(ASGDHyperparams::kNames));
  TORCH_CHECK(names == ours, "torchext::asgd_", *overload ? "." : "", overload,
              ": the schema's hyperparameters (", c10::Join(", ", names),
              ") are not ASGDHyperparams' (", c10::Join(", ", ours), ")");
  return op;
}

}  // namespace

const c10::OperatorHandle& asgd_op(ASGDState state) {
  static const auto lists = checked_asgd_op("");
  static const auto packed = checked_asgd_op("packed");
  return state == ASGDState::kPacked ? packed : lists;
}

ASGDHyperparams ASGDHyperparams::from_values(const std::vector<double>& v) {
  constexpr size_t n = std::size(kNames);
  TORCH_CHECK(v.size() == n, "asgd_: expected ", n, " hyperparameters (",
              c10::Join(", ", std::vector<std::string>(std::begin(kNames), std::end(kNames))),
              "), got ", v.size());
  return {v[0], v[1], v[2], v[3], v[4] != 0.0};
}

torch::jit::Stack asgd_stack(c10::IValue params, c10::IValue grads, c10::IValue axs,
                             c10::IValue mus, c10::IValue etas, c10::IValue steps,
                             const at::Tensor& lr, const ASGDHyperparams& h,
                             const std::optional<at::Tensor>& grad_scale,
                             const std::optional<at::Tensor>& found_inf,
                             const std::optional<at::Tensor>& clip_coef,
                             const ASGDRoundingArgs& rounding) {
  torch::jit::Stack stack;
  stack.reserve(18);
  torch::jit::push(stack, std::move(params), std::move(grads), std::move(axs), std::move(mus),
                   std::move(etas), std::move(steps), lr, h.lambd, h.alpha, h.t0,
                   h.weight_decay, h.maximize, grad_scale, found_inf, clip_coef,
                   rounding.seed, rounding.ids, rounding.offsets);
  return stack;
}

ASGDArgs asgd_args(TensorRefs params, TensorRefs grads, TensorRefs axs, const at::Tensor& lr,
                   const ASGDHyperparams& hyper, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf,
                   const std::optional<at::Tensor>& clip_coef) {
  ASGDArgs a;
  static_cast<ASGDHyperparams&>(a) = hyper;
  a.params = std::move(params);
  a.grads = std::move(grads);
  a.axs = std::move(axs);
  a.lr = lr;
  a.grad_scale = grad_scale;
  a.found_inf = found_inf;
  a.clip_coef = clip_coef;
  return a;
}

ASGDArgs asgd_args(TensorRefs params, TensorRefs grads, TensorRefs axs, TensorRefs mus,
                   TensorRefs etas, TensorRefs steps, const at::Tensor& lr,
                   const ASGDHyperparams& hyper, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf,
                   const std::optional<at::Tensor>& clip_coef) {
  ASGDArgs a = asgd_args(std::move(params), std::move(grads), std::move(axs), lr, hyper,
                         grad_scale, found_inf, clip_coef);
  a.mus = std::move(mus);
  a.etas = std::move(etas);
  a.steps = std::move(steps);
  return a;
}

ASGDArgs asgd_args(TensorRefs params, TensorRefs grads, TensorRefs axs, const at::Tensor& mus,
                   const at::Tensor& etas, const at::Tensor& steps, const at::Tensor& lr,
                   const ASGDHyperparams& hyper, const std::optional<at::Tensor>& grad_scale,
                   const std::optional<at::Tensor>& found_inf,
                   const std::optional<at::Tensor>& clip_coef) {
  ASGDArgs a = asgd_args(std::move(params), std::move(grads), std::move(axs), lr, hyper,
                         grad_scale, found_inf, clip_coef);
  a.packed_mus = mus;
  a.packed_etas = etas;
  a.packed_steps = steps;
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
uint64_t ASGDArgs::rounding_stream(size_t i) const {
  const int64_t id = rounding_ids.has_value() ? (*rounding_ids)[i] : static_cast<int64_t>(i);
  return math::sr_stream(rounding_seed.value_or(0), id);
}

}  // namespace torchext

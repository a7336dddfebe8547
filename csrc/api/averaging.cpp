// torchext::optim::AveragedParameters and ASGD::start_averaging: the C++
// side of torchext/optim/averaging.py (same rules, see its docstrings).
#include <torchext/optim/averaging.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <map>
#include <utility>

namespace torchext {
namespace optim {
namespace {

using SwapOp = void(at::TensorList, at::TensorList);

void swap_all(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::swap_", "").typed<SwapOp>();
  at::NoGradGuard no_grad;
  // swap_ takes one device per call.
  std::map<std::pair<int, int>, std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> by;
  for (size_t i = 0; i < a.size(); ++i) {
    auto& slot = by[{static_cast<int>(a[i].device().type()), a[i].device().index()}];
    slot.first.push_back(a[i]);
    slot.second.push_back(b[i]);
  }
  for (const auto& [device, lists] : by) op.call(lists.first, lists.second);
}

}  // namespace

AveragedParameters::AveragedParameters(ASGD& optimizer) : optimizer_(optimizer) {
  TORCH_CHECK(!optimizer.averaged_in_, "ASGD.averaged_parameters: already active for this "
              "optimizer (nested use is not supported)");
  const auto& state = optimizer.state();
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto it = state.find(p.unsafeGetTensorImpl());
      if (it == state.end()) continue;  // never stepped: keeps its own value
      params_.push_back(p);
      axs_.push_back(static_cast<const ASGDParamState&>(*it->second).ax());
    }
  }
  swap_all(params_, axs_);  // validates before it swaps anything
  optimizer.averaged_in_ = true;
}

AveragedParameters::~AveragedParameters() {
  optimizer_.averaged_in_ = false;
  try {
    swap_all(params_, axs_);
  } catch (const std::exception& e) {  // cannot happen for tensors swapped once already
    TORCH_WARN("ASGD.averaged_parameters: swapping back failed: ", e.what());
  }
}

AveragedParameters ASGD::averaged_parameters() { return AveragedParameters(*this); }

void ASGD::start_averaging() {
  at::NoGradGuard no_grad;
  // Check every group first, then change: all or nothing.
  std::vector<double> t0s;
  for (const auto& group : param_groups_) {
    std::optional<double> count;
    for (const auto& p : group.params()) {
      auto it = state_.find(p.unsafeGetTensorImpl());
      const double s = it == state_.end()
                           ? 0.0
                           : static_cast<ASGDParamState&>(*it->second).step().item<double>();
      TORCH_CHECK(!count.has_value() || *count == s,
                  "ASGD.start_averaging: the parameters of one group took different numbers "
                  "of steps (", *count, " and ", s, "); in C++ the restart is one t0 per "
                  "group: put such parameters in separate groups");
      count = s;
    }
    t0s.push_back(count.value_or(0.0) - 1.0);
  }
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    static_cast<ASGDOptions&>(param_groups_[g].options()).t0(t0s[g]);
    for (const auto& p : param_groups_[g].params()) {
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it != state_.end()) static_cast<ASGDParamState&>(*it->second).mu().fill_(1.0);
    }
  }
}

}  // namespace optim
}  // namespace torchext

// torchext::optim::AveragedParameters and ASGD::start_averaging: the C++
// side of torchext/optim/averaging.py (same rules, see its docstrings).
#include <torchext/optim/averaging.h>

#include "device_groups.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

#include <algorithm>
#include <utility>

namespace torchext {
namespace optim {
namespace {

using SwapOp = void(at::TensorList, at::TensorList);

// One swap_ per device (the op takes one device per call; each call
// validates its lists before it swaps), devices in order of first
// appearance. All or nothing, as Python's averaging._swap: when a device's
// call is refused, the devices already swapped are swapped back (a second
// swap restores both bit for bit) before the error propagates.
void swap_all(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::swap_", "").typed<SwapOp>();
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>>> done;
  try {
    for (const auto& [device, idx] : api::index_by_device(a)) {
      auto lists = std::make_pair(api::pick(a, idx), api::pick(b, idx));
      op.call(lists.first, lists.second);
      done.push_back(std::move(lists));
    }
  } catch (...) {
    for (const auto& [xs, ys] : done) op.call(xs, ys);
    throw;
  }
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
  swap_all(params_, axs_);  // all or nothing: throws with nothing swapped
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
  // Python's rule (torchext/optim/averaging.py start_averaging): each param's
  // t0 is its step count - 1 (0 steps without state); the group's t0 is the
  // most common value (the first one seen on a tie, as Counter.most_common),
  // t0_per_param holds them all when they differ. Reads the step counts
  // first (a host read per param), then changes: all or nothing.
  at::NoGradGuard no_grad;
  std::vector<std::vector<double>> t0s(param_groups_.size());
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    for (const auto& p : param_groups_[g].params()) {
      auto it = state_.find(p.unsafeGetTensorImpl());
      const double s = it == state_.end()
                           ? 0.0
                           : static_cast<ASGDParamState&>(*it->second).step().item<double>();
      t0s[g].push_back(s - 1.0);
    }
  }
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& values = t0s[g];
    if (values.empty()) continue;
    double most = values[0];
    size_t most_count = 0;
    for (const double v : values) {  // first seen wins a tie: only a larger count replaces
      const auto n = static_cast<size_t>(std::count(values.begin(), values.end(), v));
      if (n > most_count) {
        most = v;
        most_count = n;
      }
    }
    auto& o = static_cast<ASGDOptions&>(param_groups_[g].options());
    o.t0(most);
    const bool same = most_count == values.size();
    o.t0_per_param(same ? std::vector<double>{} : values);
    for (const auto& p : param_groups_[g].params()) {
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it != state_.end()) static_cast<ASGDParamState&>(*it->second).mu().fill_(1.0);
    }
  }
}

}  // namespace optim
}  // namespace torchext

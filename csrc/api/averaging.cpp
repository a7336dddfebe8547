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

// Python's is_wider_average (torchext/optim/averaging.py): a float32 ax of a
// float16/bfloat16 parameter, which is copied instead of swapped.
bool is_wider_average(const at::Tensor& p, const at::Tensor& ax) {
  return ax.scalar_type() == at::kFloat &&
         (p.scalar_type() == at::kHalf || p.scalar_type() == at::kBFloat16);
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
      const auto& ax = static_cast<const ASGDParamState&>(*it->second).ax();
      if (is_wider_average(p, ax)) {
        wide_params_.push_back(p);
        axs_wide_.push_back(ax);
      } else {
        params_.push_back(p);
        axs_.push_back(ax);
      }
    }
  }
  at::NoGradGuard no_grad;
  // Every scratch copy first: an allocation that fails throws here, with
  // nothing written.
  for (const auto& p : wide_params_) saved_.push_back(p.detach().clone(at::MemoryFormat::Preserve));
  swap_all(params_, axs_);  // all or nothing: throws with nothing swapped
  for (size_t i = 0; i < wide_params_.size(); ++i) {
    wide_params_[i].detach().copy_(axs_wide_[i]);  // the average, rounded once to the param's dtype
  }
  axs_wide_.clear();  // ax is not touched; the exit needs only the scratch copies
  optimizer.averaged_in_ = true;
}

AveragedParameters::~AveragedParameters() {
  // No tensor is allocated here: the swap back exchanges memory already
  // held (swap_ writes in place, its lists passed the same checks at
  // construction), and each restore copies a scratch copy allocated at
  // construction into the parameter's own memory (same shape, dtype and
  // device). So neither can fail, and the parameters and ax are back bit
  // for bit.
  optimizer_.averaged_in_ = false;
  try {
    swap_all(params_, axs_);
  } catch (const std::exception& e) {  // cannot happen (see above)
    TORCH_WARN("ASGD.averaged_parameters: swapping back failed: ", e.what());
  }
  try {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < wide_params_.size(); ++i) wide_params_[i].detach().copy_(saved_[i]);
  } catch (const std::exception& e) {  // cannot happen (see above)
    TORCH_WARN("ASGD.averaged_parameters: restoring from the scratch copies failed: ",
               e.what());
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

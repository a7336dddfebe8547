// Per-device grouping for the C++ API (ASGD and GradScaler): the ops take
// lists on one device, so the front ends split their tensors by device,
// devices in order of first appearance. The one home of this rule on the C++
// side (Python's is torchext/_devices.py, the same order).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace torchext {
namespace api {

// Positions of `tensors` grouped by device, devices in order of first
// appearance (Python: _devices.indices_by_device).
using DeviceIndex = std::vector<std::pair<c10::Device, std::vector<size_t>>>;

inline DeviceIndex index_by_device(const std::vector<at::Tensor>& tensors) {
  DeviceIndex out;
  for (const auto i : c10::irange(tensors.size())) {
    const auto d = tensors[i].device();
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& e) { return e.first == d; });
    if (it == out.end()) it = out.emplace(out.end(), d, std::vector<size_t>{});
    it->second.push_back(i);
  }
  return out;
}

// ASGD's split into op calls: positions per (device, t0), devices in order
// of first appearance, then, within a device, t0s in order of first
// appearance. Python's is _devices.indices_by_device_and_key (the slot
// groups, functional.asgd); ASGD.SplitIntoOpCallsMatchesPython (cpp_tests,
// split_ref.pt) holds the two together.
struct CallGroup {
  c10::Device device;
  double t0;
  std::vector<size_t> idx;
};

inline std::vector<CallGroup> index_by_device_and_t0(const std::vector<at::Tensor>& tensors,
                                                     const std::vector<double>& t0s) {
  std::vector<CallGroup> out;
  for (const auto& [device, idx] : index_by_device(tensors)) {
    const size_t first = out.size();
    for (const auto i : idx) {
      auto it = std::find_if(out.begin() + first, out.end(),
                             [&](const CallGroup& g) { return g.t0 == t0s[i]; });
      if (it == out.end()) it = out.insert(out.end(), CallGroup{device, t0s[i], {}});
      it->idx.push_back(i);
    }
  }
  return out;
}

// xs[idx[0]], xs[idx[1]], ...
template <typename T>
std::vector<T> pick(const std::vector<T>& xs, const std::vector<size_t>& idx) {
  if (idx.size() == xs.size()) return xs;  // one device: every position, in order
  std::vector<T> out;
  out.reserve(idx.size());
  for (const auto i : idx) out.push_back(xs[i]);
  return out;
}

}  // namespace api
}  // namespace torchext

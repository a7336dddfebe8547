// Per-device grouping for the C++ API (ASGD and GradScaler): the ops take
// lists on one device, so the front ends split their tensors by device, in a
// fixed device order. The one home of this rule on the C++ side (Python's is
// torchext/_devices.py).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/irange.h>

#include <map>
#include <utility>
#include <vector>

namespace torchext {
namespace api {

struct DeviceLess {
  bool operator()(const c10::Device& a, const c10::Device& b) const {
    return std::make_pair(static_cast<int>(a.type()), static_cast<int>(a.index())) <
           std::make_pair(static_cast<int>(b.type()), static_cast<int>(b.index()));
  }
};

// Positions of `tensors` grouped by device, devices in a fixed order.
using DeviceIndex = std::map<c10::Device, std::vector<size_t>, DeviceLess>;

inline DeviceIndex index_by_device(const std::vector<at::Tensor>& tensors) {
  DeviceIndex out;
  for (const auto i : c10::irange(tensors.size())) out[tensors[i].device()].push_back(i);
  return out;
}

// xs[idx[0]], xs[idx[1]], ...
inline std::vector<at::Tensor> pick(const std::vector<at::Tensor>& xs,
                                    const std::vector<size_t>& idx) {
  if (idx.size() == xs.size()) return xs;  // one device: every position, in order
  std::vector<at::Tensor> out;
  out.reserve(idx.size());
  for (const auto i : idx) out.push_back(xs[i]);
  return out;
}

}  // namespace api
}  // namespace torchext

// A list argument as the kernels see it: references into the caller's list
// (the dispatcher's c10::List, or a C++ ArrayRef). Copying a Tensor[] argument
// into std::vector<at::Tensor>, as unboxed kernels get it, costs two atomic
// refcount updates per tensor, the largest kernel-side cost per tensor.
// An undefined tensor (or a None) in a list reads as an undefined tensor.
#pragma once

#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <vector>

namespace torchext {

class TensorRefs {
 public:
  TensorRefs() = default;
  explicit TensorRefs(at::TensorList ts);
  explicit TensorRefs(const c10::List<at::Tensor>& ts);
  size_t size() const { return ptrs_.size(); }
  bool empty() const { return ptrs_.empty(); }
  const at::Tensor& operator[](size_t i) const { return *ptrs_[i]; }

 private:
  std::vector<const at::Tensor*> ptrs_;
};

}  // namespace torchext

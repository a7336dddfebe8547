// torchext::GradsSeen (torch.classes.torchext.GradsSeen): the parameters'
// gradients as a clip measured them, to tell later whether they are still
// those (grads_seen.cpp says why and how). Also built by ASGDHolder.seen(),
// from the params it holds, without a list from Python.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

namespace torchext {

class GradsSeen : public torch::CustomClassHolder {
 public:
  // What changed() returns.
  static constexpr int64_t kSame = 0;      // every param has the gradient it had, unwritten
  static constexpr int64_t kReplaced = 1;  // some gradient was replaced, removed or added
  static constexpr int64_t kWritten = 2;   // the same gradients, some written in place

  explicit GradsSeen(std::vector<at::Tensor> params);
  int64_t changed() const;
  size_t size() const { return params_.size(); }

 private:
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  std::vector<at::Tensor> params_;
  std::vector<WeakImpl> grads_;   // empty where a param had no gradient
  std::vector<int64_t> versions_;  // -1 where a param had no gradient
};

// Registers torch.classes.torchext.GradsSeen: called by the fragment that
// registers ASGDHolder, whose seen() returns one (a class must be registered
// before a method that returns it, and two fragments' order is not fixed).
void register_grads_seen(torch::Library& m);

}  // namespace torchext

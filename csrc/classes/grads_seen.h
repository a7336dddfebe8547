// torchext::GradsSeen (torch.classes.torchext.GradsSeen): the parameters'
// gradients as a clip measured them, to tell later whether they are still
// those (grads_seen.cpp says why and how). Also filled by ASGDHolder::norms,
// in the walk of its norms' read, sharing the params list it holds.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace torchext {

class GradsSeen : public torch::CustomClassHolder {
 public:
  // What changed() returns.
  static constexpr int64_t kSame = 0;      // every param has the gradient it had, unwritten
  static constexpr int64_t kReplaced = 1;  // some gradient was replaced, removed or added
  static constexpr int64_t kWritten = 2;   // the same gradients, some written in place

  using Params = std::shared_ptr<const std::vector<at::Tensor>>;

  explicit GradsSeen(std::vector<at::Tensor> params);
  // Records each param's current .grad.
  explicit GradsSeen(Params params);
  // Empty, for a walk that already reads every param's .grad to fill with
  // add() in param order (ASGDHolder::norms: one walk, one call from Python).
  GradsSeen(Params params, bool /*filled_by_caller*/) : params_(std::move(params)) {
    grads_.reserve(params_->size());
    versions_.reserve(params_->size());
  }
  void add(const at::Tensor& grad);  // grad undefined: the param had none
  int64_t changed() const;
  size_t size() const { return params_->size(); }

 private:
  using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  Params params_;
  std::vector<WeakImpl> grads_;   // empty where a param had no gradient
  std::vector<int64_t> versions_;  // -1 where a param had no gradient
};

// Registers torch.classes.torchext.GradsSeen: called by the fragment that
// registers ASGDHolder, whose seen() returns one (a class must be registered
// before a method that returns it, and two fragments' order is not fixed).
void register_grads_seen(torch::Library& m);

}  // namespace torchext

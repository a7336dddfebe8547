// torch.classes.torchext.GradsSeen: which gradients a pending clip measured.
//
// A clip_grad_norm_ folded into the next step (torchext/_clip.py,
// PendingClip) must apply to the gradients it measured, or to nothing. This
// records, for every parameter, the .grad it had (a weak reference: a
// record keeps no gradient alive) and that gradient's version counter (every
// in-place write bumps it: a backward that accumulates, zero_(), an edit).
// changed() then says whether the gradients are still those, were replaced
// or removed (a zero_grad(set_to_none=True): the clip has nothing left to
// apply to), or were written in place (it cannot tell what they now hold).
//
// In C++ because it runs once per clip and once per step over every
// parameter: with thousands of small tensors a Python loop over them costs
// more than the norms themselves. Never used while torch.compile traces.
#include "grads_seen.h"

#include "../utils/prefetch.h"

#include <torch/library.h>

namespace torchext {

GradsSeen::GradsSeen(std::vector<at::Tensor> params)
    : GradsSeen(std::make_shared<const std::vector<at::Tensor>>(std::move(params))) {}

GradsSeen::GradsSeen(Params params) : GradsSeen(std::move(params), true) {
  const std::vector<at::Tensor>& ps = *params_;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i + kPrefetchImpl < ps.size()) prefetch_impl(ps[i + kPrefetchImpl].unsafeGetTensorImpl());
    add(ps[i].grad());
  }
}

void GradsSeen::add(const at::Tensor& g) {
  if (g.defined()) {
    grads_.emplace_back(g.getIntrusivePtr());
    versions_.push_back(g._version());
  } else {
    grads_.emplace_back(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>());
    versions_.push_back(-1);
  }
}

int64_t GradsSeen::changed() const {
  TORCH_CHECK(grads_.size() == params_->size(), "GradsSeen: not filled");
  const std::vector<at::Tensor>& ps = *params_;
  bool written = false;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i + kPrefetchImpl < ps.size()) prefetch_impl(ps[i + kPrefetchImpl].unsafeGetTensorImpl());
    const at::Tensor& g = ps[i].grad();
    const WeakImpl& seen = grads_[i];
    if (!g.defined()) {
      if (versions_[i] != -1) return kReplaced;  // removed
      continue;
    }
    // A gradient that died and another at its address: expired, so replaced.
    if (versions_[i] == -1 || seen.expired() ||
        seen._unsafe_get_target() != g.unsafeGetTensorImpl()) {
      return kReplaced;
    }
    written = written || g._version() != versions_[i];
  }
  return written ? kWritten : kSame;
}

void register_grads_seen(torch::Library& m) {
  m.class_<GradsSeen>("GradsSeen")
      .def(torch::init<std::vector<at::Tensor>>())
      .def("changed", &GradsSeen::changed)
      .def("__len__", [](const c10::intrusive_ptr<GradsSeen>& self) {
        return static_cast<int64_t>(self->size());
      });
}

}  // namespace torchext

#include "tensor_refs.h"

namespace torchext {

TensorRefs::TensorRefs(at::TensorList ts) {
  ptrs_.reserve(ts.size());
  for (const at::Tensor& t : ts) ptrs_.push_back(&t);
}

TensorRefs::TensorRefs(const c10::List<at::Tensor>& ts) {
  ptrs_.reserve(ts.size());
  // Each element converts to a reference to the tensor its IValue holds.
  for (const auto& t : ts) ptrs_.push_back(&static_cast<const at::Tensor&>(t));
}

}  // namespace torchext

#include "tensor_refs.h"

namespace torchext {

TensorRefs::TensorRefs(at::TensorList ts) {
  ptrs_.reserve(ts.size());
  for (const at::Tensor& t : ts) ptrs_.push_back(&t);
}

TensorRefs::TensorRefs(c10::ArrayRef<c10::IValue> vs) {
  static const at::Tensor kUndefined;
  ptrs_.reserve(vs.size());
  for (const c10::IValue& v : vs) ptrs_.push_back(v.isTensor() ? &v.toTensor() : &kUndefined);
}

}  // namespace torchext

#include "cpu_scalars.h"

#include <cstdint>

namespace torchext {

double read_cpu_scalar(const at::Tensor& t) {
  const void* p = t.const_data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat: return *static_cast<const float*>(p);
    case at::kDouble: return *static_cast<const double*>(p);
    case at::kInt: return *static_cast<const int32_t*>(p);
    case at::kLong: return static_cast<double>(*static_cast<const int64_t*>(p));
    default: return t.item<double>();
  }
}

void write_cpu_scalar(const at::Tensor& t, double value) {
  void* p = t.mutable_data_ptr();
  switch (t.scalar_type()) {
    case at::kFloat: *static_cast<float*>(p) = static_cast<float>(value); break;
    case at::kDouble: *static_cast<double*>(p) = value; break;
    case at::kInt: *static_cast<int32_t*>(p) = static_cast<int32_t>(value); break;
    case at::kLong: *static_cast<int64_t*>(p) = static_cast<int64_t>(value); break;
    default: t.fill_(value);
  }
}

}  // namespace torchext

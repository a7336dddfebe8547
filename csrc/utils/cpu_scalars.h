// Reading and writing a 1-element tensor that lives on the CPU, without the
// dispatcher (item()/fill_ cost microseconds per call; a step makes one per
// parameter). Never called on a device tensor: that would be a host sync.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchext {

// A 1-element float/double/int32/int64 CPU tensor's value (other dtypes
// through item()).
double read_cpu_scalar(const at::Tensor& t);
void write_cpu_scalar(const at::Tensor& t, double value);

}  // namespace torchext

// at::vec for the CPU kernels. The extension is compiled for the baseline
// ISA (no per-ISA dispatch): the optimizer step is memory-bound, and the
// benchmark shows it at the bandwidth bound anyway.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace torchext {
using at::vec::Vectorized;
}  // namespace torchext

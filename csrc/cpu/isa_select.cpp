#include "isa_kernels.h"

#include <ATen/Version.h>

#include <string>

namespace torchext {
namespace cpu {

const Kernels& kernels() {
  // Follow ATen's choice (CPU features, and the ATEN_CPU_CAPABILITY override),
  // so torchext and torch's own kernels run the same instruction set.
  static const Kernels& chosen = []() -> const Kernels& {
    const std::string cap = at::get_cpu_capability();
    if (cap == "AVX512" && AVX512::kKernels.asgd_span != nullptr) return AVX512::kKernels;
    if ((cap == "AVX512" || cap == "AVX2") && AVX2::kKernels.asgd_span != nullptr) {
      return AVX2::kKernels;
    }
    return DEFAULT::kKernels;
  }();
  return chosen;
}
}  // namespace cpu
}  // namespace torchext

// Which build the CPU kernels run: "DEFAULT", "AVX2" or "AVX512". A plain C
// symbol, not an op: it is build information (torchext.cpu_isa(), `python -m
// torchext info`, the per-ISA tests), nothing a graph should trace.
extern "C" __attribute__((visibility("default"))) const char* torchext_cpu_isa() {
  return torchext::cpu::kernels().isa;
}


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

// torchext::cpu_isa() (declared in <torchext/torchext.h>) and the same as a
// plain C symbol for Python's torchext.cpu_isa() (ctypes): build
// information, not an op, so nothing a graph would trace.
// (Declared here rather than by including torchext.h, which would pull the
// C++ API into builds without it: TORCHEXT_CPP_API=0.)
namespace torchext {
__attribute__((visibility("default"))) const char* cpu_isa() { return cpu::kernels().isa; }
}  // namespace torchext
extern "C" __attribute__((visibility("default"))) const char* torchext_cpu_isa() {
  return torchext::cpu_isa();
}

// The AVX2+FMA build of the CPU kernels; used only when the CPU has them.
// The build gives this file -mavx2 -mfma -mf16c (cmake/isa_flags.txt); a
// build without them (another architecture) makes the empty fallback.
#if defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "isa_kernels_impl.h"
#else
#include "isa_kernels.h"
namespace torchext::cpu::AVX2 {
const Kernels kKernels{nullptr, nullptr, nullptr, nullptr};
}
#endif

// The AVX2+FMA build of the CPU kernels; used only when the CPU has them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include "isa_target.h"
#include "isa_kernels_impl.h"
#else
#include "isa_kernels.h"
namespace torchext::cpu::AVX2 {
const Kernels kKernels{nullptr, nullptr, nullptr};
}
#endif

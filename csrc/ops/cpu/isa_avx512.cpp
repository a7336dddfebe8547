// The AVX512 build of the CPU kernels; used only when the CPU has them.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TORCHEXT_TARGET_AVX512
#include "isa_target.h"
#include "isa_kernels_impl.h"
#else
#include "isa_kernels.h"
namespace torchext::cpu::AVX512 {
const Kernels kKernels{nullptr, nullptr, nullptr};
}
#endif

// The AVX512 build of the CPU kernels; used only when the CPU has them.
// The build gives this file -mavx512f -mavx512bw -mavx512vl -mavx512dq ...
// (cmake/isa_flags.txt); a build without them makes the empty fallback.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__)
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "isa_kernels_impl.h"
#else
#include "isa_kernels.h"
namespace torchext::cpu::AVX512 {
const Kernels kKernels{nullptr, nullptr, nullptr, nullptr};
}
#endif

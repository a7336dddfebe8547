// The AVX2+FMA build of the CPU kernels; used only when the CPU has them.
//
// setuptools cannot give one source file its own compiler flags, so the
// target is set here: the pragma makes GCC emit AVX2 code for this file, and
// since the pragma does not define the feature macros that ATen's and
// Sleef's headers test, they are defined by hand (what -mavx2 -mfma would do).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx,avx2,fma,f16c")
#ifndef __AVX__
#define __AVX__ 1
#endif
#ifndef __AVX2__
#define __AVX2__ 1
#endif
#ifndef __FMA__
#define __FMA__ 1
#endif
#ifndef __F16C__
#define __F16C__ 1
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "isa_kernels_impl.h"
#else
#include "isa_kernels.h"
namespace torchext::cpu::AVX2 {
const Kernels kKernels{nullptr, nullptr, nullptr};
}
#endif

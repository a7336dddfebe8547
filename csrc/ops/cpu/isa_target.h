// Included first by isa_avx2.cpp / isa_avx512.cpp (x86-64 GCC only): turns
// the rest of the file into an AVX2 or AVX512 build.
//
// setuptools cannot give one source file its own compiler flags, so the
// target is set here: the pragma makes GCC emit that ISA's code, and since
// the pragma does not define the feature macros that ATen's and Sleef's
// headers test, they are defined by hand (what -mavx2 -mfma ... would do).
#pragma once

#if defined(TORCHEXT_TARGET_AVX512)
#pragma GCC target("avx,avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#else
#pragma GCC target("avx,avx2,fma,f16c")
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#endif

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
#if defined(TORCHEXT_TARGET_AVX512)
#ifndef __AVX512F__
#define __AVX512F__ 1
#endif
#ifndef __AVX512BW__
#define __AVX512BW__ 1
#endif
#ifndef __AVX512VL__
#define __AVX512VL__ 1
#endif
#ifndef __AVX512DQ__
#define __AVX512DQ__ 1
#endif
#endif

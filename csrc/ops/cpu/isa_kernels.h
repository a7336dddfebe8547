// The CPU inner loops, compiled once per instruction set (DEFAULT, AVX2,
// AVX512: isa_*.cpp include isa_kernels_impl.h with ATen's CPU_CAPABILITY
// macros set) and picked at run time the way ATen picks its own kernels
// (at::get_cpu_capability(), which honours ATEN_CPU_CAPABILITY).
//
// Why: an extension is compiled for the baseline ISA, where at::vec falls
// back to plain arrays; measured on a 2-core AVX512 machine that made the
// memory-bound ASGD step 3-6x slower than torch's own fused kernels.
#pragma once

#include <c10/core/ScalarType.h>
#include "torchext/elementwise_math.h"

#include <cstdint>

namespace torchext {
namespace cpu {

// One contiguous span of one tensor for the ASGD update.
struct ASGDSpan {
  at::ScalarType dtype;  // float, double, half or bfloat16 (complex as real)
  void* p;
  void* ax;  // of ax_dtype: dtype, or float for half/bfloat16 (a float32 average)
  at::ScalarType ax_dtype;
  const void* g;
  int64_t n;
  double eta, mu, lambd, weight_decay;
  bool maximize, unscale;
  float inv_scale;
  bool clipped = false;  // multiply by clip after inv_scale
  double clip = 1.0;
  // Stochastic rounding of a half/bfloat16 p (math::sr_bits(sr_key, sr_index
  // + i) for element i of the span); ignored for other dtypes.
  bool stochastic = false;
  uint64_t sr_key = 0;
  int64_t sr_index = 0;
};

struct Kernels {
  const char* isa;
  void (*asgd_span)(const ASGDSpan&);
  // Returns true if some element of x[0, n) is not finite; when `scale`,
  // also multiplies the span by inv_scale in the same pass, and then, when
  // `clipped`, by clip (rounded to x's dtype after each factor).
  bool (*scan_span)(at::ScalarType dtype, void* x, int64_t n, bool scale, float inv_scale,
                    bool clipped, double clip);
  // tensor_norms: folds the magnitudes of x[0, n) (of x * inv_scale rounded
  // to x's dtype, when `scale`) into a norm's running value
  // (math::norm_fold; `pairs`: x holds complex numbers as (re, im) pairs,
  // n counts reals) and returns it; sets *non_finite when some element of x
  // is inf or NaN. Read-only.
  double (*norm_span)(at::ScalarType dtype, const void* x, int64_t n, bool pairs,
                      math::NormKind kind, double p, bool scale, float inv_scale,
                      bool* non_finite);
};

// The best kernels this CPU and build allow.
const Kernels& kernels();

namespace DEFAULT { extern const Kernels kKernels; }
namespace AVX2 { extern const Kernels kKernels; }
namespace AVX512 { extern const Kernels kKernels; }

}  // namespace cpu
}  // namespace torchext

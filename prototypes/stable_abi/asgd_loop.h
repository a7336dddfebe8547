// The ASGD elementwise update of torch.optim.ASGD for float32, as a plain C++
// loop (no at::vec::Vectorized: the stable ABI's header-only layer has none).
// Included by isa_{default,avx2,avx512}.cpp, each compiled with its own -m
// flags; the compiler auto-vectorizes it (-O3, -ffp-contract=off). MADD fuses
// exactly where torch's kernels fuse (Vectorized fmadd on AVX2/AVX512, a
// separate multiply and add on the default ISA), so results stay bit-exact.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__FMA__)
#define PROTO_MADD(a, b, c) std::fma((a), (b), (c))
#else
#define PROTO_MADD(a, b, c) ((a) * (b) + (c))
#endif

namespace proto {
struct Coeffs {
  float weight_decay, decay, step_size, mu;
  bool has_weight_decay, average;
};

// p = p*decay + g'*step_size, g' = g + wd*p; ax += (p - ax)*mu (or ax = p)
static inline void asgd_loop(float* __restrict p, const float* __restrict g,
                             float* __restrict ax, int64_t n, Coeffs c) {
  if (c.has_weight_decay && c.average) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      float gi = PROTO_MADD(p[i], c.weight_decay, g[i]);
      float pi = PROTO_MADD(gi, c.step_size, p[i] * c.decay);
      p[i] = pi;
      ax[i] = ax[i] + (pi - ax[i]) * c.mu;
    }
  } else if (c.average) {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      float pi = PROTO_MADD(g[i], c.step_size, p[i] * c.decay);
      p[i] = pi;
      ax[i] = ax[i] + (pi - ax[i]) * c.mu;
    }
  } else {
#pragma GCC ivdep
    for (int64_t i = 0; i < n; ++i) {
      float gi = c.has_weight_decay ? PROTO_MADD(p[i], c.weight_decay, g[i]) : g[i];
      float pi = PROTO_MADD(gi, c.step_size, p[i] * c.decay);
      p[i] = pi;
      ax[i] = pi;
    }
  }
}
}  // namespace proto

#define PROTO_DEFINE_ISA(name)                                                  \
  extern "C" void proto_asgd_loop_##name(float* p, const float* g, float* ax,   \
                                         int64_t n, proto::Coeffs c) {          \
    proto::asgd_loop(p, g, ax, n, c);                                           \
  }

// Body of the per-ISA CPU kernels; included by isa_default.cpp, isa_avx2.cpp
// and isa_avx512.cpp with CPU_CAPABILITY set, so at::vec::Vectorized is the
// native vector of that instruction set. The math is elementwise_math.h.
#include "isa_kernels.h"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <tuple>
#include <utility>
#include <type_traits>

namespace torchext {
namespace cpu {
namespace CPU_CAPABILITY {
namespace {

using at::vec::Vectorized;

// a * b + c as torch's CPU kernels of this ISA compute `x.add(y, alpha=s)`:
// vec::fmadd (fused with AVX2/AVX512), and a contracted scalar tail. The
// build passes -ffp-contract=off so that nothing else gets fused.
struct IsaMulAdd {
  template <typename T>
  Vectorized<T> operator()(const Vectorized<T>& a, const Vectorized<T>& b,
                           const Vectorized<T>& c) const {
    return at::vec::fmadd(a, b, c);
  }
  template <typename T>
  T operator()(T a, T b, T c) const {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
    return std::fma(a, b, c);
#else
    return a * b + c;
#endif
  }
};

// Software prefetch 2 KB ahead in each stream. A step and a clip read
// gradients the backward wrote some time before, and every tensor is a few
// pages only: the hardware prefetcher had little to go on, and those reads
// waited on L3 (the clip's read of 128 fresh 16 KB gradients: 180-230 us
// cold, 44 warm; 146-169 with these).
constexpr int64_t kAheadBytes = 2048;
template <typename... T>
inline void prefetch_ahead(const T*... x) {
  (__builtin_prefetch(reinterpret_cast<const char*>(x) + kAheadBytes), ...);
}

template <typename T>
math::ASGDCoeffs<Vectorized<T>> broadcast(const math::ASGDCoeffs<T>& c) {
  return {Vectorized<T>(c.inv_scale), Vectorized<T>(c.clip), Vectorized<T>(c.weight_decay),
          Vectorized<T>(c.decay), Vectorized<T>(c.step_size), Vectorized<T>(c.mu), c.unscale,
          c.clipped, c.has_weight_decay, c.average};
}

// The random bits (math::sr_bits) of a block of a span's elements, made
// ahead of the loop that rounds them: one 32-bit hash per pair of elements,
// in one long loop that -O3 vectorizes (32-bit multiplies and shifts).
constexpr int64_t kBitsBlock = 512;  // elements, a multiple of every Vec::size()
struct StochasticBits {
  alignas(64) uint16_t halves[kBitsBlock + 4];
  int64_t begin = 0, end = 0;  // the span's elements [begin, end) have bits
  const uint16_t* at = halves;  // element `begin`'s bits

  void fill(const ASGDSpan& s, int64_t from) {
    const uint64_t base = static_cast<uint64_t>(s.sr_index + from);
    const uint64_t pair = base >> 1;
    constexpr int kPairs = kBitsBlock / 2 + 1;
    const uint32_t lo = static_cast<uint32_t>(pair);
    if (lo <= UINT32_MAX - kPairs) {  // the pairs share the pair index's high half
      const uint32_t k0 = static_cast<uint32_t>(s.sr_key);
      const uint32_t k1_hi =
          static_cast<uint32_t>(s.sr_key >> 32) + static_cast<uint32_t>(pair >> 32);
#pragma omp simd
      for (int j = 0; j < kPairs; ++j) {
        const uint32_t h = math::sr_pair_bits32(k0, k1_hi, lo + j);
        std::memcpy(halves + 2 * j, &h, sizeof h);
      }
    } else {
      for (int j = 0; j < kPairs; ++j) {
        const uint32_t h = math::sr_pair_bits(s.sr_key, pair + j);
        std::memcpy(halves + 2 * j, &h, sizeof h);
      }
    }
    // little-endian: pair m's low half (element 2m), then its high half
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the uint16 halves above");
    at = halves + (base & 1);
    begin = from;
    end = from + kBitsBlock;
  }
};

// fp16/bf16 lanes as stored, and the float32 values they stand for (what
// the average moves toward): rounded to nearest (at::vec's conversion), or
// stochastically with the lanes' random bits `r`. bf16 rounds as bits
// (selects only, vectorized). fp16 rounds in 32-bit lanes to a float16
// value (math::fp16_value_stochastic), stored with the exact conversion to
// nearest and averaged as it is, with no conversion back.
// (Inlined by force: GCC kept it a call, which returned the vectors through
// memory, 7% of an fp16 step in cache.)
template <typename scalar_t, bool kStochastic>
C10_ALWAYS_INLINE std::tuple<Vectorized<scalar_t>, Vectorized<float>, Vectorized<float>>
round_to_stored(
    const Vectorized<float>& p0, const Vectorized<float>& p1, const uint16_t* r) {
  using FVec = Vectorized<float>;
  if constexpr (kStochastic && std::is_same_v<scalar_t, at::Half>) {
    constexpr int kN = 2 * FVec::size();
    alignas(64) float x[kN];
    p0.store(x);
    p1.store(x + kN / 2);
#pragma omp simd
    for (int j = 0; j < kN; ++j) x[j] = math::fp16_value_stochastic(x[j], r[j]);
    const FVec q0 = FVec::loadu(x), q1 = FVec::loadu(x + kN / 2);
    return {at::vec::convert_from_float<scalar_t>(q0, q1), q0, q1};
  } else {
    Vectorized<scalar_t> stored;
    if constexpr (!kStochastic) {
      stored = at::vec::convert_from_float<scalar_t>(p0, p1);
    } else {
      constexpr int kN = 2 * FVec::size();
      alignas(64) float x[kN];
      alignas(64) uint16_t out[kN];
      p0.store(x);
      p1.store(x + kN / 2);
#pragma omp simd
      for (int j = 0; j < kN; ++j) out[j] = math::bf16_bits_stochastic(x[j], r[j]);
      stored = Vectorized<scalar_t>::loadu(out);
    }
    auto [q0, q1] = at::vec::convert_to_float<scalar_t>(stored);
    return {stored, q0, q1};
  }
}

// ax_t: the average's storage, the parameter's dtype or float32 for fp16/bf16
// parameters (a float32 average: elementwise_math.h, asgd_average).
// kStochastic: fp16/bf16 parameters rounded stochastically on store.
template <typename scalar_t, typename ax_t, bool kStochastic = false>
void asgd_typed(const ASGDSpan& s) {
  using opmath_t = at::opmath_type<scalar_t>;
  const auto c = math::make_asgd_coeffs<opmath_t>(s.eta, s.mu, s.lambd, s.weight_decay,
                                                  s.maximize, s.unscale, s.inv_scale,
                                                  s.clipped, s.clip);
  const auto cv = broadcast(c);
  auto* p = static_cast<scalar_t*>(s.p);
  auto* ax = static_cast<ax_t*>(s.ax);
  const auto* g = static_cast<const scalar_t*>(s.g);
  using Vec = Vectorized<scalar_t>;
  int64_t i = 0;
  if constexpr (std::is_same_v<opmath_t, scalar_t>) {
    for (; i + Vec::size() <= s.n; i += Vec::size()) {
      prefetch_ahead(p + i, ax + i, g + i);
      Vec vp = Vec::loadu(p + i);
      Vec vax = Vec::loadu(ax + i);
      math::asgd_update(vp, vax, Vec::loadu(g + i), cv, IsaMulAdd{});
      vp.store(p + i);
      vax.store(ax + i);
    }
  } else {
    // fp16/bf16: compute in float32, round the parameter once on store; the
    // average moves toward the parameter as stored.
    using FVec = Vectorized<float>;
    StochasticBits bits;  // (unused when rounding to nearest)
    for (; i + Vec::size() <= s.n; i += Vec::size()) {
      if constexpr (kStochastic) {
        if (i >= bits.end) bits.fill(s, i);
      }
      auto [p0, p1] = at::vec::convert_to_float<scalar_t>(Vec::loadu(p + i));
      auto [g0, g1] = at::vec::convert_to_float<scalar_t>(Vec::loadu(g + i));
      math::asgd_param(p0, g0, cv, IsaMulAdd{});
      math::asgd_param(p1, g1, cv, IsaMulAdd{});
      const auto [stored, q0, q1] =
          round_to_stored<scalar_t, kStochastic>(p0, p1, bits.at + (i - bits.begin));
      stored.store(p + i);
      if constexpr (std::is_same_v<ax_t, float>) {
        FVec a0 = FVec::loadu(ax + i), a1 = FVec::loadu(ax + i + FVec::size());
        math::asgd_average(a0, q0, cv);
        math::asgd_average(a1, q1, cv);
        a0.store(ax + i);
        a1.store(ax + i + FVec::size());
      } else {
        auto [a0, a1] = at::vec::convert_to_float<scalar_t>(Vec::loadu(ax + i));
        math::asgd_average(a0, q0, cv);
        math::asgd_average(a1, q1, cv);
        at::vec::convert_from_float<scalar_t>(a0, a1).store(ax + i);
      }
    }
  }
  for (; i < s.n; ++i) {
    opmath_t vp = static_cast<opmath_t>(p[i]), vax = static_cast<opmath_t>(ax[i]);
    math::asgd_param(vp, static_cast<opmath_t>(g[i]), c, IsaMulAdd{});
    if constexpr (kStochastic) {
      p[i] = math::round_stochastic<scalar_t>(vp, math::sr_bits(s.sr_key, s.sr_index + i));
    } else {
      p[i] = static_cast<scalar_t>(vp);
    }
    math::asgd_average(vax, static_cast<opmath_t>(p[i]), c);
    ax[i] = static_cast<ax_t>(vax);
  }
}

void asgd_span(const ASGDSpan& s) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, s.dtype, "asgd_cpu", [&] {
    if constexpr (std::is_same_v<scalar_t, at::Half> || std::is_same_v<scalar_t, at::BFloat16>) {
      const bool wide = s.ax_dtype == at::kFloat;
      if (s.stochastic) {
        wide ? asgd_typed<scalar_t, float, true>(s) : asgd_typed<scalar_t, scalar_t, true>(s);
        return;
      }
      if (wide) {
        asgd_typed<scalar_t, float>(s);
        return;
      }
    }
    asgd_typed<scalar_t, scalar_t>(s);
  });
}

// x * 0 is 0 for finite x and NaN for inf/NaN, so a running sum of x * 0 is
// NaN exactly when some element is not finite: no branch per element.
template <typename V>
inline V poison(const V& acc, const V& x) {
  return acc + x * V(0);
}

template <typename scalar_t>
bool scan_typed(scalar_t* x, int64_t n, bool scale, float inv_scale, bool clipped,
                double clip) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vectorized<opmath_t>;
  const Vec vinv(static_cast<opmath_t>(inv_scale));
  const Vec vclip(static_cast<opmath_t>(clip));
  Vec acc(0);
  int64_t i = 0;
  if constexpr (std::is_same_v<opmath_t, scalar_t>) {
    for (; i + Vec::size() <= n; i += Vec::size()) {
      const Vec v = Vec::loadu(x + i);
      acc = poison(acc, v);
      if (scale) (clipped ? v * vinv * vclip : v * vinv).store(x + i);
    }
  } else {
    using RVec = Vectorized<scalar_t>;
    for (; i + RVec::size() <= n; i += RVec::size()) {
      auto [v0, v1] = at::vec::convert_to_float<scalar_t>(RVec::loadu(x + i));
      acc = poison(poison(acc, v0), v1);
      if (scale) {
        RVec r = at::vec::convert_from_float<scalar_t>(v0 * vinv, v1 * vinv);
        if (clipped) {  // unscale_ stored r; the clip multiplies what it stored
          auto [u0, u1] = at::vec::convert_to_float<scalar_t>(r);
          r = at::vec::convert_from_float<scalar_t>(u0 * vclip, u1 * vclip);
        }
        r.store(x + i);
      }
    }
  }
  opmath_t tail = 0;
  for (; i < n; ++i) {
    const opmath_t v = static_cast<opmath_t>(x[i]);
    tail = tail + v * opmath_t(0);
    if (scale) {
      x[i] = static_cast<scalar_t>(v * static_cast<opmath_t>(inv_scale));
      if (clipped) x[i] = static_cast<scalar_t>(static_cast<opmath_t>(x[i]) * static_cast<opmath_t>(clip));
    }
  }
  bool bad = math::non_finite(tail);
  __at_align__ opmath_t lanes[Vec::size()];
  acc.store(lanes);
  for (int64_t k = 0; k < Vec::size(); ++k) bad = bad || math::non_finite(lanes[k]);
  return bad;
}

bool scan_span(at::ScalarType dtype, void* x, int64_t n, bool scale, float inv_scale,
               bool clipped, double clip) {
  bool bad = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "scan_cpu", [&] {
    bad = scan_typed(static_cast<scalar_t*>(x), n, scale, inv_scale, clipped, clip);
  });
  return bad;
}

// ---- tensor_norms -------------------------------------------------------

// Elements per block: a block is summed in the compute type's vector lanes,
// then added to a double, so a long tensor's 2-norm loses no more than a
// short one's to float32 rounding.
constexpr int64_t kNormBlock = 1024;

template <math::NormKind K, typename V>
inline V fold_vec(const V& acc, const V& x) {
  if constexpr (K == math::NormKind::kOne) {
    return acc + x.abs();
  } else if constexpr (K == math::NormKind::kTwo) {
    return acc + x * x;
  } else if constexpr (K == math::NormKind::kInf) {
    return at::vec::maximum(acc, x.abs());  // propagates NaN
  } else {
    return at::vec::minimum(acc, x.abs());
  }
}

// A vector's lanes folded into a double running value.
template <math::NormKind K, typename V>
inline double lanes_into(double total, const V& v) {
  using T = typename V::value_type;
  __at_align__ T lanes[V::size()];
  v.store(lanes);
  for (int64_t k = 0; k < V::size(); ++k) {
    total = math::norm_combine(K, total, static_cast<double>(lanes[k]));
  }
  return total;
}

// A float vector's lanes as two double vectors (its low and high halves).
inline std::pair<Vectorized<double>, Vectorized<double>> widen(const Vectorized<float>& v) {
  using VD = Vectorized<double>;
#if defined(CPU_CAPABILITY_AVX512)
  const __m512 x = v;
  return {VD(_mm512_cvtps_pd(_mm512_castps512_ps256(x))),
          VD(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))))};
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256 x = v;
  return {VD(_mm256_cvtps_pd(_mm256_castps256_ps128(x))),
          VD(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)))};
#else
  static_assert(Vectorized<float>::size() == 2 * VD::size(), "a float vector is two double ones");
  __at_align__ float f[Vectorized<float>::size()];
  __at_align__ double d[Vectorized<float>::size()];
  v.store(f);
  for (int64_t k = 0; k < Vectorized<float>::size(); ++k) d[k] = static_cast<double>(f[k]);
  return {VD::loadu(d), VD::loadu(d + VD::size())};
#endif
}

// The 2-norm of float32/fp16/bf16 data with its squares in double. An
// unscaled gradient below 1e-19 (a GradScaler's clip reads them: 7e-23 in a
// 64-layer MLP under bf16 autocast) squares to a float32 denormal, which
// costs the CPU a microcode assist per element (the whole read 3x slower)
// and loses the square's bits; in double neither happens, and the values
// read are still the float32 ones unscale_ would store.
template <typename scalar_t>
double sumsq_widened(const scalar_t* x, int64_t n, bool scale, float inv_scale, bool* bad,
                     int64_t* done) {
  using VF = Vectorized<float>;
  using VD = Vectorized<double>;
  using RVec = Vectorized<scalar_t>;
  const VF vinv(inv_scale);
  double total = 0;
  VF poisoned(0);
  int64_t i = 0;
  VD a0(0), a1(0), a2(0), a3(0);
  const auto fold = [&](const VF& v) {  // (two chains per float vector)
    auto [lo, hi] = widen(v);
    a0 = at::vec::fmadd(lo, lo, a0);
    a1 = at::vec::fmadd(hi, hi, a1);
  };
  const auto fold2 = [&](const VF& v) {
    auto [lo, hi] = widen(v);
    a2 = at::vec::fmadd(lo, lo, a2);
    a3 = at::vec::fmadd(hi, hi, a3);
  };
  if constexpr (std::is_same_v<scalar_t, float>) {
    VF p1(0);
    for (; i + 2 * VF::size() <= n; i += 2 * VF::size()) {
      prefetch_ahead(x + i, x + i + VF::size());
      VF v0 = VF::loadu(x + i), v1 = VF::loadu(x + i + VF::size());
      poisoned = poison(poisoned, v0);
      p1 = poison(p1, v1);
      fold(scale ? v0 * vinv : v0);
      fold2(scale ? v1 * vinv : v1);
    }
    for (; i + VF::size() <= n; i += VF::size()) {
      VF v = VF::loadu(x + i);
      poisoned = poison(poisoned, v);
      fold(scale ? v * vinv : v);
    }
    poisoned = poisoned + p1;
  } else {
    for (; i + RVec::size() <= n; i += RVec::size()) {
      auto [v0, v1] = at::vec::convert_to_float<scalar_t>(RVec::loadu(x + i));
      poisoned = poison(poison(poisoned, v0), v1);
      if (scale) {  // the unscaled grad as unscale_ would store it: rounded
        std::tie(v0, v1) = at::vec::convert_to_float<scalar_t>(
            at::vec::convert_from_float<scalar_t>(v0 * vinv, v1 * vinv));
      }
      fold(v0);
      fold2(v1);
    }
  }
  total = lanes_into<math::NormKind::kTwo>(
      lanes_into<math::NormKind::kTwo>(lanes_into<math::NormKind::kTwo>(total, a0), a1),
      a2 + a3);
  *bad = *bad || lanes_into<math::NormKind::kOne>(0.0, poisoned) != 0.0;
  *done = i;
  return total;
}

template <math::NormKind K, typename scalar_t>
double norm_vectorized(const scalar_t* x, int64_t n, bool scale, float inv_scale, bool* bad,
                       int64_t* done) {
  using opmath_t = at::opmath_type<scalar_t>;
  if constexpr (K == math::NormKind::kTwo && std::is_same_v<opmath_t, float>) {
    return sumsq_widened(x, n, scale, inv_scale, bad, done);
  }
  using Vec = Vectorized<opmath_t>;
  using RVec = Vectorized<scalar_t>;
  const Vec vinv(static_cast<opmath_t>(inv_scale));
  const Vec id(math::norm_identity<opmath_t>(K));
  double total = math::norm_identity<double>(K);
  Vec poisoned(0);
  int64_t i = 0;
  while (i + RVec::size() <= n) {
    const int64_t end = std::min(n, i + kNormBlock);
    Vec a0 = id, a1 = id;
    if constexpr (std::is_same_v<opmath_t, scalar_t>) {
      // Four independent chains (sums and checks): one would wait on the
      // add's latency, not on memory.
      Vec a2 = id, a3 = id;
      Vec p1(0), p2(0), p3(0);
      const auto load = [&](int64_t j, Vec& pz) {
        Vec v = Vec::loadu(x + j);
        pz = poison(pz, v);
        return scale ? v * vinv : v;
      };
      for (; i + 4 * Vec::size() <= end; i += 4 * Vec::size()) {
        a0 = fold_vec<K>(a0, load(i, poisoned));
        a1 = fold_vec<K>(a1, load(i + Vec::size(), p1));
        a2 = fold_vec<K>(a2, load(i + 2 * Vec::size(), p2));
        a3 = fold_vec<K>(a3, load(i + 3 * Vec::size(), p3));
      }
      for (; i + Vec::size() <= end; i += Vec::size()) a0 = fold_vec<K>(a0, load(i, poisoned));
      poisoned = poisoned + p1 + p2 + p3;
      total = lanes_into<K>(lanes_into<K>(total, a2), a3);
    } else {
      for (; i + RVec::size() <= end; i += RVec::size()) {
        auto [v0, v1] = at::vec::convert_to_float<scalar_t>(RVec::loadu(x + i));
        poisoned = poison(poison(poisoned, v0), v1);
        if (scale) {  // the unscaled grad as unscale_ would store it: rounded
          std::tie(v0, v1) =
              at::vec::convert_to_float<scalar_t>(at::vec::convert_from_float<scalar_t>(
                  v0 * vinv, v1 * vinv));
        }
        a0 = fold_vec<K>(a0, v0);
        a1 = fold_vec<K>(a1, v1);
      }
    }
    total = lanes_into<K>(lanes_into<K>(total, a0), a1);
  }
  *bad = *bad || lanes_into<math::NormKind::kOne>(0.0, poisoned) != 0.0;
  *done = i;
  return total;
}

template <typename scalar_t>
double norm_typed(const scalar_t* x, int64_t n, bool pairs, math::NormKind kind, double p,
                  bool scale, float inv_scale, bool* bad) {
  using opmath_t = at::opmath_type<scalar_t>;
  using K = math::NormKind;
  double total = math::norm_identity<double>(kind);
  int64_t i = 0;
  if (!pairs) {
    switch (kind) {
      case K::kOne: total = norm_vectorized<K::kOne>(x, n, scale, inv_scale, bad, &i); break;
      case K::kTwo: total = norm_vectorized<K::kTwo>(x, n, scale, inv_scale, bad, &i); break;
      case K::kInf: total = norm_vectorized<K::kInf>(x, n, scale, inv_scale, bad, &i); break;
      case K::kNegInf:
        total = norm_vectorized<K::kNegInf>(x, n, scale, inv_scale, bad, &i);
        break;
      default: break;  // 0 and other p: the scalar loop
    }
  }
  // The rest (and complex pairs, 0 and general p): one element at a time.
  const auto unscaled = [&](int64_t j) {
    opmath_t v = static_cast<opmath_t>(x[j]);
    if (math::non_finite(v)) *bad = true;
    if (scale) v = static_cast<opmath_t>(static_cast<scalar_t>(v * static_cast<opmath_t>(inv_scale)));
    return static_cast<double>(v);
  };
  const int64_t width = pairs ? 2 : 1;
  for (; i + width <= n; i += width) {
    const double a = pairs ? std::hypot(unscaled(i), unscaled(i + 1)) : std::abs(unscaled(i));
    total = math::norm_fold(kind, total, a, p);
  }
  return total;
}

double norm_span(at::ScalarType dtype, const void* x, int64_t n, bool pairs, math::NormKind kind,
                 double p, bool scale, float inv_scale, bool* non_finite) {
  double total = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "norm_cpu", [&] {
    total = norm_typed(static_cast<const scalar_t*>(x), n, pairs, kind, p, scale, inv_scale,
                       non_finite);
  });
  return total;
}

}  // namespace

extern const Kernels kKernels;
const Kernels kKernels{C10_STRINGIZE(CPU_CAPABILITY), &asgd_span, &scan_span, &norm_span};

}  // namespace CPU_CAPABILITY
}  // namespace cpu
}  // namespace torchext

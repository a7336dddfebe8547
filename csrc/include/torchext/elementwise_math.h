// The per-element math of torchext, shared by the CPU kernels (scalar and
// at::vec::Vectorized) and the CUDA kernels. Every function here is written
// once, templated on the arithmetic type `V`, which is a plain float/double
// (CPU tails, CUDA threads) or an at::vec::Vectorized<float/double> (CPU body).
//
// Low-precision parameters (fp16/bf16) are loaded, computed in float32 and
// rounded once on store; the launchers do the loads and stores.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace torchext {
namespace math {

// ---- Rounding policy ----------------------------------------------------
// Every product and sum below goes through mul/add/sub, rounded as written,
// and a fused multiply-add happens only where a launcher passes one (the
// `madd` of asgd_update). On the host the library is compiled with
// -ffp-contract=off, so `a * b` is a rounded product; nvcc contracts
// `a * b + c` by default (-fmad=true), so on the device the float and double
// overloads use the explicitly rounded intrinsics, which it never contracts.
// Vectorized types (CPU loops) take the generic templates.
template <typename V>
C10_HOST_DEVICE inline V mul(const V& a, const V& b) { return a * b; }
template <typename V>
C10_HOST_DEVICE inline V add(const V& a, const V& b) { return a + b; }
template <typename V>
C10_HOST_DEVICE inline V sub(const V& a, const V& b) { return a - b; }

#if defined(__CUDA_ARCH__)
C10_HOST_DEVICE inline float mul(float a, float b) { return __fmul_rn(a, b); }
C10_HOST_DEVICE inline float add(float a, float b) { return __fadd_rn(a, b); }
C10_HOST_DEVICE inline float sub(float a, float b) { return __fsub_rn(a, b); }
C10_HOST_DEVICE inline double mul(double a, double b) { return __dmul_rn(a, b); }
C10_HOST_DEVICE inline double add(double a, double b) { return __dadd_rn(a, b); }
C10_HOST_DEVICE inline double sub(double a, double b) { return __dsub_rn(a, b); }
C10_HOST_DEVICE inline float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
C10_HOST_DEVICE inline double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }
#else
C10_HOST_DEVICE inline float mul(float a, float b) { return a * b; }
C10_HOST_DEVICE inline float add(float a, float b) { return a + b; }
C10_HOST_DEVICE inline float sub(float a, float b) { return a - b; }
C10_HOST_DEVICE inline double mul(double a, double b) { return a * b; }
C10_HOST_DEVICE inline double add(double a, double b) { return a + b; }
C10_HOST_DEVICE inline double sub(double a, double b) { return a - b; }
// a * b + c rounded once: the host twin of __fmaf_rn / __fma_rn.
C10_HOST_DEVICE inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
C10_HOST_DEVICE inline double fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
#endif

// Per-tensor coefficients of one ASGD step, in the compute type of the tensor.
// They are derived from the *previous* eta and mu, exactly as
// torch.optim.ASGD does (the step uses the old eta/mu, then recomputes both).
template <typename V>
struct ASGDCoeffs {
  V inv_scale;     // 1/grad_scale (float32-rounded, as torch's unscale_ uses)
  V clip;          // a gradient clip's coefficient, applied after inv_scale
  V weight_decay;  // signed: -wd when maximizing (see make_asgd_coeffs)
  V decay;         // 1 - lambd * eta
  V step_size;     // -eta, or +eta when maximizing
  V mu;
  bool unscale;
  bool clipped;
  bool has_weight_decay;
  bool average;    // false when mu == 1: torch then copies param into ax
};

// Builds the coefficients for one tensor. eta and mu are the float32 (or
// float64) state values; lambd and weight_decay are the group's doubles. The
// scalar expressions are evaluated in double, as Python does in torch's
// for-loop implementation, then rounded to the compute type.
//
// Maximize is folded into signs, bit-exactly: torch computes
//   g' = -g + wd*p ; p = p*decay + (-eta)*g'
// and negation is exact, so p*decay + eta*(g + (-wd)*p) gives the same bits.
//
// A clip coefficient is a second factor, never folded into inv_scale: torch's
// recipe multiplies by inv_scale (unscale_), then by the coefficient (the
// clip), and their product is not representable at every scale torch's
// scaler reaches (2^127 / coef overflows float32). It is rounded to the
// compute type, as torch's `grad.mul_(coef)` rounds a float64 coefficient for
// float32 grads.
template <typename T>
C10_HOST_DEVICE inline ASGDCoeffs<T> make_asgd_coeffs(
    double eta, double mu, double lambd, double weight_decay, bool maximize,
    bool unscale, float inv_scale, bool clipped = false, double clip = 1.0) {
  ASGDCoeffs<T> c;
  c.inv_scale = static_cast<T>(inv_scale);
  c.unscale = unscale;
  c.clip = static_cast<T>(clip);
  c.clipped = clipped;
  c.has_weight_decay = weight_decay != 0.0;
  c.weight_decay = static_cast<T>(maximize ? -weight_decay : weight_decay);
  c.decay = static_cast<T>(sub(1.0, mul(lambd, eta)));
  c.step_size = static_cast<T>(maximize ? eta : -eta);
  c.mu = static_cast<T>(mu);
  c.average = mu != 1.0;
  return c;
}

// a * b + c, rounded after the multiply and after the add.
struct SeparateMulAdd {
  template <typename V>
  C10_HOST_DEVICE V operator()(const V& a, const V& b, const V& c) const {
    return add(mul(a, b), c);
  }
};

// a * b + c, rounded once: what torch's CUDA kernels compute for
// `x.add(y, alpha=s)` (their AddFunctor's `a + b * alpha`, which nvcc
// contracts into one FMA). The CUDA kernels pass it, and so the host runner
// that executes their bodies.
struct FusedMulAdd {
  template <typename T>
  C10_HOST_DEVICE T operator()(T a, T b, T c) const {
    return fma_rn(a, b, c);
  }
};

// One ASGD update of one element (or one vector of elements), in place,
// in two halves: asgd_param (the parameter) then asgd_average (the average,
// moved toward the parameter as stored). Same order of operations as
// torch.optim.ASGD's for-loop path. `madd` computes a * b + c where torch
// computes `x.add(y, alpha=s)`, the only places torch's kernels fuse: the
// CPU launchers pass a fused multiply-add when the ISA has one (torch's own
// CPU add kernel then uses vec::fmadd), the CUDA kernels always pass
// FusedMulAdd (torch's CUDA add kernel is one FMA). Everything else is
// rounded op by op, as torch's one-kernel-per-op for-loop path rounds it,
// so fp32/fp64 results equal torch's bit for bit.
template <typename V, typename C, typename MulAdd = SeparateMulAdd>
C10_HOST_DEVICE inline void asgd_param(V& p, V g, const C& c, MulAdd madd = {}) {
  if (c.unscale) {
    g = mul(g, c.inv_scale);            // GradScaler.unscale_: grad * inv_scale
  }
  if (c.clipped) {
    g = mul(g, c.clip);                 // clip_grad_norm_: grad * clip_coef
  }
  if (c.has_weight_decay) {
    g = madd(p, c.weight_decay, g);     // grad.add(param, alpha=weight_decay)
  }
  p = mul(p, c.decay);                  // param.mul_(1 - lambd * eta)
  p = madd(g, c.step_size, p);          // param.add_(grad, alpha=-eta)
}

// The average's half. `p_stored` is the new parameter as stored (rounded to
// the parameter's dtype, then widened to the compute type): ax averages the
// parameters the model held, as torch.optim.ASGD's `ax.add_(param.sub(ax)
// .mul_(mu))` does. ax may be kept wider than the parameter (float32 for
// fp16/bf16 parameters): its own rounding is then float32's, and a small
// (p - ax) * mu still moves it.
template <typename V, typename C>
C10_HOST_DEVICE inline void asgd_average(V& ax, const V& p_stored, const C& c) {
  if (c.average) {
    ax = add(ax, mul(sub(p_stored, ax), c.mu));  // ax.add_(param.sub(ax).mul_(mu))
  } else {
    ax = p_stored;                      // ax.copy_(param) when mu == 1
  }
}

// Both halves, for a parameter stored in its compute type (fp32, fp64, and
// complex as real pairs), where p as stored is p itself.
template <typename V, typename C, typename MulAdd = SeparateMulAdd>
C10_HOST_DEVICE inline void asgd_update(V& p, V& ax, V g, const C& c, MulAdd madd = {}) {
  asgd_param(p, g, c, madd);
  asgd_average(ax, p, c);
}

// The eta/mu schedule of torch.optim.ASGD, evaluated after `step` has been
// incremented, then stored into the state tensors. torch evaluates
// lr / (1 + lambd * lr * step) ** alpha in Python floats for a float lr
// (double here, rounded once), but in tensor arithmetic for a tensor lr:
// float32 for the float32 lr tensors schedulers keep, one rounding per
// operation, in that order (lr_is_float; a float64 lr tensor is the double
// formula).
// torch's float32 `tensor ** alpha` (alpha >= 0 here): its special cases,
// then std::pow(float, double) on the CPU and powf on CUDA, as ATen's
// pow_tensor_scalar kernels compute it.
C10_HOST_DEVICE inline float pow_as_torch(float base, double alpha) {
  if (alpha == 0.5) return ::sqrtf(base);
  if (alpha == 2.0) return mul(base, base);
  if (alpha == 3.0) return mul(mul(base, base), base);
#ifdef __CUDA_ARCH__
  return ::powf(base, static_cast<float>(alpha));
#else
  return static_cast<float>(::pow(static_cast<double>(base), alpha));
#endif
}

C10_HOST_DEVICE inline double asgd_eta(double lr, double lambd, double alpha,
                                       double step, bool lr_is_float) {
  if (lr_is_float) {
    const float lr_f = static_cast<float>(lr);
    const float base = add(1.0f, mul(mul(static_cast<float>(lambd), lr_f),
                                     static_cast<float>(step)));
    return lr_f / pow_as_torch(base, alpha);
  }
  return lr / ::pow(add(1.0, mul(mul(lambd, lr), step)), alpha);
}

C10_HOST_DEVICE inline double asgd_mu(double t0, double step) {
  const double d = sub(step, t0);
  return 1.0 / (d > 1.0 ? d : 1.0);
}

// ---- Stochastic rounding (ASGD's stochastic_rounding=True) --------------
// An fp16/bf16 parameter's new value, computed in float32, is rounded to one
// of its two neighbours in the parameter's dtype, up (away from zero) with
// probability (|x| - lo) / (hi - lo): its expectation is x, so updates
// smaller than half an ulp still move the parameter on average.
//
// The random bits come from a counter-based hash, no generator state: the
// same bits on the CPU and on CUDA, capturable in CUDA graphs, traceable.
// Their key (docs/optimizer.md, "Stochastic rounding"):
//   stream = sr_stream(seed, id)      per tensor: the optimizer's seed and the
//                                      param's identity (group << 32 | index)
//   key    = sr_key(stream, step)     per tensor and step: the step being taken
//   bits   = sr_bits(key, index)      per element (16 bits): its index in
//                                      the full, unsharded tensor
// so that two tensors of one shape get different streams, every step new
// bits, and a run resharded through DCP the same bits for each element.

C10_HOST_DEVICE inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}

C10_HOST_DEVICE inline float float_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// splitmix64's finalizer (Steele et al.): a 64-bit bijection, full avalanche.
C10_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// lowbias32 (C. Wellons): a 32-bit bijection with two multiplies, cheap in
// vector lanes (the per-element hash).
C10_HOST_DEVICE inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

C10_HOST_DEVICE inline uint64_t sr_stream(int64_t seed, int64_t id) {
  return mix64(mix64(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(id));
}

// The step being taken (the state's step after its increment) as an
// integer. A float32 step is exact to 2**24, where it (and eta and mu with
// it) stops counting, as torch's does.
C10_HOST_DEVICE inline uint64_t sr_key(uint64_t stream, double step) {
  const uint64_t s = (step >= 0.0 && step < 9.2e18) ? static_cast<uint64_t>(step) : 0;
  return mix64(stream + mix64(s));
}

// 16 random bits for the element at `index`. Elements 2m and 2m+1 share one
// 32-bit hash of the pair index m (two rounds of hash32, keyed by the halves
// of `key`; m's high half joins the second round): the low half is 2m's,
// the high half 2m+1's, so that a vector of lanes hashes once per two
// elements. sr_pair_bits32 is the hash with those parts split out: k0 = the
// key's low half, k1_hi = its high half + m's high half, lo = m's low half.
C10_HOST_DEVICE inline uint32_t sr_pair_bits32(uint32_t k0, uint32_t k1_hi, uint32_t lo) {
  return hash32(hash32(lo ^ k0) ^ k1_hi);
}
C10_HOST_DEVICE inline uint32_t sr_pair_bits(uint64_t key, uint64_t pair) {
  return sr_pair_bits32(static_cast<uint32_t>(key),
                        static_cast<uint32_t>(key >> 32) + static_cast<uint32_t>(pair >> 32),
                        static_cast<uint32_t>(pair));
}
C10_HOST_DEVICE inline uint16_t sr_bits(uint64_t key, int64_t index) {
  const uint64_t i = static_cast<uint64_t>(index);
  const uint32_t h = sr_pair_bits(key, i >> 1);
  return static_cast<uint16_t>((i & 1) ? h >> 16 : h);
}

// x rounded stochastically to bfloat16 with the random bits r, as bits: the
// 16 bits bfloat16 drops get r added, then are cut, so |x| rounds up with
// probability (dropped bits) / 2**16, exactly. Past the largest finite
// bfloat16 the carry makes inf, with that probability; inf stays inf, NaN
// stays a (quiet) NaN.
C10_HOST_DEVICE inline uint16_t bf16_bits_stochastic(float x, uint16_t r) {
  const uint32_t b = float_bits(x);
  const uint32_t nan = (b >> 16) | 0x40u;
  const uint32_t rounded = (b + r) >> 16;
  return static_cast<uint16_t>((b & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// The same for float16. Its normal range (|x| >= 2**-14) drops 13 of
// float32's mantissa bits: r's top 13 are added, as above, and the exponent
// rebiased; from 65504 up the carry makes inf with probability
// (|x| - 65504) / 32 (the next value fp16's ulp there would give), and
// |x| >= 65536 is inf. Subnormals (|x| < 2**-14, multiples of 2**-24) go
// through |x| + 2**-14, whose float32 bits drop 13 bits to fp16's the same
// way, then the 2**-14 is taken off again: exact where |x| is a multiple of
// 2**-37 (that float32 sum rounds finer bits, an error below 2**-14 of a
// subnormal step). Selects as masks, no branch: GCC turns ?: chains here
// into branches, which do not vectorize.
C10_HOST_DEVICE inline uint16_t fp16_bits_stochastic(float x, uint16_t r) {
  const uint32_t b = float_bits(x);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t a = b & 0x7fffffffu;
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < 0x38800000u);
  const uint32_t shifted = float_bits(add(float_from_bits(a), 6.103515625e-05f));
  const uint32_t src = (shifted & is_sub) | (a & ~is_sub);
  // the sum is at most 0x7f801fff, so the rebiased value is >= 0x7c00
  // exactly from 65536 up (inf included), clamped to inf there
  uint32_t h = ((src + (static_cast<uint32_t>(r) >> 3)) >> 13) - (112u << 10);
  h = h < 0x7c00u ? h : 0x7c00u;
  h -= 0x0400u & is_sub;  // the 2**-14 taken off
  const uint32_t is_nan = 0u - static_cast<uint32_t>(a > 0x7f800000u);
  h = (0x7e00u & is_nan) | (h & ~is_nan);  // NaN stays a (quiet) NaN
  return static_cast<uint16_t>(sign | h);
}

// fp16_bits_stochastic's result as the float32 value it stands for (a NaN:
// the quiet NaN with x's sign), in 32-bit lanes only: no 16-bit packing.
// The CPU kernel rounds this way, then stores with the conversion to
// nearest (F16C's vcvtps2ph), which is exact here as the value is a float16
// (>= 65536 converts to inf), and averages it with no conversion back.
// Proven equal to fp16_bits_stochastic (cpp_tests/test_stochastic_rounding).
// In the normal lanes the 2**-14 is a 0 (x + 0 = x), so no select is needed.
C10_HOST_DEVICE inline float fp16_value_stochastic(float x, uint16_t r) {
  const uint32_t b = float_bits(x);
  const uint32_t a = b & 0x7fffffffu;
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < 0x38800000u);
  const float bias = float_from_bits(0x38800000u & is_sub);  // 2**-14 or 0
  const uint32_t src = float_bits(add(float_from_bits(a), bias));
  const float cut = float_from_bits((src + (static_cast<uint32_t>(r) >> 3)) & ~0x1fffu);
  const uint32_t v = float_bits(sub(cut, bias));
  const uint32_t is_nan = 0u - static_cast<uint32_t>(a > 0x7f800000u);
  return float_from_bits(((0x7fc00000u & is_nan) | (v & ~is_nan)) | (b & 0x80000000u));
}

// x rounded stochastically to T (c10::BFloat16 or c10::Half) with bits r.
template <typename T>
C10_HOST_DEVICE inline T round_stochastic(float x, uint16_t r) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return T(bf16_bits_stochastic(x, r), T::from_bits());
  } else {
    return T(fp16_bits_stochastic(x, r), T::from_bits());
  }
}

// ---- AMP loss scaling --------------------------------------------------

// True when x is inf or NaN (works for float and double).
template <typename T>
C10_HOST_DEVICE inline bool non_finite(T x) {
  return !(sub(x, x) == sub(x, x));  // NaN for inf and NaN, 0 otherwise
}

// State of the dynamic loss scale. growth_tracker counts consecutive
// finite steps; hysteresis_tracker counts the overflows still tolerated
// before a backoff (Megatron-LM's rule; hysteresis == 1 is torch's rule).
struct ScaleUpdate {
  float scale;
  int32_t growth_tracker;
  int32_t hysteresis_tracker;
};

// torch's _amp_update_scale_ rule, extended with hysteresis and clamps:
// - overflow: growth_tracker = 0, hysteresis_tracker -= 1, and when it
//   reaches 0 the scale backs off (never below min_scale);
// - no overflow: growth_tracker += 1; at growth_interval the scale grows
//   (never above max_scale, never to inf), and both trackers reset.
// The products are evaluated in double and rounded to float, like torch.
// The settings are read by name from `s` (torchext's UpdateScaleSettings,
// csrc/ops/update_scale_args.h: growth_factor, backoff_factor,
// growth_interval, hysteresis, min_scale, max_scale; no clamp is 0 / inf).
template <typename Settings>
C10_HOST_DEVICE inline ScaleUpdate update_scale(float scale, int32_t growth_tracker,
                                                int32_t hysteresis_tracker, bool found_inf,
                                                const Settings& s) {
  ScaleUpdate r{scale, growth_tracker, hysteresis_tracker};
  if (found_inf) {
    r.growth_tracker = 0;
    r.hysteresis_tracker = hysteresis_tracker - 1;
    if (r.hysteresis_tracker <= 0) {
      r.hysteresis_tracker = 0;
      float next = static_cast<float>(mul(static_cast<double>(scale), s.backoff_factor));
      if (static_cast<double>(next) < s.min_scale) {
        next = static_cast<float>(s.min_scale);
      }
      r.scale = next;
    }
  } else {
    const int32_t successful = growth_tracker + 1;
    if (successful >= s.growth_interval) {
      float next = static_cast<float>(mul(static_cast<double>(scale), s.growth_factor));
      if (static_cast<double>(next) > s.max_scale) {
        next = static_cast<float>(s.max_scale);
      }
      if (!non_finite(next)) {
        r.scale = next;
      }
      r.growth_tracker = 0;
      r.hysteresis_tracker = static_cast<int32_t>(s.hysteresis);
    } else {
      r.growth_tracker = successful;
    }
  }
  return r;
}

// ---- Vector norms (tensor_norms: gradient clipping) ---------------------

// Which reduction a norm order is: torch.linalg.vector_norm's special cases
// (0: a count of nonzeros, 1, 2, inf: max, -inf: min) and any other p,
// negative or fractional: (sum |x|^p)^(1/p).
enum class NormKind : int8_t { kZero, kOne, kTwo, kInf, kNegInf, kP };

C10_HOST_DEVICE inline NormKind norm_kind(double ord) {
  if (ord == 0.0) return NormKind::kZero;
  if (ord == 1.0) return NormKind::kOne;
  if (ord == 2.0) return NormKind::kTwo;
  if (ord == HUGE_VAL) return NormKind::kInf;
  if (ord == -HUGE_VAL) return NormKind::kNegInf;
  return NormKind::kP;
}

// Max and min that propagate NaN, as torch's reductions do.
template <typename T>
C10_HOST_DEVICE inline T max_nan(T a, T b) {
  return (a != a || a > b) ? a : b;
}
template <typename T>
C10_HOST_DEVICE inline T min_nan(T a, T b) {
  return (a != a || a < b) ? a : b;
}

// The value a norm's running reduction starts from (the identity).
template <typename T>
C10_HOST_DEVICE inline T norm_identity(NormKind k) {
  return k == NormKind::kNegInf ? static_cast<T>(HUGE_VAL) : T(0);
}

// One element's magnitude a (= |x|) folded into the running value acc.
template <typename T>
C10_HOST_DEVICE inline T norm_fold(NormKind k, T acc, T a, double p) {
  switch (k) {
    case NormKind::kZero: return add(acc, a != T(0) ? T(1) : T(0));  // NaN counts
    case NormKind::kOne: return add(acc, a);
    case NormKind::kTwo: return add(acc, mul(a, a));
    case NormKind::kInf: return max_nan(acc, a);
    case NormKind::kNegInf: return min_nan(acc, a);
    default: return add(acc, static_cast<T>(::pow(static_cast<double>(a), p)));
  }
}

// Two running values of one tensor (its chunks) combined.
template <typename T>
C10_HOST_DEVICE inline T norm_combine(NormKind k, T a, T b) {
  if (k == NormKind::kInf) return max_nan(a, b);
  if (k == NormKind::kNegInf) return min_nan(a, b);
  return add(a, b);
}

// The norm from a tensor's running value: the root for 2 and other p.
// `float_sums`: the tensor is float32, float16, bfloat16 or complex64, whose
// norms torch accumulates in float32. torch's sum of |x|^p then overflows to
// inf when it passes FLT_MAX, and so the norm is inf (0 for negative p),
// although each element is finite; our running value is a double, which does
// not overflow, so that overflow is applied here. The clip then gets
// torch's coefficient (0 for an inf norm), not a finite one torch never
// computes, and a per-tensor norm agrees with the total torch takes in float32.
C10_HOST_DEVICE inline double norm_finish(NormKind k, double acc, double p, bool float_sums) {
  constexpr double kFloatMax = 3.4028234663852886e38;  // FLT_MAX
  if (float_sums && acc > kFloatMax &&
      (k == NormKind::kOne || k == NormKind::kTwo || k == NormKind::kP)) {
    acc = HUGE_VAL;
  }
  if (k == NormKind::kTwo) return ::sqrt(acc);
  if (k == NormKind::kP) return ::pow(acc, 1.0 / p);
  return acc;
}

}  // namespace math
}  // namespace torchext

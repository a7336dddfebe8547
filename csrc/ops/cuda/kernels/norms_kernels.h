// tensor_norms on an accelerator: every tensor's vector norm in one read of
// the tensors (with inv_scale/found_inf: the norms of the unscaled tensors
// and unscale_'s inf/NaN check, in that same read), with the CPU kernel's
// contract (csrc/ops/cpu/norms_cpu.cpp). Kernel bodies (C10_HOST_DEVICE) and
// the host-side plan, a template over the executor like amp_kernels.h: the
// CUDA executor (csrc/ops/cuda/norms_cuda.cu) or the host runner
// (cpp_tests/host_runner.h).
//
// Launches, on one stream, in this order:
//   1. one multi-tensor-apply series per element type (real dtype, or a
//      complex dtype's (re, im) pairs): each block folds its chunk, reduces
//      its threads' values in shared memory (a fixed tree) and writes the
//      chunk's partial, one per block of the call, in launch order; the block
//      of a tensor's chunk 0 also writes the tensor's row (its first partial,
//      how many, its dtype). Every tensor gets a block, an empty one too;
//   2. the combine, one thread per tensor: its partials added in chunk
//      order, the norm finished (root, float32 overflow) and rounded to the
//      tensor's dtype, then stored in the output's.
//
// Accumulation, as the CPU kernel's: per thread in float32 for the 1-,
// inf and -inf norms of float32/fp16/bf16 tensors (the CPU kernel's float
// lanes; here a chain is at most 128 elements: a 64K chunk over 512
// threads), in double for 2-norms (their squares underflow float32 below
// 1e-19), float64, complex pairs, 0 and other p (the CPU's double lanes and
// scalar loop); threads into a block, blocks into a tensor in double.
//
// Determinism: a partial depends only on its chunk's elements and the block
// size, the chunk size on the list (not on the parameter layout, nor the
// block order), and the combine adds a tensor's partials in chunk order; so
// the norms are the same bits run to run, in both parameter layouts and any
// block order.
#pragma once

#include "../../norms.h"
#include "../../../utils/dense_views.h"
#include "../../../utils/prefetch.h"
#include "multi_tensor_apply.h"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <math.h>

#include <algorithm>
#include <iterator>
#include <optional>
#include <type_traits>
#include <vector>

namespace torchext {
namespace kernels {

// A complex element as its real parts (c10::complex<R>'s memory).
template <typename R>
struct alignas(2 * sizeof(R)) RealPair {
  R re;
  R im;
};

template <typename E>
struct NormElement {
  using real_t = E;
  static constexpr bool kPairs = false;
};
template <typename R>
struct NormElement<RealPair<R>> {
  using real_t = R;
  static constexpr bool kPairs = true;
};

// Where a tensor's partials are and the dtype its norm is rounded to,
// written by the block of its chunk 0 (rows are indexed by the tensor's
// place in the list: its metadata tag).
struct NormRow {
  int64_t first;    // its chunk 0's partial
  int32_t nchunks;  // its partials, from first on
  int32_t dtype;    // its real at::ScalarType
};

struct NormArgs {
  double* partials;        // one per block of the call
  NormRow* rows;           // one per tensor
  float* found_inf;        // nullptr: no check
  const float* inv_scale;  // nullptr: not scaled
  int64_t block_base;      // this launch's first block, counted over the call
  double p;                // the order
};

// One pointer per tensor (tag: its place in the list).
template <ParamLayout L>
using NormMeta = MetaFor<1, L, sizeof(NormArgs)>;

C10_HOST_DEVICE inline float magnitude_of(float v) { return ::fabsf(v); }
C10_HOST_DEVICE inline double magnitude_of(double v) { return ::fabs(v); }

// What the norm of order K folds per element of type E: the element as
// unscale_ would store it (multiplied by inv_scale in opmath, rounded to the
// tensor's dtype), its magnitude (complex: hypot of the parts, in double),
// checked for inf/NaN before the multiply as unscale_ checks it.
template <math::NormKind K, typename E>
struct NormFold {
  using real_t = typename NormElement<E>::real_t;
  using opmath_t = at::opmath_type<real_t>;
  static constexpr bool kPairs = NormElement<E>::kPairs;
  // The 2-norm's squares in double, as on the CPU: the square of an unscaled
  // gradient below 1e-19 is a float32 denormal with a few bits left.
  using acc_t = std::conditional_t<kPairs || K == math::NormKind::kZero ||
                                       K == math::NormKind::kTwo || K == math::NormKind::kP,
                                   double, opmath_t>;

  C10_HOST_DEVICE static opmath_t unscaled(real_t x, bool scale, opmath_t inv, bool& bad) {
    opmath_t v = static_cast<opmath_t>(x);
    bad = bad || math::non_finite(v);
    if (scale) v = static_cast<opmath_t>(static_cast<real_t>(math::mul(v, inv)));
    return v;
  }
  C10_HOST_DEVICE static acc_t magnitude(const E& x, bool scale, opmath_t inv, bool& bad) {
    if constexpr (kPairs) {
      const double re = static_cast<double>(unscaled(x.re, scale, inv, bad));
      const double im = static_cast<double>(unscaled(x.im, scale, inv, bad));
      return ::hypot(re, im);
    } else {
      return static_cast<acc_t>(magnitude_of(unscaled(x, scale, inv, bad)));
    }
  }
  // Lanes [0, valid) of one load folded into acc.
  C10_HOST_DEVICE void operator()(const E (&lanes)[kILP], int valid, acc_t& acc, bool& bad,
                                  bool scale, opmath_t inv, double p) const {
    TORCHEXT_UNROLL
    for (int ii = 0; ii < kILP; ++ii) {
      if (ii < valid) acc = math::norm_fold<acc_t>(K, acc, magnitude(lanes[ii], scale, inv, bad), p);
    }
  }
};

// Pass 1: one block per chunk (a phased body, multi_tensor_apply.h).
// Phase 0: every thread folds its elements of the chunk (chunk_loop) and
// puts its value in shared memory; phases 1..tree_steps: a tree, stride
// halving, in double; the last phase's thread 0 writes the partial.
template <math::NormKind K, typename E, typename Meta, typename Fold = NormFold<K, E>>
struct NormChunkBody {
  static constexpr const char* kName = "norms";
  struct Shared {
    double acc[kBlockSize];
  };
  C10_HOST_DEVICE static int phases(unsigned nthreads) { return 1 + tree_steps(nthreads); }

  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, int phase, Shared& sh, const Meta& meta,
                                  const NormArgs& a) const {
    const BlockChunk bc = block_chunk(meta, ctx.block);
    const int last = phases(ctx.nthreads) - 1;
    if (phase == 0) {
      using acc_t = typename Fold::acc_t;
      using opmath_t = typename Fold::opmath_t;
      acc_t acc = math::norm_identity<acc_t>(K);
      bool bad = false;
      if (bc.n > 0) {
        const bool scale = a.inv_scale != nullptr;
        const opmath_t inv = scale ? static_cast<opmath_t>(*a.inv_scale) : opmath_t(1);
        E* const ptrs[1] = {static_cast<E*>(meta.ptrs[0][bc.slot]) + bc.begin};
        chunk_loop(ctx, ptrs, bc.n, /*nstore=*/0, [&](E (&r)[1][kILP], int valid) {
          Fold{}(r[0], valid, acc, bad, scale, inv, a.p);
        });
      }
      // Every writer stores the same value.
      if (bad && a.found_inf != nullptr) *a.found_inf = 1.f;
      sh.acc[ctx.thread] = static_cast<double>(acc);
      if (bc.first && ctx.thread == 0) {
        NormRow& row = a.rows[meta.tag[bc.slot]];
        row.first = a.block_base + ctx.block;
        row.nchunks = static_cast<int32_t>(chunks_of(meta.numel[bc.slot], meta.chunk_size));
        row.dtype = static_cast<int32_t>(
            c10::CppTypeToScalarType<typename NormElement<E>::real_t>::value);
      }
    } else {
      const unsigned stride = 1u << (last - phase);
      const unsigned t = ctx.thread;
      if (t < stride && t + stride < ctx.nthreads) {
        sh.acc[t] = math::norm_combine(K, sh.acc[t], sh.acc[t + stride]);
      }
    }
    if (phase == last && ctx.thread == 0) a.partials[a.block_base + ctx.block] = sh.acc[0];
  }
  static int64_t work(unsigned nblocks, unsigned, const Meta& meta, const NormArgs&) {
    return elements_in_launch(meta, nblocks);
  }
};

// v rounded to `dtype` (a norm has its tensor's real dtype), as the CPU
// kernel rounds it: through the dtype's opmath type.
C10_HOST_DEVICE inline double round_norm(at::ScalarType dtype, double v) {
  switch (dtype) {
    case at::kHalf:
      return static_cast<float>(static_cast<c10::Half>(static_cast<float>(v)));
    case at::kBFloat16:
      return static_cast<float>(static_cast<c10::BFloat16>(static_cast<float>(v)));
    case at::kFloat:
      return static_cast<float>(v);
    default:
      return v;
  }
}

struct NormCombineArgs {
  const NormRow* rows;
  const double* partials;
  int64_t n;  // tensors
  double p;
  math::NormKind kind;
};

constexpr unsigned kCombineThreads = 256;

// Pass 2: one thread per tensor.
template <typename out_t>
struct NormCombineBody {
  static constexpr const char* kName = "norms combine";
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, out_t* out,
                                  const NormCombineArgs& a) const {
    const int64_t i = static_cast<int64_t>(ctx.block) * ctx.nthreads + ctx.thread;
    if (i >= a.n) return;
    const NormRow row = a.rows[i];
    double acc = math::norm_identity<double>(a.kind);
    for (int32_t c = 0; c < row.nchunks; ++c) {
      acc = math::norm_combine(a.kind, acc, a.partials[row.first + c]);
    }
    const auto dtype = static_cast<at::ScalarType>(row.dtype);
    const double norm = math::norm_finish(a.kind, acc, a.p, /*float_sums=*/dtype != at::kDouble);
    out[i] = static_cast<out_t>(static_cast<at::opmath_type<out_t>>(round_norm(dtype, norm)));
  }
  static int64_t work(unsigned, unsigned, out_t*, const NormCombineArgs& a) { return a.n; }
};

// ---- host side ------------------------------------------------------------

template <typename Fn>
void with_norm_kind(math::NormKind kind, const Fn& fn) {
  using K = math::NormKind;
  switch (kind) {
    case K::kZero: return fn(std::integral_constant<K, K::kZero>{});
    case K::kOne: return fn(std::integral_constant<K, K::kOne>{});
    case K::kTwo: return fn(std::integral_constant<K, K::kTwo>{});
    case K::kInf: return fn(std::integral_constant<K, K::kInf>{});
    case K::kNegInf: return fn(std::integral_constant<K, K::kNegInf>{});
    case K::kP: return fn(std::integral_constant<K, K::kP>{});
  }
}

// tensor_norms through `exec`: validation before anything else, then the
// launches above. Dense tensors are read in place (complex ones as (re, im)
// pairs; a conjugate or negative view has its memory's magnitudes); the
// others through contiguous temporaries.
template <typename Exec>
at::Tensor tensor_norms_launch(at::TensorList tensors, double ord,
                               const std::optional<at::Tensor>& inv_scale,
                               const std::optional<at::Tensor>& found_inf, Exec& exec) {
  check_tensor_norms_args(tensors, ord, inv_scale, found_inf);
  const int64_t n = static_cast<int64_t>(tensors.size());
  if (n == 0) {  // as the composite kernel
    const auto device = found_inf ? found_inf->device()
                        : inv_scale ? inv_scale->device() : c10::Device(at::kCPU);
    return at::empty({0}, at::TensorOptions().dtype(at::kFloat).device(device));
  }
  const c10::Device device = tensors[0].device();
  exec.enter(device);
  const LaunchLimits limits = exec.limits();
  TORCH_CHECK(limits.block_size <= kBlockSize, "tensor_norms: at most ", kBlockSize,
              " threads per block");
  const auto kind = math::norm_kind(ord);

  // Entries grouped by element type: (real dtype, complex pairs or not).
  struct Group {
    at::ScalarType dtype;
    bool pairs;
    std::vector<TensorEntry<1>> entries;
  };
  std::vector<Group> groups;
  std::vector<DenseOne> copies;  // kept alive until the launches are queued
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchImpl < n) prefetch_impl(tensors[i + kPrefetchImpl].unsafeGetTensorImpl());
    if (i + kPrefetchStorage < n) {
      prefetch_storage(tensors[i + kPrefetchStorage].unsafeGetTensorImpl());
    }
    const at::Tensor& t = tensors[i];
    const bool pairs = t.is_complex();
    const at::ScalarType dtype = c10::toRealValueType(t.scalar_type());
    const void* ptr;
    if (t.is_non_overlapping_and_dense()) {
      ptr = t.const_data_ptr();
    } else {
      // view_as_real refuses a lazily conjugated tensor; its conjugate has
      // the same magnitudes.
      copies.push_back(make_dense_one(t.is_conj() ? t.conj() : t));
      ptr = copies.back().t.const_data_ptr();
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.dtype == dtype && g.pairs == pairs;
    });
    if (it == groups.end()) {
      groups.push_back({dtype, pairs, {}});
      it = std::prev(groups.end());
      it->entries.reserve(tensors.size());
    }
    // numel: elements, a complex one being one (re, im) pair.
    it->entries.push_back({{const_cast<void*>(ptr)}, t.numel(), static_cast<int32_t>(i)});
  }

  int64_t blocks = 0;  // one per chunk, an empty tensor's included
  for (const auto& g : groups) {
    const int64_t chunk = planned_chunk_size(g.entries, limits);
    for (const auto& e : g.entries) blocks += chunks_of(e.numel, chunk);
  }
  const at::Tensor partials = exec.scratch(blocks * static_cast<int64_t>(sizeof(double)));
  const at::Tensor rows = exec.scratch(n * static_cast<int64_t>(sizeof(NormRow)));
  at::Tensor out =
      at::empty({n}, at::TensorOptions().dtype(tensor_norms_dtype(tensors)).device(device));

  NormArgs args{};
  args.partials = reinterpret_cast<double*>(partials.data_ptr());
  args.rows = reinterpret_cast<NormRow*>(rows.data_ptr());
  args.found_inf = found_inf ? found_inf->data_ptr<float>() : nullptr;
  args.inv_scale = inv_scale ? inv_scale->const_data_ptr<float>() : nullptr;
  args.p = ord;
  with_param_layout<Exec::kLargeParams>(limits.layout, [&](auto layout) {
    using Meta = NormMeta<decltype(layout)::value>;
    with_norm_kind(kind, [&](auto k) {
      constexpr math::NormKind K = decltype(k)::value;
      for (const auto& g : groups) {
        AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, g.dtype, "tensor_norms", [&] {
          const auto series = [&](auto element) {
            using E = typename decltype(element)::type;
            multi_tensor_apply<Meta>(
                g.entries, limits, EmptyTensors::kOneBlock, [&](const Meta& meta, int nblocks) {
                  exec.template launch<NormChunkBody<K, E, Meta>>(
                      static_cast<unsigned>(nblocks), limits.block_size, meta, args);
                  args.block_base += nblocks;
                });
          };
          if (g.pairs) {
            series(TypeTag<RealPair<scalar_t>>{});
          } else {
            series(TypeTag<scalar_t>{});
          }
        });
      }
    });
  });
  TORCH_CHECK(args.block_base == blocks, "tensor_norms: planned ", blocks, " blocks, launched ",
              args.block_base);

  NormCombineArgs cargs{args.rows, args.partials, n, ord, kind};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "norms_out", [&] {
    exec.template launch<NormCombineBody<scalar_t>>(blocks_for(n, kCombineThreads),
                                                    kCombineThreads, out.data_ptr<scalar_t>(),
                                                    cargs);
  });
  return out;
}

}  // namespace kernels
}  // namespace torchext

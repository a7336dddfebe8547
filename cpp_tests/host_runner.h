// The host runner: an executor for the launch plans of asgd_kernels.h, amp_kernels.h,
// swap_kernels.h and norms_kernels.h (csrc/ops/cuda/kernels/) that runs every launch on the CPU, calling the kernel body for
// every block and every thread the launch has, with host memory standing in
// for device memory. It needs no CUDA toolkit. CUDA guarantees no order
// among blocks (nor among the threads of a block), so the runner takes one:
// forward, reverse, or shuffled. A phased body (a block-wide reduction) runs
// block by block, phase by phase: every thread's phase k (in that order)
// before any thread's phase k + 1, as __syncthreads() orders them, its
// shared memory filled with 0xFF bytes (NaN) first. The tests (test_cuda_on_host.cpp) compare
// its results bit for bit with the CPU kernels. It lives with its tests: no
// shipped file needs it.
//
// What it proves: the planner (batching, continuation, slots, tags, asgd_'s
// stochastic rounding words), the entry building and dtype grouping, every
// body's indexing, vector/scalar paths, loads and stores, dtype dispatch, the
// launch sequence, and that every launch's parameters fit the layout's budget
// (4 KB for the classic layout the CUDA executor uses under graph capture),
// and a phased body's use of its shared memory across barriers. What it
// cannot: the device memory model and races, streams, graph capture,
// occupancy and speed, and device math libraries (pow in the schedule, pow
// and hypot in tensor_norms).
#pragma once

#include "../csrc/ops/cuda/kernels/asgd_kernels.h"
#include "../csrc/ops/cuda/kernels/multi_tensor_apply.h"
#include "../csrc/ops/cuda/kernels/norms_kernels.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace torchext {
namespace kernels {

enum class BlockOrder { kForward, kReverse, kShuffled };

// Mistakes the runner plants on purpose, so that its tests can show that
// their comparisons catch them. Planner mistakes: the runner edits a
// launch's metadata before running it. Mistakes in tensor_norms' per-element
// math: the runner runs the same body with another NormFold (its template
// parameter, the elements' check, unscale and fold), one of the planted
// folds below; in asgd_'s stochastic rounding, the update body with another
// Rounding (its template parameter). The shipped planner, bodies and the
// CUDA executor know nothing of them.
enum class PlantedBug {
  kNone,
  kContinuationSkipsChunk,  // a tensor continued in the next launch loses a chunk
  kWrongSlot,               // the last tensor slot of a full launch points at the one before
  kDroppedPartial,          // a launch's last block never runs, unless it is a chunk 0
                            //   (tensor_norms: its partial is never written)
  kUnscaleNotRounded,       // tensor_norms folds x * inv_scale unrounded, not as unscale_ stores it
  kTailCheckSkipped,        // tensor_norms skips the inf/NaN check in a load's partial lanes
  kRoundingIndexFromChunk,  // asgd_'s stochastic rounding counts elements from the chunk,
                            //   not from the tensor's first element
  kRoundingOffsetDropped,   // asgd_'s stochastic rounding ignores rounding_offsets
};

namespace planted {

// x * inv_scale folded as computed in opmath, not rounded to the tensor's
// dtype (what a kernel multiplying after the cast, or by the norm, folds).
template <math::NormKind K, typename E>
struct UnroundedFold : NormFold<K, E> {
  using Base = NormFold<K, E>;
  using typename Base::acc_t;
  using typename Base::opmath_t;
  void operator()(const E (&lanes)[kILP], int valid, acc_t& acc, bool& bad, bool scale,
                  opmath_t inv, double p) const {
    if constexpr (Base::kPairs) {
      Base{}(lanes, valid, acc, bad, scale, inv, p);
    } else {
      for (int ii = 0; ii < valid; ++ii) {
        opmath_t v = static_cast<opmath_t>(lanes[ii]);
        bad = bad || math::non_finite(v);
        if (scale) v = math::mul(v, inv);
        acc = math::norm_fold<acc_t>(K, acc, static_cast<acc_t>(magnitude_of(v)), p);
      }
    }
  }
};

// The check skipped where a load has fewer than kILP elements (the scalar
// loop's last lanes of a chunk, the tail after the vector loop).
template <math::NormKind K, typename E>
struct TailUncheckedFold : NormFold<K, E> {
  using Base = NormFold<K, E>;
  using typename Base::acc_t;
  using typename Base::opmath_t;
  void operator()(const E (&lanes)[kILP], int valid, acc_t& acc, bool& bad, bool scale,
                  opmath_t inv, double p) const {
    bool unseen = false;
    Base{}(lanes, valid, acc, valid < kILP ? unseen : bad, scale, inv, p);
  }
};

// Stochastic rounding's element index counted from the chunk's start (each
// chunk draws the first chunk's bits again).
struct ChunkIndexedRounding : RoundStochastic {
  static int64_t first_index(int64_t offset, int64_t) { return offset; }
};
// The index counted from the tensor's start, not from its offset (a shard
// draws the bits of the unsharded tensor's first elements).
struct OffsetDroppedRounding : RoundStochastic {
  static int64_t first_index(int64_t, int64_t chunk_begin) { return chunk_begin; }
};

}  // namespace planted

// The body the runner runs for Body under a planted bug: Body itself, or
// tensor_norms' chunk body with a planted fold.
template <PlantedBug Bug, typename Body>
struct PlantedBody {
  using type = Body;
};
template <math::NormKind K, typename E, typename Meta>
struct PlantedBody<PlantedBug::kUnscaleNotRounded, NormChunkBody<K, E, Meta, NormFold<K, E>>> {
  using type = NormChunkBody<K, E, Meta, planted::UnroundedFold<K, E>>;
};
template <math::NormKind K, typename E, typename Meta>
struct PlantedBody<PlantedBug::kTailCheckSkipped, NormChunkBody<K, E, Meta, NormFold<K, E>>> {
  using type = NormChunkBody<K, E, Meta, planted::TailUncheckedFold<K, E>>;
};

// asgd_'s update body with a planted Rounding.
template <typename S, typename A, typename Meta>
struct PlantedBody<PlantedBug::kRoundingIndexFromChunk,
                   ASGDElementwise<S, A, Meta, RoundStochastic>> {
  using type = ASGDElementwise<S, A, Meta, planted::ChunkIndexedRounding>;
};
template <typename S, typename A, typename Meta>
struct PlantedBody<PlantedBug::kRoundingOffsetDropped,
                   ASGDElementwise<S, A, Meta, RoundStochastic>> {
  using type = ASGDElementwise<S, A, Meta, planted::OffsetDroppedRounding>;
};

struct RunCounts {
  int64_t launches = 0, blocks = 0, threads = 0, elements = 0;
};

template <PlantedBug Bug = PlantedBug::kNone>
class HostRunner {
 public:
  struct Options {
    LaunchLimits limits{};  // limits.layout: the parameter layout the plans use
    BlockOrder order = BlockOrder::kForward;
    uint64_t seed = 0;
    // Treat a CPU lr tensor as device memory (the schedule kernel then loads
    // it through its pointer, as for a CUDA lr tensor).
    bool lr_in_device_memory = false;
    // The byte scratch() fills its memory with: 0xFF (NaN doubles, -1
    // integers) stands for uninitialized device memory, which a plan must
    // never read before a kernel wrote it.
    uint8_t scratch_fill = 0xFF;
  };

  HostRunner() = default;
  explicit HostRunner(const Options& o) : opt_(o), rng_(o.seed) {}

  // ---- the executor interface (see CudaExecutor) ----
  static constexpr bool kLargeParams = true;
  void enter(const c10::Device&) {}
  const LaunchLimits& limits() const { return opt_.limits; }
  bool kernel_reads(const at::Tensor& t) const {
    return opt_.lr_in_device_memory || !t.device().is_cpu();
  }
  // Scratch for `count` pointers. The real one is uninitialized device
  // memory; here each pointer points at a private sink, so a row a buggy
  // plan never writes shows up as a missing update instead of a crash.
  at::Tensor pointer_table(int64_t count) {
    at::Tensor t = at::empty({count}, at::kLong);
    std::fill_n(static_cast<void**>(t.data_ptr()), count, static_cast<void*>(sink_));
    return t;
  }
  // Scratch of `bytes` bytes (the real one is uninitialized device memory).
  at::Tensor scratch(int64_t bytes) {
    at::Tensor t = at::empty({bytes}, at::kByte);
    if (bytes > 0) std::memset(t.data_ptr(), opt_.scratch_fill, static_cast<size_t>(bytes));
    return t;
  }
  template <typename Body, typename... Args>
  void launch(unsigned blocks, unsigned threads, const Args&... args) {
    static_assert(kernel_param_bytes<Args...>() <= param_budget(ParamLayout::kLarge),
                  "kernel arguments too large");
    // What CUDA would refuse at launch, or what the layout does not allow.
    TORCH_CHECK(kernel_param_bytes<Args...>() <= param_budget(opt_.limits.layout), "host runner: ",
                Body::kName, " passes ", kernel_param_bytes<Args...>(),
                " bytes of parameters, over its layout's ", param_budget(opt_.limits.layout));
    TORCH_CHECK(blocks >= 1 && blocks <= INT32_MAX, "host runner: ", Body::kName,
                " launched with ", blocks, " blocks");
    TORCH_CHECK(threads >= 1 && threads <= 1024, "host runner: ", Body::kName,
                " launched with ", threads, " threads per block");
    // Kernel arguments are copies.
    std::tuple<Args...> params(args...);
    if constexpr (Bug != PlantedBug::kNone) {
      std::apply([&](auto&... a) { (plant(a, blocks), ...); }, params);
      if (blocks == 0) return;
    }
    std::vector<unsigned> block_ids(blocks), thread_ids(threads);
    std::iota(block_ids.begin(), block_ids.end(), 0u);
    std::iota(thread_ids.begin(), thread_ids.end(), 0u);
    if (opt_.order == BlockOrder::kReverse) {
      std::reverse(block_ids.begin(), block_ids.end());
      std::reverse(thread_ids.begin(), thread_ids.end());
    } else if (opt_.order == BlockOrder::kShuffled) {
      std::shuffle(block_ids.begin(), block_ids.end(), rng_);
    }
    using Run = typename PlantedBody<Bug, Body>::type;
    const Run body{};
    for (const unsigned b : block_ids) {
      if constexpr (is_phased_body<Run>::value) {
        typename Run::Shared shared;
        std::memset(static_cast<void*>(&shared), 0xFF, sizeof(shared));
        for (int phase = 0; phase < Run::phases(threads); ++phase) {
          if (opt_.order == BlockOrder::kShuffled) {
            std::shuffle(thread_ids.begin(), thread_ids.end(), rng_);
          }
          for (const unsigned t : thread_ids) {
            std::apply(
                [&](const auto&... a) { body(ThreadCtx{b, t, threads}, phase, shared, a...); },
                params);
          }
        }
      } else {
        if (opt_.order == BlockOrder::kShuffled) {
          std::shuffle(thread_ids.begin(), thread_ids.end(), rng_);
        }
        for (const unsigned t : thread_ids) {
          std::apply([&](const auto&... a) { body(ThreadCtx{b, t, threads}, a...); }, params);
        }
      }
    }
    RunCounts& c = counts_[op_ + Body::kName];
    ++c.launches;
    c.blocks += blocks;
    c.threads += static_cast<int64_t>(blocks) * threads;
    c.elements += std::apply([&](const auto&... a) { return Body::work(blocks, threads, a...); },
                             params);
  }

  // ---- statistics ----
  // A label put before the kernel names of the next launches ("unscale_: ").
  void set_op(std::string op) { op_ = std::move(op); }
  const std::map<std::string, RunCounts>& counts() const { return counts_; }

 private:
  // ---- planted bugs ----
  template <typename T>
  void plant(T&, unsigned&) const {}
  template <int Depth, int MaxTensors, int MaxBlocks>
  void plant(TensorListMeta<Depth, MaxTensors, MaxBlocks>& meta, unsigned& nblocks) const {
    if constexpr (Bug == PlantedBug::kWrongSlot) {
      // The planner's slot limit for this metadata (multi_tensor_apply).
      const int max_tensors = opt_.limits.max_tensors > 0
                                  ? std::min(opt_.limits.max_tensors, MaxTensors)
                                  : MaxTensors;
      if (max_tensors < 2) return;
      for (unsigned b = 0; b < nblocks; ++b) {
        if (meta.block_tensor[b] == max_tensors - 1) {
          using slot_t = typename TensorListMeta<Depth, MaxTensors, MaxBlocks>::slot_t;
          meta.block_tensor[b] = static_cast<slot_t>(max_tensors - 2);
        }
      }
    } else if constexpr (Bug == PlantedBug::kDroppedPartial) {
      if (nblocks > 0 && meta.block_chunk[nblocks - 1] != 0) --nblocks;
    } else if constexpr (Bug == PlantedBug::kContinuationSkipsChunk) {
      if (nblocks == 0 || meta.block_chunk[0] == 0) return;  // not a continuation
      // Its first chunk is lost: the blocks after it move down one.
      for (unsigned b = 1; b < nblocks; ++b) {
        meta.block_tensor[b - 1] = meta.block_tensor[b];
        meta.block_chunk[b - 1] = meta.block_chunk[b];
      }
      --nblocks;
    }
  }

  Options opt_{};
  std::mt19937_64 rng_{0};
  std::string op_;
  std::map<std::string, RunCounts> counts_;
  alignas(16) double sink_[4] = {0, 0, 0, 0};
};

}  // namespace kernels
}  // namespace torchext

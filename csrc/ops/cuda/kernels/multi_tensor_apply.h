// Multi-tensor apply, compiled by the host compiler and by nvcc alike: the
// launch metadata, the planner that cuts a list of tensors into launches, and
// the loop every elementwise kernel body runs over its chunk.
//
// A kernel body is a stateless struct whose C10_HOST_DEVICE operator() takes
// a ThreadCtx (block, thread, threads per block) and the launch's arguments.
// The CUDA kernels (csrc/ops/cuda/launch.cuh) are one generic __global__ wrapper
// that calls it with blockIdx.x / threadIdx.x / blockDim.x; the host runner
// (cpp_tests/host_runner.h) calls it for every block and thread of the same launches on
// the CPU. The host-side launch code of each op family (asgd_kernels.h, amp_kernels.h,
// swap_kernels.h) is a template over the executor, so both run the same plan.
//
// A body whose threads must cooperate (a block-wide reduction) is a phased
// body (is_phased_body): it names its shared memory (Body::Shared) and runs
// in Body::phases(threads per block) phases, called as
// body(ctx, phase, shared, args...); every thread of a block finishes phase k
// before any starts phase k + 1 (__syncthreads() on the device; the host
// runner runs a block phase by phase).
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__CUDACC__)
#define TORCHEXT_UNROLL _Pragma("unroll")
#else
#define TORCHEXT_UNROLL
#endif

namespace torchext {
namespace kernels {

// The production launch shape: torch's multi-tensor apply's, except that
// lists of tensors of at most 256K elements on average get smaller chunks
// (auto_chunk_size), and that eager launches carry up to 32 KB of metadata
// (ParamLayout).
constexpr int64_t kChunkSize = 65536;    // elements per block, at most
constexpr int64_t kMinChunkSize = 4096;  // elements per block, at least (auto)
constexpr int kChunksPerTensor = 8;      // what auto_chunk_size aims for
constexpr unsigned kBlockSize = 512;     // threads per block
constexpr int kILP = 4;                  // elements per thread per iteration

// How many bytes of kernel parameters a launch passes, and so how many
// tensors and blocks its metadata holds.
//   kClassic: 4,096 bytes, what every CUDA version and GPU accepts: 320
//     blocks per launch (torch's figure) and a uint8 block-to-slot index.
//   kLarge: 32,764 bytes, what CUDA 12.1 and newer accept on Volta and newer
//     (NVIDIA's "CUDA 12.1 Supports Large Kernel Parameters"): 2,048 blocks
//     per launch and a uint16 index. A uint8 index would cap a launch at 256
//     tensors: 1000 x 1K asgd_ would then take 4 update launches, not 2.
// The CUDA executor (launch.cuh) picks kLarge for eager launches in CUDA 13
// builds and kClassic while the stream captures a CUDA graph; the host
// runner runs both.
enum class ParamLayout : uint8_t { kClassic, kLarge };

constexpr size_t param_budget(ParamLayout layout) {
  return layout == ParamLayout::kLarge ? 32764 : 4096;
}
constexpr int max_blocks(ParamLayout layout) {
  return layout == ParamLayout::kLarge ? 2048 : 320;
}

constexpr size_t round_up(size_t n, size_t align) { return (n + align - 1) / align * align; }

// The bytes a kernel's parameters take, laid out one after the other as
// their alignment asks.
template <typename... Args>
constexpr size_t kernel_param_bytes() {
  size_t n = 0;
  ((n = round_up(n, alignof(Args)) + sizeof(Args)), ...);
  return n;
}

struct ThreadCtx {
  unsigned block;     // blockIdx.x
  unsigned thread;    // threadIdx.x
  unsigned nthreads;  // blockDim.x
};

// Whether Body is a phased body (see the top of this file): it has a Shared type.
template <typename Body, typename = void>
struct is_phased_body : std::false_type {};
template <typename Body>
struct is_phased_body<Body, std::void_t<typename Body::Shared>> : std::true_type {};

// The steps of a tree reduction over n values: ceil(log2(n)).
C10_HOST_DEVICE inline int tree_steps(unsigned n) {
  int steps = 0;
  while ((1u << steps) < n) ++steps;
  return steps;
}

// How the planner cuts lists into launches. The CUDA executor sets only the
// layout; the host runner's tests also use small values, so that a handful
// of small tensors already continue across launches.
struct LaunchLimits {
  int64_t chunk_size = 0;  // a positive multiple of kILP, or 0: auto_chunk_size
  int max_blocks = 0;      // 0: as many as the metadata holds
  int max_tensors = 0;     // 0: as many as the metadata holds
  unsigned block_size = kBlockSize;
  ParamLayout layout = ParamLayout::kLarge;
};

// Which tensors a launch covers (slots) and which chunk each block works on.
// ptrs[k][slot]: the k-th pointer of a slot's tensor; tag[slot]: a per-tensor
// integer the op defines (asgd_: its row in the schedule table).
template <int Depth, int MaxTensors, int MaxBlocks>
struct TensorListMeta {
  static_assert(MaxTensors >= 1 && MaxTensors <= 65536 && MaxBlocks >= 1, "bad metadata shape");
  using slot_t = std::conditional_t<(MaxTensors <= 256), uint8_t, uint16_t>;
  static constexpr int kDepth = Depth;
  static constexpr int kMaxTensors = MaxTensors;
  static constexpr int kMaxBlocks = MaxBlocks;
  void* ptrs[Depth][MaxTensors];
  int64_t numel[MaxTensors];
  int32_t tag[MaxTensors];
  int64_t chunk_size;
  slot_t block_tensor[MaxBlocks];   // the slot a block works on
  int32_t block_chunk[MaxBlocks];   // which chunk of that tensor
};

// sizeof(TensorListMeta<depth, tensors, blocks>), as a constexpr function.
constexpr size_t meta_bytes(int depth, int tensors, int blocks) {
  const size_t slot = tensors <= 256 ? 1 : 2;
  size_t n = round_up((8 * static_cast<size_t>(depth) + 8 + 4) * tensors, 8) + 8;
  n = round_up(n + slot * blocks, 4) + 4 * static_cast<size_t>(blocks);
  return round_up(n, 8);
}
static_assert(meta_bytes(6, 340, 2048) == sizeof(TensorListMeta<6, 340, 2048>));
static_assert(meta_bytes(1, 123, 320) == sizeof(TensorListMeta<1, 123, 320>));
static_assert(meta_bytes(2, 257, 7) == sizeof(TensorListMeta<2, 257, 7>));

// The most tensors a launch in `layout` holds next to `other_bytes` of other
// kernel arguments (which come after the metadata).
constexpr int max_tensors(int depth, ParamLayout layout, size_t other_bytes) {
  int tensors = 1;
  while (meta_bytes(depth, tensors + 1, max_blocks(layout)) + other_bytes <=
         param_budget(layout)) {
    ++tensors;
  }
  return tensors;
}

// The metadata of a launch with `Depth` pointers per tensor, in `Layout`,
// followed by kernel arguments of `OtherArgBytes` bytes: as many tensors and
// blocks as the parameters allow.
template <int Depth, ParamLayout Layout, size_t OtherArgBytes>
using MetaFor =
    TensorListMeta<Depth, max_tensors(Depth, Layout, OtherArgBytes), max_blocks(Layout)>;

// A type passed as a value (to generic lambdas).
template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(std::integral_constant<ParamLayout, L>{}) for `layout`. An
// executor that cannot launch the large layout (AllowLarge false) never
// instantiates it.
template <bool AllowLarge = true, typename Fn>
void with_param_layout(ParamLayout layout, const Fn& fn) {
  if constexpr (AllowLarge) {
    if (layout == ParamLayout::kLarge) {
      return fn(std::integral_constant<ParamLayout, ParamLayout::kLarge>{});
    }
  }
  TORCH_CHECK(layout == ParamLayout::kClassic, "multi_tensor_apply: large layout not compiled");
  fn(std::integral_constant<ParamLayout, ParamLayout::kClassic>{});
}

// One tensor to process: Depth pointers (which of them a body walks is its
// own business) and the number of elements.
template <int Depth>
struct TensorEntry {
  std::array<void*, Depth> ptrs;
  int64_t numel;
  int32_t tag = 0;
};

// The chunk size for a list of `count` tensors holding `total` elements: the
// power of two from kMinChunkSize to kChunkSize that cuts the mean tensor
// into about kChunksPerTensor chunks. Why: one 512-thread block keeps too
// few loads in flight to draw more than a small share of one SM's bandwidth.
// With one 64K chunk per tensor, a list of 50K-element tensors got 36 blocks
// per launch in the classic layout (36 asgd_ tensors), a quarter of an
// H200's SMs, and ran at 11-21 % of the memory bound; cut in 8K chunks, the
// same tensors make 7 blocks each. Lists whose tensors hold more than 256K
// elements on average keep torch's 64K chunks.
inline int64_t auto_chunk_size(int64_t total, int64_t count) {
  const int64_t mean = count > 0 ? total / count : 0;
  int64_t chunk = kMinChunkSize;
  while (chunk < kChunkSize && chunk * kChunksPerTensor < mean) chunk *= 2;
  return chunk;
}

// The chunks of a tensor of `numel` elements: at least one (an empty
// tensor's block, when it gets one).
C10_HOST_DEVICE inline int64_t chunks_of(int64_t numel, int64_t chunk_size) {
  const int64_t n = (numel + chunk_size - 1) / chunk_size;
  return n > 1 ? n : 1;
}

// The chunk size multi_tensor_apply cuts `entries` into under `limits`.
template <int EntryDepth>
int64_t planned_chunk_size(const std::vector<TensorEntry<EntryDepth>>& entries,
                           const LaunchLimits& limits) {
  if (limits.chunk_size != 0) return limits.chunk_size;
  int64_t total = 0;
  for (const auto& entry : entries) total += entry.numel;
  return auto_chunk_size(total, static_cast<int64_t>(entries.size()));
}

// Whether a tensor without elements still gets a block (one, with nothing to
// walk): asgd_ needs every entry's block to record its schedule row.
enum class EmptyTensors { kSkip, kOneBlock };

// Calls launch(meta, nblocks) for each batch of chunks, in order. A launch is
// full when its blocks are, or when its tensor slots are and the last
// tensor's last chunk is in; a tensor whose chunks do not all fit continues
// in the next launch as slot 0, with its chunk numbers going on.
// Entries may carry more pointers than the metadata (EntryDepth > Depth):
// the first Depth go in.
template <typename Meta, int EntryDepth, typename Launch>
void multi_tensor_apply(const std::vector<TensorEntry<EntryDepth>>& entries,
                        const LaunchLimits& limits, EmptyTensors empty, Launch&& launch) {
  constexpr int Depth = Meta::kDepth;
  static_assert(EntryDepth >= Depth, "entries carry fewer pointers than the metadata");
  using slot_t = typename Meta::slot_t;
  const int64_t chunk_size = planned_chunk_size(entries, limits);
  TORCH_CHECK(chunk_size > 0 && chunk_size % kILP == 0,
              "multi_tensor_apply: chunk size must be a positive multiple of ", kILP);
  const int max_blocks = limits.max_blocks > 0 ? std::min(limits.max_blocks, Meta::kMaxBlocks)
                                               : Meta::kMaxBlocks;
  const int max_tensors = limits.max_tensors > 0 ? std::min(limits.max_tensors, Meta::kMaxTensors)
                                                 : Meta::kMaxTensors;
  Meta meta;
  meta.chunk_size = chunk_size;
  int ntensors = 0;
  int nblocks = 0;
  for (const auto& entry : entries) {
    if (entry.numel == 0 && empty == EmptyTensors::kSkip) continue;
    for (int d = 0; d < Depth; ++d) meta.ptrs[d][ntensors] = entry.ptrs[d];
    meta.numel[ntensors] = entry.numel;
    meta.tag[ntensors] = entry.tag;
    ++ntensors;
    const int64_t nchunks = chunks_of(entry.numel, chunk_size);
    TORCH_CHECK(nchunks - 1 <= INT32_MAX, "multi_tensor_apply: tensor too large");
    for (int64_t chunk = 0; chunk < nchunks; ++chunk) {
      meta.block_tensor[nblocks] = static_cast<slot_t>(ntensors - 1);
      meta.block_chunk[nblocks] = static_cast<int32_t>(chunk);
      ++nblocks;
      const bool last_chunk = chunk == nchunks - 1;
      const bool blocks_full = nblocks == max_blocks;
      const bool tensors_full = ntensors == max_tensors && last_chunk;
      if (blocks_full || tensors_full) {
        launch(static_cast<const Meta&>(meta), nblocks);
        nblocks = 0;
        if (last_chunk) {
          ntensors = 0;
        } else {
          // The tensor continues in the next launch: it becomes slot 0.
          for (int d = 0; d < Depth; ++d) meta.ptrs[d][0] = meta.ptrs[d][ntensors - 1];
          meta.numel[0] = meta.numel[ntensors - 1];
          meta.tag[0] = meta.tag[ntensors - 1];
          ntensors = 1;
        }
      }
    }
  }
  if (nblocks > 0) launch(static_cast<const Meta&>(meta), nblocks);
}

// The chunk block `block` works on: its slot, its first element, and how many
// elements it has (at most the chunk size; 0 for an empty tensor's block).
struct BlockChunk {
  int slot;
  int64_t begin;
  int64_t n;
  bool first;  // chunk 0 of its tensor
};

template <typename Meta>
C10_HOST_DEVICE inline BlockChunk block_chunk(const Meta& meta, unsigned block) {
  const int slot = meta.block_tensor[block];
  const int64_t chunk = meta.block_chunk[block];
  const int64_t begin = chunk * meta.chunk_size;
  const int64_t left = meta.numel[slot] - begin;
  return {slot, begin, left < meta.chunk_size ? left : meta.chunk_size, chunk == 0};
}

// Elements a multi-tensor launch covers (the host runner's statistics).
template <typename Meta>
int64_t elements_in_launch(const Meta& meta, unsigned nblocks) {
  int64_t total = 0;
  for (unsigned b = 0; b < nblocks; ++b) total += std::max<int64_t>(0, block_chunk(meta, b).n);
  return total;
}

// kILP elements moved by one aligned load or store.
template <typename T>
struct alignas(sizeof(T) * kILP) AlignedVector {
  T val[kILP];
};

template <typename T>
C10_HOST_DEVICE inline bool is_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (kILP * sizeof(T)) == 0;
}

// Where a load's lanes lie in the chunk: lane ii holds element
// at[ii] = first + ii * stride (consecutive in the vector loop, blockDim
// apart in the scalar loop), so that a body whose math depends on an
// element's position gets the same index on either path.
struct LaneIndex {
  int64_t first;
  int64_t stride;
  C10_HOST_DEVICE int64_t operator[](int ii) const { return first + ii * stride; }
};

// Whether fn takes the lanes' indices after its arguments Args: only then
// do the loops below make a LaneIndex (a body without it compiles as if
// LaneIndex did not exist).
template <typename Fn, typename... Args>
constexpr bool kTakesLaneIndex = std::is_invocable_v<const Fn&, Args&..., const LaneIndex&>;

// The loop of every elementwise body, as torch's multi-tensor functors have
// it. When all N pointers are aligned to kILP elements, each thread moves
// kILP-element vectors with one aligned load or store per pointer, and the
// last n % kILP elements go one per thread; otherwise each thread takes kILP
// elements per iteration, blockDim apart, each load and store bounds-checked
// (lanes past the end hold T{} and are not stored). fn(r) computes in place
// on r[k][0..kILP), the values of pointer k; the first nstore pointers are
// stored back. A reduction, which must not fold the T{} lanes, takes
// fn(r, valid) instead: lanes [0, valid) hold elements (kILP in the vector
// loop; in the scalar loop a thread's lanes past the end come last). A body
// that needs each lane's element index in the chunk takes fn(r, at), a
// LaneIndex (lanes past the end are not stored, whatever their index).
template <typename Fn, typename R>
C10_HOST_DEVICE inline void call_with_lanes(const Fn& fn, R& r, int valid) {
  if constexpr (std::is_invocable_v<const Fn&, R&, int>) {
    fn(r, valid);
  } else {
    fn(r);
  }
}

template <int N, typename T, typename Fn>
C10_HOST_DEVICE inline void chunk_loop(const ThreadCtx& ctx, T* const (&ptrs)[N], int64_t n,
                                       int nstore, const Fn& fn) {
  bool aligned = true;
  TORCHEXT_UNROLL
  for (int k = 0; k < N; ++k) aligned = aligned && is_aligned(ptrs[k]);
  int64_t tail = 0;
  if (aligned) {
    const int64_t nvec = n / kILP;
    for (int64_t v = ctx.thread; v < nvec; v += ctx.nthreads) {
      T r[N][kILP];
      TORCHEXT_UNROLL
      for (int k = 0; k < N; ++k) {
        const AlignedVector<T> x = reinterpret_cast<const AlignedVector<T>*>(ptrs[k])[v];
        TORCHEXT_UNROLL
        for (int ii = 0; ii < kILP; ++ii) r[k][ii] = x.val[ii];
      }
      if constexpr (kTakesLaneIndex<Fn, T[N][kILP]>) {
        fn(r, LaneIndex{v * kILP, 1});
      } else {
        call_with_lanes(fn, r, kILP);
      }
      TORCHEXT_UNROLL
      for (int k = 0; k < N; ++k) {
        if (k < nstore) {
          AlignedVector<T> x;
          TORCHEXT_UNROLL
          for (int ii = 0; ii < kILP; ++ii) x.val[ii] = r[k][ii];
          reinterpret_cast<AlignedVector<T>*>(ptrs[k])[v] = x;
        }
      }
    }
    tail = nvec * kILP;
  }
  const int64_t stride = static_cast<int64_t>(ctx.nthreads) * kILP;
  for (int64_t base = tail; base < n; base += stride) {
    T r[N][kILP];
    int valid = 0;
    TORCHEXT_UNROLL
    for (int ii = 0; ii < kILP; ++ii) {
      const int64_t i = base + ctx.thread + static_cast<int64_t>(ii) * ctx.nthreads;
      valid += i < n ? 1 : 0;
      TORCHEXT_UNROLL
      for (int k = 0; k < N; ++k) r[k][ii] = i < n ? ptrs[k][i] : T{};
    }
    if constexpr (kTakesLaneIndex<Fn, T[N][kILP]>) {
      fn(r, LaneIndex{base + ctx.thread, ctx.nthreads});
    } else {
      call_with_lanes(fn, r, valid);
    }
    TORCHEXT_UNROLL
    for (int ii = 0; ii < kILP; ++ii) {
      const int64_t i = base + ctx.thread + static_cast<int64_t>(ii) * ctx.nthreads;
      if (i < n) {
        TORCHEXT_UNROLL
        for (int k = 0; k < N; ++k) {
          if (k < nstore) ptrs[k][i] = r[k][ii];
        }
      }
    }
  }
}

// chunk_loop with one more pointer of another element type U (a float32
// average beside fp16/bf16 parameters): fn(r, u) computes in place on r as
// chunk_loop's fn does and on u[0..kILP), the values of `extra`, which is
// always stored back; fn(r, u, at) also gets the lanes' indices (LaneIndex).
// The vector loop needs every pointer, `extra` included, aligned to kILP of
// its own elements. (chunk_loop itself keeps its single type: most bodies
// have one, and its loads then stay one type wide.)
template <int N, typename T, typename U, typename Fn>
C10_HOST_DEVICE inline void chunk_loop_with(const ThreadCtx& ctx, T* const (&ptrs)[N], U* extra,
                                            int64_t n, int nstore, const Fn& fn) {
  bool aligned = is_aligned(extra);
  TORCHEXT_UNROLL
  for (int k = 0; k < N; ++k) aligned = aligned && is_aligned(ptrs[k]);
  int64_t tail = 0;
  if (aligned) {
    const int64_t nvec = n / kILP;
    for (int64_t v = ctx.thread; v < nvec; v += ctx.nthreads) {
      T r[N][kILP];
      TORCHEXT_UNROLL
      for (int k = 0; k < N; ++k) {
        const AlignedVector<T> x = reinterpret_cast<const AlignedVector<T>*>(ptrs[k])[v];
        TORCHEXT_UNROLL
        for (int ii = 0; ii < kILP; ++ii) r[k][ii] = x.val[ii];
      }
      AlignedVector<U> u = reinterpret_cast<const AlignedVector<U>*>(extra)[v];
      if constexpr (kTakesLaneIndex<Fn, T[N][kILP], U[kILP]>) {
        fn(r, u.val, LaneIndex{v * kILP, 1});
      } else {
        fn(r, u.val);
      }
      TORCHEXT_UNROLL
      for (int k = 0; k < N; ++k) {
        if (k < nstore) {
          AlignedVector<T> x;
          TORCHEXT_UNROLL
          for (int ii = 0; ii < kILP; ++ii) x.val[ii] = r[k][ii];
          reinterpret_cast<AlignedVector<T>*>(ptrs[k])[v] = x;
        }
      }
      reinterpret_cast<AlignedVector<U>*>(extra)[v] = u;
    }
    tail = nvec * kILP;
  }
  const int64_t stride = static_cast<int64_t>(ctx.nthreads) * kILP;
  for (int64_t base = tail; base < n; base += stride) {
    T r[N][kILP];
    U u[kILP];
    TORCHEXT_UNROLL
    for (int ii = 0; ii < kILP; ++ii) {
      const int64_t i = base + ctx.thread + static_cast<int64_t>(ii) * ctx.nthreads;
      TORCHEXT_UNROLL
      for (int k = 0; k < N; ++k) r[k][ii] = i < n ? ptrs[k][i] : T{};
      u[ii] = i < n ? extra[i] : U{};
    }
    if constexpr (kTakesLaneIndex<Fn, T[N][kILP], U[kILP]>) {
      fn(r, u, LaneIndex{base + ctx.thread, ctx.nthreads});
    } else {
      fn(r, u);
    }
    TORCHEXT_UNROLL
    for (int ii = 0; ii < kILP; ++ii) {
      const int64_t i = base + ctx.thread + static_cast<int64_t>(ii) * ctx.nthreads;
      if (i < n) {
        TORCHEXT_UNROLL
        for (int k = 0; k < N; ++k) {
          if (k < nstore) ptrs[k][i] = r[k][ii];
        }
        extra[i] = u[ii];
      }
    }
  }
}

// A per-tensor scalar stored as float32 or float64.
C10_HOST_DEVICE inline double load_scalar(const void* p, bool is_double) {
  return is_double ? *static_cast<const double*>(p) : *static_cast<const float*>(p);
}
C10_HOST_DEVICE inline void store_scalar(void* p, bool is_double, double v) {
  if (is_double) {
    *static_cast<double*>(p) = v;
  } else {
    *static_cast<float*>(p) = static_cast<float>(v);
  }
}

// Blocks for n work items at `threads` per block (a launch needs at least one).
inline unsigned blocks_for(int64_t n, unsigned threads) {
  const int64_t b = (n + threads - 1) / threads;
  TORCH_CHECK(b >= 1 && b <= INT32_MAX, "launch: bad block count ", b);
  return static_cast<unsigned>(b);
}

}  // namespace kernels
}  // namespace torchext

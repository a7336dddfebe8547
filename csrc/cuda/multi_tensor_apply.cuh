// Multi-tensor apply: one kernel launch covers many tensors. Each CUDA block
// processes one chunk of kChunkSize elements of one tensor; the tensor
// addresses travel in the kernel arguments (kept under the classic 4 KB
// limit), and a list longer than one launch holds is cut into batches.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <vector>

namespace torchext {
namespace cuda {

constexpr int64_t kChunkSize = 65536;
constexpr int kBlockSize = 512;

// How many tensors fit in one launch, for `Depth` pointers per tensor.
constexpr int max_tensors_for_depth(int depth) {
  return depth <= 1 ? 110 : depth <= 2 ? 64 : depth <= 3 ? 48 : depth <= 5 ? 36 : 24;
}
constexpr int kMaxBlocks = 320;

template <int Depth>
struct TensorListMeta {
  static constexpr int kMaxTensors = max_tensors_for_depth(Depth);
  void* ptrs[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  uint8_t block_tensor[kMaxBlocks];  // which tensor slot a block works on
  int32_t block_chunk[kMaxBlocks];   // which chunk of that tensor
};
static_assert(sizeof(TensorListMeta<5>) + 128 <= 4096, "kernel argument too large");
static_assert(sizeof(TensorListMeta<1>) + 128 <= 4096, "kernel argument too large");

// One tensor to process: `Depth` device pointers (the first ones chunked by
// the kernel, the rest per-tensor extras such as eta/mu) and its numel.
template <int Depth>
struct TensorEntry {
  std::array<void*, Depth> ptrs;
  int64_t numel;
};

// Calls launch(meta, num_blocks) for each batch of chunks, in order.
template <int Depth, typename Launch>
void multi_tensor_apply(const std::vector<TensorEntry<Depth>>& entries, Launch&& launch) {
  using Meta = TensorListMeta<Depth>;
  Meta meta;
  int ntensors = 0;
  int nblocks = 0;
  for (size_t e = 0; e < entries.size(); ++e) {
    const auto& entry = entries[e];
    if (entry.numel == 0) continue;
    for (int d = 0; d < Depth; ++d) meta.ptrs[d][ntensors] = entry.ptrs[d];
    meta.numel[ntensors] = entry.numel;
    ++ntensors;
    const int64_t nchunks = (entry.numel + kChunkSize - 1) / kChunkSize;
    for (int64_t chunk = 0; chunk < nchunks; ++chunk) {
      TORCH_CHECK(chunk <= INT32_MAX, "multi_tensor_apply: tensor too large");
      meta.block_tensor[nblocks] = static_cast<uint8_t>(ntensors - 1);
      meta.block_chunk[nblocks] = static_cast<int32_t>(chunk);
      ++nblocks;
      const bool last_chunk = chunk == nchunks - 1;
      const bool blocks_full = nblocks == kMaxBlocks;
      const bool tensors_full = ntensors == Meta::kMaxTensors && last_chunk;
      if (blocks_full || tensors_full) {
        launch(meta, nblocks);
        nblocks = 0;
        if (last_chunk) {
          ntensors = 0;
        } else {
          // The tensor continues in the next batch: it becomes slot 0.
          for (int d = 0; d < Depth; ++d) meta.ptrs[d][0] = meta.ptrs[d][ntensors - 1];
          meta.numel[0] = meta.numel[ntensors - 1];
          ntensors = 1;
        }
      }
    }
  }
  if (nblocks > 0) launch(meta, nblocks);
}

// Loads a per-tensor scalar stored as float32 or float64.
__device__ __forceinline__ double load_scalar(const void* p, bool is_double) {
  return is_double ? *static_cast<const double*>(p) : *static_cast<const float*>(p);
}
__device__ __forceinline__ void store_scalar(void* p, bool is_double, double v) {
  if (is_double) {
    *static_cast<double*>(p) = v;
  } else {
    *static_cast<float*>(p) = static_cast<float>(v);
  }
}

}  // namespace cuda
}  // namespace torchext

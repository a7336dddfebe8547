// CUDA kernels of swap_, on the current stream, with no host sync and no
// scratch memory: pairs laid out alike go through multi-tensor apply (one
// launch per element size for all of them), other pairs through a strided
// kernel each. Elements are moved as raw words of their size, so every dtype
// (complex included) is swapped bit for bit.
#include "../swap_args.h"
#include "../dense_views.h"
#include "multi_tensor_apply.cuh"

#include <ATen/TensorIterator.h>
#include <ATen/cuda/detail/OffsetCalculator.cuh>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <map>
#include <vector>

namespace torchext {
namespace cuda {
namespace {

template <typename word_t>
__global__ void __launch_bounds__(kBlockSize) swap_flat_kernel(TensorListMeta<2> meta) {
  const int t = meta.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_chunk[blockIdx.x]) * kChunkSize;
  const int64_t end = ::min(meta.numel[t], begin + kChunkSize);
  auto* a = static_cast<word_t*>(meta.ptrs[0][t]);
  auto* b = static_cast<word_t*>(meta.ptrs[1][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const word_t x = a[i];
    a[i] = b[i];
    b[i] = x;
  }
}

template <typename word_t>
__global__ void __launch_bounds__(kBlockSize)
    swap_strided_kernel(word_t* a, word_t* b, OffsetCalculator<2> calc, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const auto off = calc.get(i);
  const word_t x = a[off[0]];
  a[off[0]] = b[off[1]];
  b[off[1]] = x;
}

// Calls fn(word_t{}) with an unsigned word type of `size` bytes.
template <typename Fn>
void with_word_type(int64_t size, const Fn& fn) {
  switch (size) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    case 16: return fn(ulonglong2{});
    default: TORCH_CHECK(false, "swap_: unsupported element size ", size);
  }
}

void swap_strided(const at::Tensor& a, const at::Tensor& b, cudaStream_t stream) {
  auto iter = strided_pair_iterator(a, b);  // overlap checked by check_swap_args
  for (auto& sub : iter.with_32bit_indexing()) {
    const auto n = static_cast<uint32_t>(sub.numel());
    if (n == 0) continue;
    const auto calc = make_offset_calculator<2>(sub);
    const unsigned blocks = (n + kBlockSize - 1) / kBlockSize;
    with_word_type(a.element_size(), [&](auto word) {
      using word_t = decltype(word);
      swap_strided_kernel<word_t><<<blocks, kBlockSize, 0, stream>>>(
          static_cast<word_t*>(sub.data_ptr(0)), static_cast<word_t*>(sub.data_ptr(1)), calc, n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
}

void swap_cuda(at::TensorList tensors, at::TensorList others) {
  check_swap_args(tensors, others);
  if (tensors.empty()) return;
  const c10::cuda::CUDAGuard guard(tensors[0].device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  std::map<int64_t, std::vector<TensorEntry<2>>> by_size;  // element size -> pairs
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& a = tensors[i];
    const at::Tensor& b = others[i];
    if (a.numel() == 0) continue;
    if (walkable_as_flat_pair(a, b)) {
      by_size[a.element_size()].push_back({{a.data_ptr(), b.data_ptr()}, a.numel()});
    } else {
      swap_strided(a, b, stream);
    }
  }
  for (auto& [size, entries] : by_size) {
    with_word_type(size, [&](auto word) {
      using word_t = decltype(word);
      multi_tensor_apply<2>(entries, [&](const TensorListMeta<2>& meta, int nblocks) {
        swap_flat_kernel<word_t><<<nblocks, kBlockSize, 0, stream>>>(meta);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
    });
  }
}

}  // namespace
}  // namespace cuda

TORCH_LIBRARY_IMPL(torchext, CUDA, m) { m.impl("swap_", &cuda::swap_cuda); }

}  // namespace torchext

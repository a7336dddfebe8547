// swap_ on an accelerator: kernel bodies (C10_HOST_DEVICE) and the host-side
// plan, a template over the executor like asgd_kernels.h (csrc/ops/cuda/swap_cuda.cu,
// cpp_tests/host_runner.h). Elements are moved as raw words of their size, so every
// dtype (complex included) is swapped bit for bit; no scratch memory.
#pragma once

#include "../../swap.h"
#include "../../../utils/dense_views.h"
#include "multi_tensor_apply.h"

#include <ATen/TensorIterator.h>
#include <ATen/cuda/detail/OffsetCalculator.cuh>

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

namespace torchext {
namespace kernels {

// A 16-byte element (complex128) as one word.
struct alignas(16) Word16 {
  uint64_t lo, hi;
};

// Two pointers per tensor, no other argument.
template <ParamLayout L>
using SwapMeta = MetaFor<2, L, 0>;

// Pairs laid out alike: both walked as flat buffers.
template <typename word_t, typename Meta>
struct SwapFlatBody {
  static constexpr const char* kName = "swap (flat)";
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, const Meta& meta) const {
    const BlockChunk bc = block_chunk(meta, ctx.block);
    if (bc.n <= 0) return;
    word_t* const ptrs[2] = {static_cast<word_t*>(meta.ptrs[0][bc.slot]) + bc.begin,
                             static_cast<word_t*>(meta.ptrs[1][bc.slot]) + bc.begin};
    chunk_loop(ctx, ptrs, bc.n, /*nstore=*/2, [](word_t (&r)[2][kILP]) {
      TORCHEXT_UNROLL
      for (int ii = 0; ii < kILP; ++ii) {
        const word_t x = r[0][ii];
        r[0][ii] = r[1][ii];
        r[1][ii] = x;
      }
    });
  }
  static int64_t work(unsigned nblocks, unsigned, const Meta& meta) {
    return elements_in_launch(meta, nblocks);
  }
};

// Any other pair: element i of each at the byte offsets the calculator gives
// (32-bit indexing: the plan splits larger pairs).
template <typename word_t>
struct SwapStridedBody {
  static constexpr const char* kName = "swap (strided)";
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, char* a, char* b,
                                  const OffsetCalculator<2>& calc, uint32_t n) const {
    const uint32_t i = ctx.block * ctx.nthreads + ctx.thread;
    if (i >= n) return;
    const auto off = calc.get(i);  // in bytes
    word_t* pa = reinterpret_cast<word_t*>(a + off[0]);
    word_t* pb = reinterpret_cast<word_t*>(b + off[1]);
    const word_t x = *pa;
    *pa = *pb;
    *pb = x;
  }
  static int64_t work(unsigned, unsigned, char*, char*, const OffsetCalculator<2>&, uint32_t n) {
    return n;
  }
};

// Calls fn(word_t{}) with a word type of `size` bytes.
template <typename Fn>
void with_word_type(int64_t size, const Fn& fn) {
  switch (size) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    case 16: return fn(Word16{});
    default: TORCH_CHECK(false, "swap_: unsupported element size ", size);
  }
}

template <typename Exec>
void swap_strided_launch(const at::Tensor& a, const at::Tensor& b, Exec& exec) {
  auto iter = strided_pair_iterator(a, b);  // overlap checked by check_swap_args
  for (auto& sub : iter.with_32bit_indexing()) {
    const auto n = static_cast<uint32_t>(sub.numel());
    if (n == 0) continue;
    const auto calc = make_offset_calculator<2>(sub);
    with_word_type(a.element_size(), [&](auto word) {
      using word_t = decltype(word);
      exec.template launch<SwapStridedBody<word_t>>(
          blocks_for(n, kBlockSize), kBlockSize, static_cast<char*>(sub.data_ptr(0)),
          static_cast<char*>(sub.data_ptr(1)), calc, n);
    });
  }
}

template <typename Exec>
void swap_launch(at::TensorList tensors, at::TensorList others, Exec& exec) {
  check_swap_args(tensors, others);
  if (tensors.empty()) return;
  exec.enter(tensors[0].device());
  const LaunchLimits limits = exec.limits();
  // Element size -> pairs; few sizes occur, so a linear search.
  std::vector<std::pair<int64_t, std::vector<TensorEntry<2>>>> by_size;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& a = tensors[i];
    const at::Tensor& b = others[i];
    if (a.numel() == 0) continue;
    if (!walkable_as_flat_pair(a, b)) {
      swap_strided_launch(a, b, exec);
      continue;
    }
    const int64_t size = static_cast<int64_t>(a.element_size());
    auto it = std::find_if(by_size.begin(), by_size.end(),
                           [&](const auto& grp) { return grp.first == size; });
    if (it == by_size.end()) {
      by_size.emplace_back(size, std::vector<TensorEntry<2>>{});
      it = std::prev(by_size.end());
    }
    it->second.push_back({{a.data_ptr(), b.data_ptr()}, a.numel()});
  }
  with_param_layout<Exec::kLargeParams>(limits.layout, [&](auto layout) {
    using Meta = SwapMeta<decltype(layout)::value>;
    for (auto& [size, entries] : by_size) {
      with_word_type(size, [&](auto word) {
        using word_t = decltype(word);
        multi_tensor_apply<Meta>(
            entries, limits, EmptyTensors::kSkip, [&](const Meta& meta, int nblocks) {
              exec.template launch<SwapFlatBody<word_t, Meta>>(static_cast<unsigned>(nblocks),
                                                               limits.block_size, meta);
            });
      });
    }
  });
}

}  // namespace kernels
}  // namespace torchext

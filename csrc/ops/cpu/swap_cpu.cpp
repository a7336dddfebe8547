// CPU kernel of swap_: exchanges the bytes of tensors[i] and others[i] in
// place. Pairs laid out alike are walked as flat buffers in chunks spread
// over the threads (chunks.h); other pairs element by element through a
// TensorIterator over both. The only scratch memory is a small stack buffer.
#include "../swap.h"
#include "../../utils/dense_views.h"
#include "chunks.h"

#include <ATen/TensorIterator.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace torchext {
namespace {

void swap_bytes(char* a, char* b, int64_t nbytes) {
  constexpr int64_t kBuf = 4096;
  alignas(64) char buf[kBuf];
  for (int64_t off = 0; off < nbytes; off += kBuf) {
    const auto n = static_cast<size_t>(std::min(kBuf, nbytes - off));
    std::memcpy(buf, a + off, n);
    std::memcpy(a + off, b + off, n);
    std::memcpy(b + off, buf, n);
  }
}

// Pairs whose layouts differ (or are not dense): strided, element by element.
void swap_strided(const at::Tensor& a, const at::Tensor& b) {
  auto iter = strided_pair_iterator(a, b);
  const int64_t esize = static_cast<int64_t>(a.element_size());
  iter.for_each([esize](char** data, const int64_t* strides, int64_t n) {
    char* pa = data[0];
    char* pb = data[1];
    for (int64_t i = 0; i < n; ++i, pa += strides[0], pb += strides[1]) {
      swap_bytes(pa, pb, esize);
    }
  });
}

void swap_cpu(at::TensorList tensors, at::TensorList others) {
  check_swap_args(tensors, others);
  std::vector<int64_t> nbytes;
  std::vector<std::pair<char*, char*>> ptrs;  // taken on the calling thread
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& a = tensors[i];
    const at::Tensor& b = others[i];
    if (a.numel() == 0) continue;
    if (!walkable_as_flat_pair(a, b)) {
      swap_strided(a, b);
      continue;
    }
    nbytes.push_back(static_cast<int64_t>(a.numel() * a.element_size()));
    ptrs.emplace_back(static_cast<char*>(a.data_ptr()), static_cast<char*>(b.data_ptr()));
  }
  cpu::for_each_chunk(nbytes, [&](const cpu::Chunk& ch) {
    swap_bytes(ptrs[ch.tensor].first + ch.begin, ptrs[ch.tensor].second + ch.begin,
               ch.end - ch.begin);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) { m.impl("swap_", &swap_cpu); }

}  // namespace torchext

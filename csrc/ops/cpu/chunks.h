// Work splitting shared by the CPU ops: every tensor is cut into chunks of at
// most kChunk elements, and at::parallel_for spreads the chunks of *all*
// tensors over the threads (not one task per tensor).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace torchext {
namespace cpu {

constexpr int64_t kChunk = 1 << 16;

struct Chunk {
  size_t tensor;
  int64_t begin, end;
};

// Runs fn(chunk) over every chunk of tensors with the given numels.
template <typename Fn>
void for_each_chunk(const std::vector<int64_t>& numels, const Fn& fn) {
  std::vector<Chunk> chunks;
  chunks.reserve(numels.size());
  int64_t total = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    total += numels[i];
    for (int64_t b = 0; b < numels[i]; b += kChunk) {
      chunks.push_back({i, b, std::min(numels[i], b + kChunk)});
    }
  }
  const int64_t n = static_cast<int64_t>(chunks.size());
  // Small steps stay on the calling thread: waking workers costs more.
  const int64_t grain = total < 4 * kChunk ? std::max<int64_t>(n, 1) : 1;
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) fn(chunks[c]);
  });
}

}  // namespace cpu
}  // namespace torchext

// Software prefetch of tensor metadata, for loops over thousands of small
// tensors. There the time goes to cache misses on each tensor's TensorImpl
// and StorageImpl (and a param's AutogradMeta, to read .grad): every entry is
// a chain of dependent misses, but entries are independent, so asking for
// entry i+k's lines while working on entry i overlaps the misses.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace torchext {

constexpr size_t kPrefetchImpl = 8;     // entries ahead: their TensorImpls
constexpr size_t kPrefetchStorage = 4;  // entries ahead: their StorageImpls

inline void prefetch_lines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off);
}

inline void prefetch_impl(const c10::TensorImpl* t) {
  prefetch_lines(t, sizeof(c10::TensorImpl));
}

// Reads t's storage pointer: call it once prefetch_impl(t) had time to land.
inline void prefetch_storage(const c10::TensorImpl* t) {
  if (t->has_storage()) {
    prefetch_lines(t->unsafe_storage().unsafeGetStorageImpl(), sizeof(c10::StorageImpl));
  }
}

}  // namespace torchext

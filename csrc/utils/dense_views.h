// Kernels work on flat, dense, real buffers. DenseTriple turns a
// (param, grad, ax) triple into such buffers: complex tensors become real
// views, and tensors whose layouts cannot be walked together as flat memory
// go through contiguous temporaries that write_back() copies home.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchext {

struct DenseTriple {
  at::Tensor p, g, ax;       // what the kernel reads and writes, flat
  at::Tensor p_home, ax_home;  // defined when p/ax are temporaries

  void write_back();
};

// Whether param, grad and ax can be walked together as flat memory as they
// are (complex ones as interleaved real pairs): then no DenseTriple is needed.
bool is_flat_triple(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& ax);

DenseTriple make_dense_triple(const at::Tensor& param, const at::Tensor& grad,
                              const at::Tensor& ax);

// A single tensor as a flat, dense, real buffer (for the AMP ops).
struct DenseOne {
  at::Tensor t;
  at::Tensor home;  // defined when t is a temporary
  void write_back();
};
DenseOne make_dense_one(const at::Tensor& t);

}  // namespace torchext

namespace at {
struct TensorIterator;
}

namespace torchext {

// Can a and b (same dtype and shape) be walked together as one flat buffer
// each, element i of one matching element i of the other?
bool walkable_as_flat_pair(const at::Tensor& a, const at::Tensor& b);

// A TensorIterator over a and b as two outputs (same dtype and shape, not
// overlapping: the caller has checked), for pairs that are not.
at::TensorIterator strided_pair_iterator(const at::Tensor& a, const at::Tensor& b);

}  // namespace torchext

#include "dense_views.h"

#include <ATen/TensorIterator.h>
#include <ATen/ops/view_as_real.h>
#include <c10/util/Exception.h>

namespace torchext {
namespace {

at::Tensor as_real(const at::Tensor& t) {
  return t.is_complex() ? at::view_as_real(t) : t;
}

// Can a, b be walked element for element as flat memory?
bool same_dense_layout(const at::Tensor& a, const at::Tensor& b) {
  return b.is_non_overlapping_and_dense() && a.strides() == b.strides();
}

}  // namespace

bool is_flat_triple(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& ax) {
  // A lazily conjugated tensor is not its memory (view_as_real refuses it).
  if (param.is_conj() || grad.is_conj() || ax.is_conj()) return false;
  if (param.is_contiguous() && grad.is_contiguous() && ax.is_contiguous()) return true;
  return param.is_non_overlapping_and_dense() && same_dense_layout(param, grad) &&
         same_dense_layout(param, ax);
}

DenseTriple make_dense_triple(const at::Tensor& param, const at::Tensor& grad,
                              const at::Tensor& ax) {
  DenseTriple d{as_real(param), as_real(grad), as_real(ax), {}, {}};
  if (is_flat_triple(d.p, d.g, d.ax)) return d;
  if (!d.p.is_contiguous()) {
    d.p_home = d.p;
    d.p = d.p.contiguous();
  }
  if (!d.ax.is_contiguous()) {
    d.ax_home = d.ax;
    d.ax = d.ax.contiguous();
  }
  d.g = d.g.contiguous();
  return d;
}

void DenseTriple::write_back() {
  if (p_home.defined()) p_home.copy_(p);
  if (ax_home.defined()) ax_home.copy_(ax);
}

DenseOne make_dense_one(const at::Tensor& t) {
  DenseOne d{as_real(t), {}};
  if (!d.t.is_non_overlapping_and_dense()) {
    d.home = d.t;
    d.t = d.t.contiguous();
  }
  return d;
}

void DenseOne::write_back() {
  if (home.defined()) home.copy_(t);
}

}  // namespace torchext

namespace torchext {

bool walkable_as_flat_pair(const at::Tensor& a, const at::Tensor& b) {
  return a.is_non_overlapping_and_dense() && same_dense_layout(a, b);
}

at::TensorIterator strided_pair_iterator(const at::Tensor& a, const at::Tensor& b) {
  return at::TensorIteratorConfig()
      .set_check_mem_overlap(false)
      .check_all_same_dtype(false)
      .resize_outputs(false)
      .add_output(a)
      .add_output(b)
      .build();
}

}  // namespace torchext

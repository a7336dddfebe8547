// CPU kernel of torchext::asgd_: one call covers the whole list, in chunks
// spread over threads (chunks.h); each chunk runs the
// shared per-element math (elementwise_math.h) in the per-ISA loops of
// isa_kernels_impl.h.
#include "../asgd_args.h"
#include "../dense_views.h"
#include "chunks.h"
#include "isa_kernels.h"
#include "torchext/elementwise_math.h"

#include <torch/library.h>

#include <vector>

namespace torchext {
namespace {

void asgd_cpu_impl(const ASGDArgs& a) {
  check_asgd_args(a);
  const size_t n = a.params.size();
  if (n == 0) return;
  if (a.found_inf.has_value() && read_cpu_scalar(*a.found_inf) != 0.0) {
    return;  // overflow this iteration: the whole step is a no-op
  }
  const bool unscale = a.grad_scale.has_value();
  // torch's GradScaler unscales with a float32 reciprocal computed in double.
  const float inv_scale =
      unscale ? static_cast<float>(1.0 / read_cpu_scalar(*a.grad_scale)) : 1.0f;
  const double lr = a.lr_tensor.has_value() ? read_cpu_scalar(*a.lr_tensor) : a.lr;

  std::vector<DenseTriple> dense;
  std::vector<double> etas(n), mus(n);
  dense.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    dense.push_back(make_dense_triple(a.params[i], a.grads[i], a.axs[i]));
    etas[i] = read_cpu_scalar(a.etas[i]);
    mus[i] = read_cpu_scalar(a.mus[i]);
  }

  // Raw pointers are taken here, on the calling thread, not in the workers.
  std::vector<cpu::ASGDSpan> spans(n);
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) {
    DenseTriple& d = dense[i];
    spans[i] = {d.p.scalar_type(), d.p.data_ptr(), d.ax.data_ptr(), d.g.const_data_ptr(),
                d.p.numel(), etas[i], mus[i], a.lambd, a.weight_decay, a.maximize, unscale,
                inv_scale};
    numels[i] = d.p.numel();
  }
  const auto& isa = cpu::kernels();
  cpu::for_each_chunk(numels, [&](const cpu::Chunk& ch) {
    cpu::ASGDSpan s = spans[ch.tensor];
    const int64_t offset = ch.begin * static_cast<int64_t>(c10::elementSize(s.dtype));
    s.p = static_cast<char*>(s.p) + offset;
    s.ax = static_cast<char*>(s.ax) + offset;
    s.g = static_cast<const char*>(s.g) + offset;
    s.n = ch.end - ch.begin;
    isa.asgd_span(s);
  });

  for (auto& d : dense) d.write_back();
  // The schedule, from the incremented step, once every chunk has read the
  // old eta and mu.
  for (size_t i = 0; i < n; ++i) {
    const double step = read_cpu_scalar(a.steps[i]) + 1.0;
    write_cpu_scalar(a.steps[i], step);
    write_cpu_scalar(a.etas[i], math::asgd_eta(lr, a.lambd, a.alpha, step));
    write_cpu_scalar(a.mus[i], math::asgd_mu(a.t0, step));
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("asgd_", &ASGDKernel<asgd_cpu_impl>::float_lr);
  m.impl("asgd_.tensor_lr", &ASGDKernel<asgd_cpu_impl>::tensor_lr);
}

}  // namespace torchext

// CPU kernel of torchext::asgd_: one call covers the whole list. The work is
// cut into chunks of at most kChunk elements across all tensors, and
// at::parallel_for spreads the chunks over threads; each chunk runs the
// shared per-element math (elementwise_math.h) on at::vec::Vectorized.
#include "../asgd_args.h"
#include "../dense_views.h"
#include "cpu_vec.h"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace torchext {
namespace {

template <typename T>
math::ASGDCoeffs<Vectorized<T>> broadcast(const math::ASGDCoeffs<T>& c) {
  return {Vectorized<T>(c.inv_scale), Vectorized<T>(c.weight_decay), Vectorized<T>(c.decay),
          Vectorized<T>(c.step_size), Vectorized<T>(c.mu), c.unscale, c.has_weight_decay,
          c.average};
}

// float / double: compute in the parameter's own type.
template <typename scalar_t>
void asgd_span(scalar_t* p, scalar_t* ax, const scalar_t* g, int64_t n,
               const math::ASGDCoeffs<scalar_t>& c) {
  using Vec = Vectorized<scalar_t>;
  const auto cv = broadcast(c);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec vp = Vec::loadu(p + i);
    Vec vax = Vec::loadu(ax + i);
    math::asgd_update(vp, vax, Vec::loadu(g + i), cv);
    vp.store(p + i);
    vax.store(ax + i);
  }
  for (; i < n; ++i) {
    scalar_t sp = p[i], sax = ax[i];
    math::asgd_update(sp, sax, g[i], c);
    p[i] = sp;
    ax[i] = sax;
  }
}

// float16 / bfloat16: load, compute in float32, round once on store.
template <typename scalar_t>
void asgd_span_reduced(scalar_t* p, scalar_t* ax, const scalar_t* g, int64_t n,
                       const math::ASGDCoeffs<float>& c) {
  using Vec = Vectorized<scalar_t>;
  const auto cv = broadcast(c);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    auto [p0, p1] = at::vec::convert_to_float<scalar_t>(Vec::loadu(p + i));
    auto [a0, a1] = at::vec::convert_to_float<scalar_t>(Vec::loadu(ax + i));
    auto [g0, g1] = at::vec::convert_to_float<scalar_t>(Vec::loadu(g + i));
    math::asgd_update(p0, a0, g0, cv);
    math::asgd_update(p1, a1, g1, cv);
    at::vec::convert_from_float<scalar_t>(p0, p1).store(p + i);
    at::vec::convert_from_float<scalar_t>(a0, a1).store(ax + i);
  }
  for (; i < n; ++i) {
    float sp = static_cast<float>(p[i]), sax = static_cast<float>(ax[i]);
    math::asgd_update(sp, sax, static_cast<float>(g[i]), c);
    p[i] = static_cast<scalar_t>(sp);
    ax[i] = static_cast<scalar_t>(sax);
  }
}

// Picks the span routine for the dtype (a template, so `if constexpr`
// discards the other branch).
template <typename scalar_t>
void asgd_span_any(scalar_t* p, scalar_t* ax, const scalar_t* g, int64_t n,
                   const math::ASGDCoeffs<at::opmath_type<scalar_t>>& c) {
  if constexpr (std::is_same_v<at::opmath_type<scalar_t>, scalar_t>) {
    asgd_span(p, ax, g, n, c);
  } else {
    asgd_span_reduced(p, ax, g, n, c);
  }
}

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

  // Chunks spanning all tensors: a big tensor gives many, small ones one each.
  constexpr int64_t kChunk = 1 << 16;
  struct Chunk {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  chunks.reserve(n);
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t numel = dense[i].p.numel();
    total += numel;
    for (int64_t b = 0; b < numel; b += kChunk) {
      chunks.push_back({i, b, std::min(numel, b + kChunk)});
    }
  }

  auto run_chunk = [&](const Chunk& ch) {
    DenseTriple& d = dense[ch.tensor];
    const int64_t len = ch.end - ch.begin;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, d.p.scalar_type(), "asgd_cpu", [&] {
      scalar_t* p = d.p.mutable_data_ptr<scalar_t>() + ch.begin;
      scalar_t* ax = d.ax.mutable_data_ptr<scalar_t>() + ch.begin;
      const scalar_t* g = d.g.const_data_ptr<scalar_t>() + ch.begin;
      using opmath_t = at::opmath_type<scalar_t>;
      const auto c = math::make_asgd_coeffs<opmath_t>(etas[ch.tensor], mus[ch.tensor], a.lambd,
                                                      a.weight_decay, a.maximize, unscale,
                                                      inv_scale);
      asgd_span_any(p, ax, g, len, c);
    });
  };
  // Small steps run on the calling thread: waking workers costs more.
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  const int64_t grain = total < 4 * kChunk ? std::max<int64_t>(nchunks, 1) : 1;
  at::parallel_for(0, nchunks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) run_chunk(chunks[c]);
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

void asgd_cpu(at::TensorList params, at::TensorList grads, at::TensorList axs,
              at::TensorList mus, at::TensorList etas, at::TensorList steps, double lr,
              double lambd, double alpha, double t0, double weight_decay, bool maximize,
              const std::optional<at::Tensor>& grad_scale,
              const std::optional<at::Tensor>& found_inf) {
  asgd_cpu_impl({params, grads, axs, mus, etas, steps, lr, std::nullopt, lambd, alpha, t0,
                 weight_decay, maximize, grad_scale, found_inf});
}

void asgd_cpu_tensor_lr(at::TensorList params, at::TensorList grads, at::TensorList axs,
                        at::TensorList mus, at::TensorList etas, at::TensorList steps,
                        const at::Tensor& lr, double lambd, double alpha, double t0,
                        double weight_decay, bool maximize,
                        const std::optional<at::Tensor>& grad_scale,
                        const std::optional<at::Tensor>& found_inf) {
  asgd_cpu_impl({params, grads, axs, mus, etas, steps, 0.0, lr, lambd, alpha, t0, weight_decay,
                 maximize, grad_scale, found_inf});
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("asgd_", &asgd_cpu);
  m.impl("asgd_.tensor_lr", &asgd_cpu_tensor_lr);
}

}  // namespace torchext

// CPU kernels of the AMP ops: check_finite_ (read-only), unscale_ (multiply
// and check in one pass) and update_scale_. Chunks span all tensors and run
// under at::parallel_for, like the ASGD kernel.
#include "../asgd_args.h"
#include "../dense_views.h"
#include "cpu_vec.h"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace torchext {
namespace {

constexpr int64_t kChunk = 1 << 16;

// x * 0 is 0 for finite x and NaN for inf/NaN, so a running sum of x * 0
// is NaN exactly when some element is not finite: no branch per element.
template <typename V>
inline V poison(const V& acc, const V& x) {
  return acc + x * V(0);
}

// Returns true if some element of [x, x + n) is not finite; multiplies the
// span by inv_scale in place when `scale` is set (one read, one write).
template <typename scalar_t>
bool scan_span(scalar_t* x, int64_t n, bool scale, float inv_scale) {
  using opmath_t = at::opmath_type<scalar_t>;
  using Vec = Vectorized<opmath_t>;
  const Vec vinv(static_cast<opmath_t>(inv_scale));
  Vec acc(0);
  opmath_t tail = 0;
  int64_t i = 0;
  if constexpr (std::is_same_v<opmath_t, scalar_t>) {
    for (; i + Vec::size() <= n; i += Vec::size()) {
      Vec v = Vec::loadu(x + i);
      acc = poison(acc, v);
      if (scale) (v * vinv).store(x + i);
    }
  } else {
    using RVec = Vectorized<scalar_t>;
    for (; i + RVec::size() <= n; i += RVec::size()) {
      auto [v0, v1] = at::vec::convert_to_float<scalar_t>(RVec::loadu(x + i));
      acc = poison(poison(acc, v0), v1);
      if (scale) at::vec::convert_from_float<scalar_t>(v0 * vinv, v1 * vinv).store(x + i);
    }
  }
  for (; i < n; ++i) {
    const opmath_t v = static_cast<opmath_t>(x[i]);
    tail = tail + v * opmath_t(0);
    if (scale) x[i] = static_cast<scalar_t>(v * static_cast<opmath_t>(inv_scale));
  }
  bool bad = math::non_finite(tail);
  opmath_t lanes[Vec::size()];
  acc.store(lanes);
  for (int64_t k = 0; k < Vec::size(); ++k) bad = bad || math::non_finite(lanes[k]);
  return bad;
}

// Runs scan_span over every tensor, chunked and in parallel; returns whether
// any element was not finite.
bool scan_tensors(at::TensorList tensors, bool scale, float inv_scale) {
  std::vector<DenseOne> dense;
  dense.reserve(tensors.size());
  struct Chunk {
    size_t tensor;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    dense.push_back(make_dense_one(tensors[i]));
    const int64_t numel = dense.back().t.numel();
    total += numel;
    for (int64_t b = 0; b < numel; b += kChunk) {
      chunks.push_back({i, b, std::min(numel, b + kChunk)});
    }
  }
  std::atomic<bool> found{false};
  const int64_t nchunks = static_cast<int64_t>(chunks.size());
  const int64_t grain = total < 4 * kChunk ? std::max<int64_t>(nchunks, 1) : 1;
  at::parallel_for(0, nchunks, grain, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& ch = chunks[c];
      const at::Tensor& t = dense[ch.tensor].t;
      AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "scan_cpu", [&] {
        // Read-only callers never write: the const_cast is only taken when scale.
        scalar_t* x = const_cast<scalar_t*>(t.const_data_ptr<scalar_t>()) + ch.begin;
        local = scan_span(x, ch.end - ch.begin, scale, inv_scale) || local;
      });
    }
    if (local) found.store(true, std::memory_order_relaxed);
  });
  if (scale) {
    for (auto& d : dense) d.write_back();
  }
  return found.load();
}

void check_finite_cpu(at::TensorList tensors, const at::Tensor& found_inf) {
  check_amp_tensors("check_finite_", tensors, found_inf);
  if (scan_tensors(tensors, /*scale=*/false, 1.0f)) {
    write_cpu_scalar(found_inf, 1.0);
  }
}

void unscale_cpu(at::TensorList tensors, const at::Tensor& found_inf,
                 const at::Tensor& inv_scale) {
  check_unscale_args(tensors, found_inf, inv_scale);
  const float inv = static_cast<float>(read_cpu_scalar(inv_scale));
  // Like torch: a 1.0 inv_scale only checks, it does not rewrite the grads.
  if (scan_tensors(tensors, /*scale=*/inv != 1.0f, inv)) {
    write_cpu_scalar(found_inf, 1.0);
  }
}

void update_scale_cpu(const at::Tensor& scale, const at::Tensor& growth_tracker,
                      const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                      double growth_factor, double backoff_factor, int64_t growth_interval,
                      int64_t hysteresis, std::optional<double> min_scale,
                      std::optional<double> max_scale) {
  check_update_scale_args(scale, growth_tracker, hysteresis_tracker, found_inf, growth_factor,
                          backoff_factor, growth_interval, hysteresis, min_scale, max_scale);
  const auto r = math::update_scale(
      static_cast<float>(read_cpu_scalar(scale)),
      static_cast<int32_t>(read_cpu_scalar(growth_tracker)),
      static_cast<int32_t>(read_cpu_scalar(hysteresis_tracker)), read_cpu_scalar(found_inf) != 0.0,
      growth_factor, backoff_factor, growth_interval, hysteresis, min_scale.value_or(0.0),
      max_scale.value_or(std::numeric_limits<double>::infinity()));
  write_cpu_scalar(scale, r.scale);
  write_cpu_scalar(growth_tracker, r.growth_tracker);
  write_cpu_scalar(hysteresis_tracker, r.hysteresis_tracker);
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  m.impl("check_finite_", &check_finite_cpu);
  m.impl("unscale_", &unscale_cpu);
  m.impl("update_scale_", &update_scale_cpu);
}

}  // namespace torchext

// CPU kernel of torchext::asgd_: one call covers the whole list, in chunks
// spread over threads (chunks.h); each chunk runs the
// shared per-element math (elementwise_math.h) in the per-ISA loops of
// isa_kernels_impl.h.
#include "../asgd.h"
#include "../asgd_registration.h"
#include "chunks.h"
#include "isa_kernels.h"
#include "torchext/elementwise_math.h"

#include <torch/library.h>

#include <vector>

namespace torchext {
namespace {

// Where one tensor's step/eta/mu live (validated: float32 or float64, on
// the CPU), so the schedule is written without touching the tensors'
// metadata again.
struct ScalarSlots {
  void* step;
  void* eta;
  void* mu;
};

template <typename T>
void write_schedule(const std::vector<ScalarSlots>& slots, const ASGDArgs& a, double lr) {
  const bool lr_is_float = a.lr.scalar_type() != at::kDouble;
  for (const ScalarSlots& s : slots) {
    const double step = static_cast<double>(*static_cast<T*>(s.step)) + 1.0;
    *static_cast<T*>(s.step) = static_cast<T>(step);
    *static_cast<T*>(s.eta) = static_cast<T>(math::asgd_eta(lr, a.lambd, a.alpha, step, lr_is_float));
    *static_cast<T*>(s.mu) = static_cast<T>(math::asgd_mu(a.t0, step));
  }
}

template <typename T>
double load(void* slot) {
  return static_cast<double>(*static_cast<T*>(slot));
}

void asgd_cpu_impl(const ASGDArgs& a) {
  const auto call = check_asgd_header(a);
  if (!call) return;  // no param has a grad
  const size_t n = a.params.size();
  const bool state_is_double = call->state_dtype == at::kDouble;
  const bool unscale = a.grad_scale.has_value();
  // torch's GradScaler unscales with a float32 reciprocal computed in double.
  const float inv_scale =
      unscale ? static_cast<float>(1.0 / read_cpu_scalar(*a.grad_scale)) : 1.0f;
  const bool clipped = a.clip_coef.has_value();
  const double clip = clipped ? read_cpu_scalar(*a.clip_coef) : 1.0;
  const double lr = a.lr_on_host();
  const bool stochastic = a.rounding_seed.has_value();

  // One pass (on the calling thread, not in the workers) checks each entry
  // and takes its raw pointers: with thousands of small tensors the cost is
  // bringing each tensor's metadata into cache, so it is done once. Nothing
  // is written before the pass is over.
  std::vector<cpu::ASGDSpan> spans;
  std::vector<int64_t> numels;
  std::vector<ScalarSlots> slots;
  spans.reserve(n);
  numels.reserve(n);
  slots.reserve(n);
  std::vector<DenseTriple> copies;  // kept alive until written back
  for_each_checked_entry(a, *call, copies, [&](const ASGDFlatEntry& e) {
    const ScalarSlots& slot =
        slots.emplace_back(ScalarSlots{a.step_ptr(e.index), a.eta_ptr(e.index), a.mu_ptr(e.index)});
    const double eta = state_is_double ? load<double>(slot.eta) : load<float>(slot.eta);
    const double mu = state_is_double ? load<double>(slot.mu) : load<float>(slot.mu);
    cpu::ASGDSpan& s = spans.emplace_back(cpu::ASGDSpan{
        e.dtype, e.p, e.ax, e.ax_dtype, e.g, e.numel, eta, mu, a.lambd, a.weight_decay,
        a.maximize, unscale, inv_scale, clipped, clip});
    if (stochastic) {
      // keyed by the step being taken: the state's step + 1
      const double step =
          (state_is_double ? load<double>(slot.step) : load<float>(slot.step)) + 1.0;
      s.stochastic = true;
      s.sr_key = math::sr_key(a.rounding_stream(e.index), step);
      s.sr_index = a.rounding_offset(e.index);
    }
    numels.push_back(e.numel);
  });
  if (a.found_inf.has_value() && read_cpu_scalar(*a.found_inf) != 0.0) {
    return;  // overflow this iteration: the whole step is a no-op
  }
  const auto& isa = cpu::kernels();
  cpu::for_each_chunk(numels, [&](const cpu::Chunk& ch) {
    cpu::ASGDSpan s = spans[ch.tensor];
    const int64_t offset = ch.begin * static_cast<int64_t>(c10::elementSize(s.dtype));
    s.p = static_cast<char*>(s.p) + offset;
    s.ax = static_cast<char*>(s.ax) + ch.begin * static_cast<int64_t>(c10::elementSize(s.ax_dtype));
    s.g = static_cast<const char*>(s.g) + offset;
    s.n = ch.end - ch.begin;
    s.sr_index += ch.begin;
    isa.asgd_span(s);
  });

  for (auto& d : copies) d.write_back();
  // The schedule, from the incremented step, once every chunk has read the
  // old eta and mu.
  if (state_is_double) {
    write_schedule<double>(slots, a, lr);
  } else {
    write_schedule<float>(slots, a, lr);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, CPU, m) {
  register_asgd_kernels<asgd_cpu_impl>(m);
}

}  // namespace torchext

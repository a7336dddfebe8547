// The cases and comparisons the CUDA kernel tests share: cuda_on_host
// (test_cuda_on_host.cpp: the launch plans run on the CPU by the host runner)
// and cuda_on_device (test_cuda_on_device.cpp: the real CUDA kernels). Each
// case is compared bit for bit with torchext's CPU kernels, called through
// the dispatcher on copies of the same inputs. Each test executable includes
// this header once.
#pragma once

#include "../csrc/ops/asgd_args.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torchext/torchext.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

// ---------------------------------------------------------------------------
// Tensors as slices of their own buffers, with guard bands around them and,
// for strided layouts, gaps inside: after a run, nothing outside the tensor
// may have changed.

// t's elements as a 1-D tensor of stride 1. (contiguous() may keep a size-1
// dimension's stride, which view(dtype) then refuses.)
at::Tensor dense_copy(const at::Tensor& t) {
  return t.flatten().clone(at::MemoryFormat::Contiguous);
}

enum class Layout { kContiguous, kTransposed, kStrided };

class Arena {
 public:
  // A tensor of `numel` elements, shape {numel / 3, 3} when 3 divides it and
  // {numel} otherwise, whatever the layout (so that p, g and ax of one entry
  // match), starting `offset` elements past an aligned address (offset 1..3
  // makes a slice that is not vector-aligned).
  at::Tensor make(int64_t numel, at::ScalarType dtype, int64_t offset, Layout layout,
                  std::mt19937_64& rng) {
    constexpr int64_t kPad = 64;  // elements; 64 * element size is a multiple of 64 bytes
    const int64_t span = layout == Layout::kStrided ? 2 * numel : numel;
    const int64_t total = kPad + offset + span + kPad;
    at::Tensor buf = random_values({total}, dtype, rng);
    at::Tensor slice = buf.narrow(0, kPad + offset, span);
    const bool two_d = numel > 0 && numel % 3 == 0;
    const std::vector<int64_t> shape =
        two_d ? std::vector<int64_t>{numel / 3, 3} : std::vector<int64_t>{numel};
    at::Tensor t;
    switch (layout) {
      case Layout::kContiguous:
        t = slice.view(shape);
        break;
      case Layout::kTransposed:  // dense, not contiguous (1-D: contiguous)
        t = two_d ? slice.view({3, numel / 3}).t() : slice;
        break;
      case Layout::kStrided:  // not dense: every other element
        t = two_d ? slice.as_strided(shape, {6, 2}) : slice.as_strided(shape, {2});
        break;
    }
    // What must not change: the pads, and for the strided layout the
    // elements between the tensor's.
    Slab slab{buf, {}};
    slab.guards.push_back(buf.narrow(0, 0, kPad + offset));
    slab.guards.push_back(buf.narrow(0, kPad + offset + span, kPad));
    if (layout == Layout::kStrided && numel > 0) {
      slab.guards.push_back(slice.as_strided({numel}, {2}, slice.storage_offset() + 1));
    }
    for (const auto& g : slab.guards) slab.before.push_back(g.clone());
    slabs_.push_back(std::move(slab));
    return t;
  }

  // Every element outside the tensors, bit for bit as before.
  ::testing::AssertionResult guards_intact() const {
    for (size_t i = 0; i < slabs_.size(); ++i) {
      const auto& s = slabs_[i];
      for (size_t k = 0; k < s.guards.size(); ++k) {
        if (!as_bytes(s.guards[k]).equal(as_bytes(s.before[k]))) {
          return ::testing::AssertionFailure() << "buffer " << i << " (" << s.buf.scalar_type()
                                               << ") changed outside its tensor";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  static at::Tensor random_values(at::IntArrayRef shape, at::ScalarType dtype,
                                  std::mt19937_64& rng) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(rng());
    if (at::isComplexType(dtype)) {
      return at::randn(shape, gen, at::TensorOptions().dtype(dtype));
    }
    if (dtype == at::kDouble) return at::randn(shape, gen, at::TensorOptions().dtype(dtype));
    if (at::isFloatingType(dtype)) {
      return at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)).to(dtype);
    }
    return at::randint(0, 120, shape, gen, at::TensorOptions().dtype(dtype));
  }

  static at::Tensor as_bytes(const at::Tensor& t) {
    const at::Tensor r = t.is_complex() ? at::view_as_real(t) : t;
    return dense_copy(r).view(at::kByte);
  }

 private:
  struct Slab {
    at::Tensor buf;
    std::vector<at::Tensor> guards, before;
  };
  std::vector<Slab> slabs_;
};

// got and want bit for bit (any NaN equals any NaN: CPU and GPU NaN payloads
// need not agree).
::testing::AssertionResult same_bits(const at::Tensor& got, const at::Tensor& want,
                                     const std::string& what) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << what << ": shape/dtype " << got.sizes() << " "
                                         << got.scalar_type() << " vs " << want.sizes() << " "
                                         << want.scalar_type();
  }
  at::Tensor g = got.cpu(), w = want.cpu();
  if (g.is_complex()) {
    g = at::view_as_real(g.resolve_conj());
    w = at::view_as_real(w.resolve_conj());
  }
  g = dense_copy(g);
  w = dense_copy(w);
  const auto size = g.element_size();
  const at::ScalarType bits = size == 1 ? at::kByte : size == 2 ? at::kShort
                              : size == 4 ? at::kInt : at::kLong;
  at::Tensor same = g.view(bits).eq(w.view(bits));
  if (at::isFloatingType(g.scalar_type())) same = same | (g.isnan() & w.isnan());
  if (same.all().item<bool>()) return ::testing::AssertionSuccess();
  const at::Tensor bad = (~same).nonzero().flatten();
  const int64_t i = bad[0].item<int64_t>();
  return ::testing::AssertionFailure()
         << what << ": " << bad.numel() << " of " << g.numel() << " elements differ; first at "
         << i << ": got " << g[i].item<double>() << ", want " << w[i].item<double>();
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(t.defined() ? t.clone() : t);
  return out;
}

const at::ScalarType kParamDtypes[] = {at::kFloat, at::kDouble, at::kHalf,
                                       at::kBFloat16, at::kComplexFloat, at::kComplexDouble};


// ---------------------------------------------------------------------------
// asgd_

struct EntrySpec {
  int64_t numel;
  at::ScalarType dtype;
  int64_t offset[3];  // p, g, ax
  Layout layout[3];
  // asgd_: the average's dtype, Undefined for dtype; float for a float32
  // average of a half/bfloat16 parameter.
  at::ScalarType ax_dtype = at::ScalarType::Undefined;
  // asgd_: p, g and ax times this (fp16's subnormals, or its largest values).
  double scale = 1.0;
};

struct ASGDCase {
  std::string name;
  std::vector<EntrySpec> entries;
  bool packed = false;
  at::ScalarType state_dtype = at::kFloat;
  bool tensor_lr = true;
  bool lr_in_device = false;  // runner: load the lr tensor through its pointer
  double lr = 0.05, lambd = 1e-2, alpha = 0.75, t0 = 1.0, weight_decay = 0.0;
  bool maximize = false;
  std::optional<float> grad_scale;
  std::optional<float> found_inf;
  std::optional<double> clip_coef;  // float64 when clip_double
  bool clip_double = false;
  int steps = 2;
  std::vector<bool> skip;  // entries the plan skips (as it skips entries without grads)
  uint64_t seed = 0;
  // Stochastic rounding: the op's rounding_seed, rounding_ids and
  // rounding_offsets (empty: None).
  std::optional<int64_t> rounding_seed;
  std::vector<int64_t> rounding_ids, rounding_offsets;
  double step_base = 0;  // added to every entry's initial step (0 to 6)

  std::string describe() const {
    std::ostringstream s;
    s << name << " (" << entries.size() << " entries, " << (packed ? "packed " : "list ")
      << state_dtype << " state, lr " << (tensor_lr ? (lr_in_device ? "device tensor" : "tensor") : "float")
      << ", wd " << weight_decay << (maximize ? ", maximize" : "")
      << (grad_scale ? ", grad_scale" : "") << (found_inf ? (*found_inf != 0 ? ", found_inf=1" : ", found_inf=0") : "")
      << (clip_coef ? ", clip_coef " + std::to_string(*clip_coef) + (clip_double ? " (float64)" : "") : "")
      << ", t0 " << t0 << ", seed " << seed;
    if (rounding_seed) {
      s << ", stochastic rounding (seed " << *rounding_seed
        << (rounding_ids.empty() ? "" : ", ids") << (rounding_offsets.empty() ? "" : ", offsets")
        << ")";
    }
    if (step_base != 0) s << ", steps from " << step_base;
    s << ")";
    return s.str();
  }
  // The rounding_* arguments as C++ callers push them.
  torchext::ASGDRoundingArgs rounding() const {
    torchext::ASGDRoundingArgs r;
    r.seed = rounding_seed;
    if (!rounding_ids.empty()) r.ids = c10::IValue(c10::List<int64_t>(rounding_ids));
    if (!rounding_offsets.empty()) r.offsets = c10::IValue(c10::List<int64_t>(rounding_offsets));
    return r;
  }
};

// The tensors of one asgd_ call.
struct ASGDTensors {
  std::vector<at::Tensor> params, grads, axs, mus, etas, steps;  // list state
  at::Tensor packed_mus, packed_etas, packed_steps;              // packed state
  at::Tensor lr, grad_scale, found_inf, clip_coef;

  ASGDTensors deep_copy() const {
    ASGDTensors c;
    c.params = clones(params);
    c.grads = clones(grads);
    c.axs = clones(axs);
    c.mus = clones(mus);
    c.etas = clones(etas);
    c.steps = clones(steps);
    for (auto [dst, src] : {std::pair{&c.packed_mus, &packed_mus}, {&c.packed_etas, &packed_etas},
                            {&c.packed_steps, &packed_steps}, {&c.lr, &lr},
                            {&c.grad_scale, &grad_scale}, {&c.found_inf, &found_inf},
                            {&c.clip_coef, &clip_coef}}) {
      if (src->defined()) *dst = src->clone();
    }
    return c;
  }
  ASGDTensors to(const at::Device& d) const {
    ASGDTensors c = deep_copy();
    for (auto* l : {&c.params, &c.grads, &c.axs, &c.mus, &c.etas, &c.steps}) {
      for (auto& t : *l) t = t.to(d);
    }
    for (auto* t : {&c.packed_mus, &c.packed_etas, &c.packed_steps, &c.lr, &c.grad_scale,
                    &c.found_inf, &c.clip_coef}) {
      if (t->defined()) *t = t->to(d);
    }
    return c;
  }
};

ASGDTensors make_asgd_tensors(const ASGDCase& c, Arena& arena) {
  std::mt19937_64 rng(c.seed);
  ASGDTensors t;
  const auto n = static_cast<int64_t>(c.entries.size());
  for (const auto& e : c.entries) {
    t.params.push_back(arena.make(e.numel, e.dtype, e.offset[0], e.layout[0], rng));
    t.grads.push_back(arena.make(e.numel, e.dtype, e.offset[1], e.layout[1], rng));
    const auto ax_dtype = e.ax_dtype == at::ScalarType::Undefined ? e.dtype : e.ax_dtype;
    t.axs.push_back(arena.make(e.numel, ax_dtype, e.offset[2], e.layout[2], rng));
    if (e.scale != 1.0) {
      for (auto* l : {&t.params, &t.grads, &t.axs}) l->back().mul_(e.scale);
    }
  }
  // A plausible state: step s, eta and mu from torch's schedule at s.
  std::uniform_int_distribution<int> step_dist(0, 6);
  const auto so = at::TensorOptions().dtype(c.state_dtype);
  at::Tensor steps = at::empty({n}, so), etas = at::empty({n}, so), mus = at::empty({n}, so);
  for (int64_t i = 0; i < n; ++i) {
    const double s = c.step_base + step_dist(rng);
    steps[i] = s;
    etas[i] = s == 0 ? c.lr : c.lr / std::pow(1 + c.lambd * c.lr * s, c.alpha);
    mus[i] = 1.0 / std::max(1.0, s - c.t0);
  }
  if (c.packed) {
    t.packed_steps = steps;
    t.packed_etas = etas;
    t.packed_mus = mus;
  } else {
    for (int64_t i = 0; i < n; ++i) {
      t.steps.push_back(steps[i].clone());
      t.etas.push_back(etas[i].clone());
      t.mus.push_back(mus[i].clone());
    }
  }
  // The op's lr is a tensor: a float32 one (a tensor lr), or a float64 CPU
  // one (what a Python float lr becomes).
  t.lr = c.tensor_lr ? at::full({}, c.lr, at::kFloat) : at::full({}, c.lr, at::kDouble);
  if (c.grad_scale) t.grad_scale = at::full({}, *c.grad_scale, at::kFloat);
  if (c.found_inf) t.found_inf = at::full({}, *c.found_inf, at::kFloat);
  if (c.clip_coef) {
    t.clip_coef = at::full({}, *c.clip_coef, c.clip_double ? at::kDouble : at::kFloat);
  }
  if (c.grad_scale) {  // scaled grads
    for (auto& g : t.grads) g.mul_(*c.grad_scale);
  }
  return t;
}

torchext::ASGDHyperparams hyper_of(const ASGDCase& c) {
  return {c.lambd, c.alpha, c.t0, c.weight_decay, c.maximize};
}

std::optional<at::Tensor> opt(const at::Tensor& x) {
  return x.defined() ? std::optional<at::Tensor>(x) : std::nullopt;
}

// One asgd_ call through the dispatcher, as Python makes it.
void call_asgd(const ASGDCase& c, const ASGDTensors& t) {
  using torchext::TensorListArg;
  auto stack =
      c.packed ? torchext::asgd_stack(TensorListArg(t.params), TensorListArg(t.grads),
                                      TensorListArg(t.axs), t.packed_mus, t.packed_etas,
                                      t.packed_steps, t.lr, hyper_of(c), opt(t.grad_scale),
                                      opt(t.found_inf), opt(t.clip_coef), c.rounding())
               : torchext::asgd_stack(TensorListArg(t.params), TensorListArg(t.grads),
                                      TensorListArg(t.axs), TensorListArg(t.mus),
                                      TensorListArg(t.etas), TensorListArg(t.steps), t.lr,
                                      hyper_of(c), opt(t.grad_scale), opt(t.found_inf),
                                      opt(t.clip_coef), c.rounding());
  torchext::asgd_op(c.packed ? torchext::ASGDState::kPacked : torchext::ASGDState::kLists)
      .callBoxed(&stack);
}



// The reference: the CPU kernel through the dispatcher. Skipped entries are
// left out of its lists (packed state: as 0-d views of their elements), the
// others keep their rounding ids (their index in the full list by default)
// and offsets.
void run_reference(const ASGDCase& c, ASGDTensors& t) {
  const bool any_skip = std::find(c.skip.begin(), c.skip.end(), true) != c.skip.end();
  for (int s = 0; s < c.steps; ++s) {
    if (!any_skip) {
      call_asgd(c, t);
      continue;
    }
    ASGDCase sub = c;
    sub.packed = false;
    sub.rounding_ids.clear();
    sub.rounding_offsets.clear();
    ASGDTensors kept;
    kept.lr = t.lr;
    kept.grad_scale = t.grad_scale;
    kept.found_inf = t.found_inf;
    kept.clip_coef = t.clip_coef;
    for (size_t i = 0; i < c.entries.size(); ++i) {
      if (c.skip[i]) continue;
      if (c.rounding_seed) {
        sub.rounding_ids.push_back(c.rounding_ids.empty() ? static_cast<int64_t>(i)
                                                          : c.rounding_ids[i]);
        if (!c.rounding_offsets.empty()) sub.rounding_offsets.push_back(c.rounding_offsets[i]);
      }
      kept.params.push_back(t.params[i]);
      kept.grads.push_back(t.grads[i]);
      kept.axs.push_back(t.axs[i]);
      kept.mus.push_back(c.packed ? t.packed_mus[i] : t.mus[i]);
      kept.etas.push_back(c.packed ? t.packed_etas[i] : t.etas[i]);
      kept.steps.push_back(c.packed ? t.packed_steps[i] : t.steps[i]);
    }
    if (kept.params.empty()) continue;
    call_asgd(sub, kept);
  }
}



// Everything asgd_ may write, and what it only reads, bit for bit.
::testing::AssertionResult same_asgd_results(const ASGDCase& c, const ASGDTensors& got,
                                             const ASGDTensors& want) {
  const auto check = [&](const at::Tensor& g, const at::Tensor& w,
                         const std::string& what) -> ::testing::AssertionResult {
    return same_bits(g, w, what);
  };
  for (size_t i = 0; i < c.entries.size(); ++i) {
    const std::string at = "[" + std::to_string(i) + "]";
    for (auto r : {check(got.params[i], want.params[i], "param" + at),
                   check(got.axs[i], want.axs[i], "ax" + at),
                   check(got.grads[i], want.grads[i], "grad" + at)}) {
      if (!r) return r;
    }
    if (!c.packed) {
      for (auto r : {check(got.steps[i], want.steps[i], "step" + at),
                     check(got.etas[i], want.etas[i], "eta" + at),
                     check(got.mus[i], want.mus[i], "mu" + at)}) {
        if (!r) return r;
      }
    }
  }
  if (c.packed) {
    for (auto r : {check(got.packed_steps, want.packed_steps, "steps"),
                   check(got.packed_etas, want.packed_etas, "etas"),
                   check(got.packed_mus, want.packed_mus, "mus")}) {
      if (!r) return r;
    }
  }
  return ::testing::AssertionSuccess();
}

bool cpu_isa_fuses() { return std::string(torchext::cpu_isa()) != "DEFAULT"; }

EntrySpec random_entry(std::mt19937_64& rng, int64_t max_numel, bool any_layout = true,
                       const std::vector<at::ScalarType>& dtypes = {}) {
  EntrySpec e{};
  std::uniform_int_distribution<int64_t> numel(0, max_numel);
  std::uniform_int_distribution<int> pick(0, 99);
  e.numel = pick(rng) < 10 ? 0 : numel(rng);  // some empty tensors
  if (dtypes.empty()) {
    e.dtype = kParamDtypes[pick(rng) % 6];
  } else {
    e.dtype = dtypes[pick(rng) % dtypes.size()];
  }
  for (int k = 0; k < 3; ++k) {
    const int r = pick(rng);
    e.offset[k] = r < 60 ? 0 : 1 + r % 3;  // 40%: not vector-aligned
    e.layout[k] = !any_layout || r % 10 < 7 ? Layout::kContiguous
                  : r % 10 < 9              ? Layout::kTransposed
                                            : Layout::kStrided;
  }
  return e;
}

// A mixed list: every dtype, empty tensors, unaligned slices, layouts that
// need temporaries, and (for the small shapes) tensors spanning launches.
ASGDCase random_asgd_case(uint64_t seed, int64_t nentries, int64_t max_numel) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(0, 99);
  ASGDCase c;
  c.name = "random";
  c.seed = seed;
  for (int64_t i = 0; i < nentries; ++i) c.entries.push_back(random_entry(rng, max_numel));
  c.packed = pick(rng) < 50;
  c.state_dtype = pick(rng) < 75 ? at::kFloat : at::kDouble;
  const int lr_kind = pick(rng) % 3;
  c.tensor_lr = lr_kind != 0;
  c.lr_in_device = lr_kind == 2;
  c.lr = 0.01 + 0.1 * pick(rng) / 100.0;
  c.lambd = pick(rng) < 50 ? 1e-4 : 0.05;
  c.alpha = pick(rng) < 50 ? 0.75 : 0.5;
  c.t0 = pick(rng) < 50 ? 1.0 : 1e6;  // averaging, or mu == 1 (ax = param)
  c.weight_decay = pick(rng) < 50 ? 0.0 : 0.01;
  c.maximize = pick(rng) < 25;
  if (pick(rng) < 40) c.grad_scale = pick(rng) < 50 ? 1024.f : 3.f;
  if (pick(rng) < 30) c.found_inf = pick(rng) < 50 ? 0.f : 1.f;
  if (pick(rng) < 35) {  // a clip folded in: float32 or float64, near float32's smallest normal
    const int k = pick(rng);
    c.clip_coef = k < 40 ? 0.37 : k < 70 ? 1.5e-38 : 0.0123;
    c.clip_double = k >= 70;
  }
  c.steps = 2;
  // Half of the half/bfloat16 entries keep a float32 average (from a stream
  // of their own, so that the draws above are those of every earlier case).
  std::mt19937_64 ax_rng(seed ^ 0x5eedaf32ull);
  for (auto& e : c.entries) {
    if ((e.dtype == at::kHalf || e.dtype == at::kBFloat16) && ax_rng() % 2 == 0) {
      e.ax_dtype = at::kFloat;
    }
  }
  return c;
}


// Stochastic rounding (rounding_seed): bf16 and fp16 entries, each with a
// float32 average or one in its own dtype, of sizes that are no multiple of
// kILP and span several chunks of every shape (up to max_numel), aligned (the
// vector loop) or not (the scalar loop), some scaled into fp16's subnormals
// or next to its largest values; beside them float32, float64 and complex
// entries, which ignore the rounding arguments. Every combination of state
// (packed or lists, float32 or float64), rounding ids and offsets (None or
// given: ids of another optimizer's numbering, offsets of a shard far into
// its tensor), and steps (0 to 6; near float32's 2**24, where a float32 step
// stops counting; past 2**32 in float64 state), some entries without grads.
std::vector<ASGDCase> rounding_cases(uint64_t seed, int64_t nentries, int64_t max_numel) {
  std::vector<ASGDCase> cases;
  int k = 0;
  for (const bool packed : {false, true}) {
    for (const at::ScalarType sd : {at::kFloat, at::kDouble}) {
      for (const bool custom : {false, true}) {
        for (const bool skips : {false, true}) {
          ++k;
          std::mt19937_64 rng(seed * 1000 + k);
          std::uniform_int_distribution<int64_t> numel(max_numel / 2, max_numel);
          std::uniform_int_distribution<int> pick(0, 99);
          ASGDCase c;
          c.name = "stochastic rounding";
          c.seed = seed * 1000 + k;
          c.packed = packed;
          c.state_dtype = sd;
          c.steps = 3;
          c.rounding_seed = static_cast<int64_t>(rng() >> 1) * (k % 2 ? 1 : -1);
          c.step_base = custom == skips ? 0 : sd == at::kFloat ? 16777216.0 - 4 : 6e9;
          if (c.step_base != 0) c.lambd = 1e-10;  // eta ~ lr still: updates SR can round
          c.lr = pick(rng) < 50 ? 0.05 : 1e-3;  // updates of a few ulps, or under half of one
          c.weight_decay = pick(rng) < 50 ? 0.0 : 0.01;
          c.maximize = pick(rng) < 25;
          if (pick(rng) < 40) c.grad_scale = 1024.f;
          if (pick(rng) < 35) c.clip_coef = 0.37;
          // Entry i's dtype and average: the four fp16/bf16 kinds, then another dtype.
          const std::pair<at::ScalarType, at::ScalarType> kinds[] = {
              {at::kBFloat16, at::ScalarType::Undefined}, {at::kHalf, at::kFloat},
              {at::kBFloat16, at::kFloat}, {at::kHalf, at::ScalarType::Undefined}};
          const at::ScalarType others[] = {at::kFloat, at::kDouble, at::kComplexFloat};
          for (int64_t i = 0; i < nentries; ++i) {
            EntrySpec e{};
            e.numel = numel(rng) | 1;  // odd: never a multiple of kILP
            if (i % 5 == 4) {
              e.dtype = others[pick(rng) % 3];
            } else {
              std::tie(e.dtype, e.ax_dtype) = kinds[i % 5];
            }
            for (int d = 0; d < 3; ++d) {
              e.offset[d] = pick(rng) < 60 ? 0 : 1 + pick(rng) % 3;  // 40%: the scalar loop
              e.layout[d] = Layout::kContiguous;
            }
            if (e.dtype == at::kHalf && pick(rng) < 30) e.scale = pick(rng) < 50 ? 1e-6 : 2e4;
            c.entries.push_back(e);
          }
          // One tensor in a dense layout that is not contiguous, one strided.
          c.entries[0].layout[0] = c.entries[0].layout[1] = c.entries[0].layout[2] =
              Layout::kTransposed;
          c.entries[1].layout[1] = Layout::kStrided;
          if (custom) {
            for (int64_t i = 0; i < nentries; ++i) {
              c.rounding_ids.push_back((int64_t{3} << 32 | 7) + 5 * i);
              c.rounding_offsets.push_back(i == 0 ? 0 : (int64_t{1} << 33) + 12345 * i + 1);
            }
          }
          if (skips) {
            for (int64_t i = 0; i < nentries; ++i) c.skip.push_back(pick(rng) < 30);
            c.skip[1] = false;  // an fp16 entry with an offset always steps
            c.skip[2] = true;
          }
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}


// ---------------------------------------------------------------------------
// check_finite_ / unscale_

struct ScanCase {
  std::string name;
  std::vector<EntrySpec> entries;  // offset[0] and layout[0] are used
  // (entry, chunk (-1: the middle one, -2: the last one), value) to plant
  std::vector<std::tuple<size_t, int64_t, double>> plants;
  std::optional<float> inv_scale;  // unscale_ when set
  float found_inf = 0.f;
  uint64_t seed = 0;
  // unscale_'s clip_coef (with inv_scale only), float64 when clip_double
  std::optional<double> clip_coef = std::nullopt;
  bool clip_double = false;

  // The clip_coef argument, on `device`.
  std::optional<at::Tensor> clip(c10::Device device = at::kCPU) const {
    if (!clip_coef) return std::nullopt;
    return at::full({}, *clip_coef, at::TensorOptions()
                                        .dtype(clip_double ? at::kDouble : at::kFloat)
                                        .device(device));
  }
};

// The k-th element of t in logical order, as a view.
at::Tensor element_view(const at::Tensor& t, int64_t k) {
  std::vector<int64_t> idx(t.dim());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    idx[d] = k % t.size(d);
    k /= t.size(d);
  }
  at::Tensor e = t;
  for (int64_t d = 0; d < t.dim(); ++d) e = e.select(0, idx[d]);
  return e;
}

std::vector<at::Tensor> make_scan_tensors(const ScanCase& c, Arena& arena, int64_t chunk) {
  std::mt19937_64 rng(c.seed);
  std::vector<at::Tensor> ts;
  for (const auto& e : c.entries) {
    ts.push_back(arena.make(e.numel, e.dtype, e.offset[0], e.layout[0], rng));
  }
  for (const auto& [i, which, value] : c.plants) {
    const at::Tensor& t = ts[i];
    if (t.numel() == 0) continue;
    // Chunks count real elements (a complex element is two).
    const int64_t reals = t.is_complex() ? 2 : 1;
    const int64_t nchunks = (t.numel() * reals + chunk - 1) / chunk;
    const int64_t ch = which == -1 ? nchunks / 2 : which == -2 ? nchunks - 1 : which;
    const int64_t real_index = ch * chunk + static_cast<int64_t>(rng() % chunk);
    // For contiguous tensors the logical order is the memory order the
    // chunks follow; for the others the chunk is only nominal.
    element_view(t, std::min(t.numel() - 1, real_index / reals)).fill_(value);
  }
  return ts;
}



void scan_reference(const ScanCase& c, const std::vector<at::Tensor>& ts, const at::Tensor& found,
                    const at::Tensor& inv) {
  static const auto check_finite = c10::Dispatcher::singleton()
      .findSchemaOrThrow("torchext::check_finite_", "")
      .typed<void(at::TensorList, const at::Tensor&)>();
  static const auto unscale = c10::Dispatcher::singleton()
      .findSchemaOrThrow("torchext::unscale_", "")
      .typed<void(at::TensorList, const at::Tensor&, const at::Tensor&,
                  const std::optional<at::Tensor>&)>();
  if (c.inv_scale) {
    unscale.call(ts, found, inv, c.clip(inv.device()));
  } else {
    check_finite.call(ts, found);
  }
}


std::vector<ScanCase> scan_cases(uint64_t seed, int64_t nentries, int64_t max_numel) {
  std::mt19937_64 rng(seed);
  std::vector<EntrySpec> entries;
  for (int64_t i = 0; i < nentries; ++i) entries.push_back(random_entry(rng, max_numel));
  // One big contiguous float32 tensor of several chunks to plant into.
  entries.push_back({7 * max_numel + 5, at::kFloat, {1, 0, 0},
                     {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
  const size_t big = entries.size() - 1;
  std::vector<ScanCase> cases;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::optional<float> inv : {std::optional<float>{}, std::optional<float>{1.f / 1024},
                                   std::optional<float>{1.f / 3}, std::optional<float>{1.f}}) {
    const std::string op = inv ? "unscale_ (inv " + std::to_string(*inv) + ")" : "check_finite_";
    cases.push_back({op + ", all finite", entries, {}, inv, 0.f, seed});
    cases.push_back({op + ", found_inf already 1", entries, {}, inv, 1.f, seed});
    for (int64_t where : {0L, -1L, -2L}) {
      for (double v : {inf, -inf, nan}) {
        cases.push_back({op + ", " + std::to_string(v) + " in chunk " + std::to_string(where) +
                             " of the big tensor",
                         entries, {{big, where, v}}, inv, 0.f, seed + where + 9});
      }
      // ... and in a random other tensor (any dtype or layout)
      const size_t other = rng() % (entries.size() - 1);
      cases.push_back({op + ", inf in chunk " + std::to_string(where) + " of tensors[" +
                           std::to_string(other) + "]",
                       entries, {{other, where, inf}}, inv, 0.f, seed + 3});
    }
    if (!inv) continue;
    // unscale_ with a clip coefficient (a float32 one, a float64 one, one
    // near float32's smallest normal), all finite and with a NaN.
    for (const auto& [coef, dbl] : {std::pair<double, bool>{0.37, false}, {0.37, true},
                                    {1.5e-38, false}, {1.0, false}}) {
      ScanCase c{op + ", clip " + std::to_string(coef) + (dbl ? " (float64)" : ""),
                 entries, {}, inv, 0.f, seed + 11};
      c.clip_coef = coef;
      c.clip_double = dbl;
      cases.push_back(c);
      c.name += ", NaN in the last chunk of the big tensor";
      c.plants = {{big, -2L, nan}};
      cases.push_back(c);
    }
  }
  return cases;
}


// ---------------------------------------------------------------------------
// swap_

struct SwapCase {
  std::string name;
  std::vector<std::pair<EntrySpec, EntrySpec>> pairs;
  uint64_t seed = 0;
};


SwapCase random_swap_case(uint64_t seed, int64_t npairs, int64_t max_numel) {
  std::mt19937_64 rng(seed);
  SwapCase c{"swap seed " + std::to_string(seed), {}, seed};
  const std::vector<at::ScalarType> dtypes = {at::kByte, at::kHalf, at::kFloat, at::kDouble,
                                              at::kComplexDouble, at::kShort};
  for (int64_t i = 0; i < npairs; ++i) {
    EntrySpec x = random_entry(rng, max_numel, true, dtypes);
    EntrySpec y = random_entry(rng, max_numel, true, dtypes);
    y.numel = x.numel;
    y.dtype = x.dtype;
    if (rng() % 2) y.layout[0] = x.layout[0];  // mostly laid out alike: the flat path
    c.pairs.push_back({x, y});
  }
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------
// tensor_norms

namespace {

const double kInf = std::numeric_limits<double>::infinity();
// Every kind of order: 0, 1, 2, inf, -inf and other p (fractional, negative).
const double kNormOrders[] = {0, 1, 2, kInf, -kInf, 3, 0.5, -1, -2.5};

// Where a planted value goes: element 0 of the first, middle or last chunk,
// or a random element of it, or the tensor's last element (in a load's
// partial lanes when the tensor's size is not a multiple of 4).
enum class Spot { kFirstChunk, kMiddleChunk, kLastChunk, kLastElement };

struct NormsCase {
  std::string name;
  std::vector<EntrySpec> entries;  // offset[0] and layout[0] are used
  std::vector<double> ords = std::vector<double>(std::begin(kNormOrders), std::end(kNormOrders));
  std::vector<std::tuple<size_t, Spot, double>> plants;  // (entry, where, value)
  std::optional<float> inv_scale;
  std::optional<float> found_inf;  // passed, with this value, when set
  double scale = 1.0;              // the tensors' values times this (scaled grads)
  uint64_t seed = 0;
};

std::vector<at::Tensor> make_norms_tensors(const NormsCase& c, Arena& arena, int64_t chunk) {
  std::mt19937_64 rng(c.seed);
  std::vector<at::Tensor> ts;
  for (const auto& e : c.entries) {
    at::Tensor t = arena.make(e.numel, e.dtype, e.offset[0], e.layout[0], rng);
    if (c.scale != 1.0) t.mul_(c.scale);
    ts.push_back(t);
  }
  for (const auto& [i, spot, value] : c.plants) {
    const at::Tensor& t = ts[i];
    if (t.numel() == 0) continue;
    const int64_t nchunks = (t.numel() + chunk - 1) / chunk;
    int64_t k = t.numel() - 1;
    if (spot != Spot::kLastElement) {
      const int64_t ch = spot == Spot::kFirstChunk ? 0 : spot == Spot::kMiddleChunk ? nchunks / 2
                                                                                    : nchunks - 1;
      k = std::min(t.numel() - 1, ch * chunk + static_cast<int64_t>(rng() % chunk));
    }
    // Complex: the real part (the imaginary part stays finite).
    at::Tensor e = element_view(t, k);
    if (e.is_complex()) e = at::real(e);
    e.fill_(value);
  }
  return ts;
}

// The tensors an order may take: the -inf, inf and negative norms of an
// empty tensor are refused (torch.linalg.vector_norm's rule).
std::vector<at::Tensor> norms_list(const std::vector<at::Tensor>& ts, double ord) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) {
    if (t.numel() > 0 || (ord >= 0 && !std::isinf(ord))) out.push_back(t);
  }
  return out;
}

// The reference: the CPU kernel through the dispatcher.
at::Tensor norms_reference(const std::vector<at::Tensor>& ts, double ord,
                           const std::optional<at::Tensor>& inv,
                           const std::optional<at::Tensor>& found) {
  static const auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("torchext::tensor_norms", "")
      .typed<at::Tensor(at::TensorList, double, const std::optional<at::Tensor>&,
                        const std::optional<at::Tensor>&)>();
  return op.call(ts, ord, inv, found);
}

// How far an accelerator's norm may be from the CPU kernel's, relative to it.
// Max (inf), min (-inf) and count (0) do not depend on the order of the
// elements: the same bits. The 1-norms of float32/fp16/bf16 tensors are
// summed in float32 chains, then in double, on both sides: a chain of m
// terms (all >= 0) is within (m - 1) * 2^-24 of its exact sum, the double
// stages add ~1e-13, and chains hold at most 128 terms here (a 64K chunk
// over 512 threads; the host runner's shapes: 8) and 64 on the CPU (1024-
// element blocks over at least 16 float lanes), so the sums differ by less
// than (127 + 63) * 2^-24 < 2^-16 relative. All else (2-norms, whose squares
// both sides take in double, float64, complex pairs, 0 and other p) is
// summed in double on both sides, chains of at most 65,536 terms (the CPU's
// scalar loop): 2 * 65536 * 2^-53 < 2e-11, times |1/p| <= 2 for the root:
// 1e-10. Then each side rounds to the tensor's dtype: one unit in its last
// place more.
double norms_rtol(double ord, const at::Tensor& t) {
  const bool float_chains = ord == 1 && !t.is_complex() && t.scalar_type() != at::kDouble;
  return float_chains ? std::ldexp(1.0, -16) : 1e-10;
}
bool norms_exact(double ord) { return ord == 0 || std::isinf(ord); }

// What close_norms saw: norms compared, how many differed at all, and the
// largest difference as a fraction of its tolerance.
struct NormsStats {
  int64_t compared = 0, differed = 0;
  double worst = 0;
};
NormsStats& norms_stats() {
  static NormsStats s;
  return s;
}

// The spacing of `dtype`'s values at x (its subnormals' below the normal range).
double ulp_of(at::ScalarType dtype, double x) {
  int digits, min_exp;  // precision in bits, exponent of the smallest normal (frexp's)
  switch (dtype) {
    case at::kHalf: digits = 11; min_exp = -13; break;
    case at::kBFloat16: digits = 8; min_exp = -125; break;
    case at::kFloat: digits = 24; min_exp = -125; break;
    default: digits = 53; min_exp = -1021; break;
  }
  int e = min_exp;
  if (x != 0) std::frexp(x, &e);
  return std::ldexp(1.0, std::max(e, min_exp) - digits);
}

// got (an accelerator's norms) against want (the CPU kernel's), element i
// being tensors[i]'s: equal bits where norms_exact, else within norms_rtol
// plus one ulp of the tensor's dtype; NaN where NaN, inf where inf.
::testing::AssertionResult close_norms(const at::Tensor& got, const at::Tensor& want,
                                       const std::vector<at::Tensor>& ts, double ord) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) {
    return ::testing::AssertionFailure() << "norms: shape/dtype " << got.sizes() << " "
                                         << got.scalar_type() << " vs " << want.sizes() << " "
                                         << want.scalar_type();
  }
  if (norms_exact(ord)) return same_bits(got, want, "norms (exact order)");
  const at::Tensor g = got.cpu().to(at::kDouble), w = want.cpu().to(at::kDouble);
  const double* gp = g.const_data_ptr<double>();
  const double* wp = w.const_data_ptr<double>();
  NormsStats& stats = norms_stats();
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double a = gp[i], b = wp[i];
    ++stats.compared;
    if (std::isnan(a) && std::isnan(b)) continue;
    if (a == b) continue;  // inf too
    ++stats.differed;
    const at::ScalarType dt = c10::toRealValueType(ts[i].scalar_type());
    const double tol = norms_rtol(ord, ts[i]) * std::fabs(b) + ulp_of(dt, b);
    if (std::isfinite(a) && std::isfinite(b)) stats.worst = std::max(stats.worst, std::fabs(a - b) / tol);
    if (std::isfinite(a) && std::isfinite(b) && std::fabs(a - b) <= tol) continue;
    return ::testing::AssertionFailure()
           << "norms[" << i << "] (" << ts[i].scalar_type() << ", " << ts[i].numel()
           << " elements): got " << a << ", want " << b << " (tolerance " << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

// A list with every dtype (complex64 and complex128 as (re, im) pairs),
// empty and 1-element tensors, odd sizes, unaligned slices and layouts that
// need temporaries, and one big contiguous float32 tensor of several chunks
// (the last entry) to plant into; with every inv_scale/found_inf option,
// with inf/NaN in its first, middle and last chunk and its last element,
// and in a random other tensor.
std::vector<NormsCase> norms_cases(uint64_t seed, int64_t nentries, int64_t max_numel) {
  std::mt19937_64 rng(seed);
  std::vector<EntrySpec> entries;
  const EntrySpec one{1, at::kHalf, {1, 0, 0},
                      {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}};
  entries.push_back(one);
  for (int64_t i = 0; i < nentries; ++i) entries.push_back(random_entry(rng, max_numel));
  entries.push_back({0, at::kFloat, {0, 0, 0},
                     {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
  entries.push_back({7 * max_numel + 5, at::kFloat, {1, 0, 0},
                     {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
  const size_t big = entries.size() - 1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Option {
    const char* name;
    std::optional<float> inv, found;
    double scale;
  };
  const Option options[] = {
      {"plain", std::nullopt, std::nullopt, 1.0},
      {"inv_scale 1/1024 + found_inf", 1.f / 1024, 0.f, 1024.0},
      {"inv_scale 1/3", 1.f / 3, std::nullopt, 3.0},
      {"found_inf", std::nullopt, 0.f, 1.0},
      {"found_inf already 1", 1.f / 64, 1.f, 64.0},
  };
  std::vector<NormsCase> cases;
  for (const Option& o : options) {
    NormsCase base;
    base.entries = entries;
    base.inv_scale = o.inv;
    base.found_inf = o.found;
    base.scale = o.scale;
    base.seed = seed;
    NormsCase c = base;
    c.name = std::string(o.name) + ", all finite";
    cases.push_back(c);
    int k = 0;
    for (Spot spot : {Spot::kFirstChunk, Spot::kMiddleChunk, Spot::kLastChunk,
                      Spot::kLastElement}) {
      c = base;
      const double v = k % 3 == 0 ? kInf : k % 3 == 1 ? nan : -kInf;
      c.name = std::string(o.name) + ", " + std::to_string(v) + " in the big tensor's " +
               (spot == Spot::kFirstChunk    ? "first chunk"
                : spot == Spot::kMiddleChunk ? "middle chunk"
                : spot == Spot::kLastChunk   ? "last chunk"
                                             : "last element");
      c.plants = {{big, spot, v}};
      c.seed = seed + 11 * ++k;
      cases.push_back(c);
    }
    c = base;
    const size_t other = 1 + rng() % nentries;
    c.name = std::string(o.name) + ", inf in tensors[" + std::to_string(other) + "]'s last element";
    c.plants = {{other, Spot::kLastElement, kInf}};
    cases.push_back(c);
  }
  return cases;
}

// fp16 tensors whose unscaled values mostly fall below half fp16's smallest
// subnormal (|x| <= 2 with inv_scale 2^-26): unscale_ stores zeros there,
// so those elements add nothing to the norms and do not count in the
// 0-norm, however small x * inv_scale is in float32 (float32 tensors beside
// them: nothing underflows).
NormsCase norms_underflow_case() {
  NormsCase c;
  c.name = "unscaled values underflow the dtype";
  c.seed = 61;
  c.ords = {0, 1, 2, 3, 0.5};
  c.inv_scale = std::ldexp(1.f, -26);  // fp16: |x| <= 2 -> 0
  c.found_inf = 0.f;
  for (at::ScalarType dt : {at::kHalf, at::kHalf, at::kFloat}) {
    for (int64_t numel : {1000, 37, 4}) {
      c.entries.push_back({numel, dt, {0, 0, 0},
                           {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
    }
  }
  return c;
}

}  // namespace

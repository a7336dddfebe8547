// cuda_on_host: the CUDA kernels' launch plans and bodies (csrc/ops/cuda/kernels/),
// executed on the CPU by the host runner (every block and thread of every
// launch, in forward, reverse and shuffled order), compared bit for bit with
// torchext's CPU kernels called through the dispatcher on copies of the same
// inputs. For fp32/fp64 (and complex) ASGD they are also compared with an
// emulation of torch.optim.ASGD's for-loop path as torch's CUDA kernels
// round it (one FMA in each `add` with alpha, every other operation rounded
// on its own).
// The cases and the comparisons are cuda_cases.h, shared with
// test_cuda_on_device.cpp (ctest cuda_on_device: the real CUDA kernels).
#include "../csrc/ops/cuda/kernels/amp_kernels.h"
#include "../csrc/ops/cuda/kernels/asgd_kernels.h"
#include "../csrc/ops/cuda/kernels/norms_kernels.h"
#include "../csrc/ops/cuda/kernels/swap_kernels.h"
#include "cuda_cases.h"
#include "host_runner.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torchext/torchext.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

using torchext::kernels::BlockOrder;
using torchext::kernels::HostRunner;
using torchext::kernels::LaunchLimits;
using torchext::kernels::ParamLayout;
using torchext::kernels::PlantedBug;
using torchext::kernels::RunCounts;

// ---------------------------------------------------------------------------
// Statistics: launches, blocks and elements the runner emulated, per op.

std::map<std::string, RunCounts>& totals() {
  static std::map<std::string, RunCounts> t;
  return t;
}

template <typename Runner>
void add_counts(const Runner& r) {
  for (const auto& [name, c] : r.counts()) {
    RunCounts& t = totals()[name];
    t.launches += c.launches;
    t.blocks += c.blocks;
    t.threads += c.threads;
    t.elements += c.elements;
  }
}

class SummaryPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    // One line: per op (the label before ':'), summed over its kernels.
    std::map<std::string, RunCounts> per_op;
    for (const auto& [name, c] : totals()) {
      RunCounts& t = per_op[name.substr(0, name.find(':'))];
      t.launches += c.launches;
      t.blocks += c.blocks;
      t.threads += c.threads;
      t.elements += c.elements;
    }
    if (per_op.empty()) return;  // nothing ran on the host runner (e.g. only CudaDevice.*)
    std::ostringstream line;
    line << "cuda_on_host summary (launches, blocks, elements emulated):";
    for (const auto& [op, c] : per_op) {
      line << " " << op << " " << c.launches << " launches, " << c.blocks << " blocks, "
           << c.elements << " elements;";
    }
    std::printf("%s\n", line.str().c_str());
    const NormsStats& n = norms_stats();
    if (n.compared > 0) {
      std::printf("tensor_norms vs the CPU kernel (inexact orders): %lld norms compared, %lld "
                  "not bit for bit, the largest difference %.3f of its tolerance\n",
                  static_cast<long long>(n.compared), static_cast<long long>(n.differed), n.worst);
    }
  }
};
const auto* const kSummary = ::testing::AddGlobalTestEnvironment(new SummaryPrinter);

// ---------------------------------------------------------------------------
// Launch shapes and block orders.

struct Shape {
  const char* name;
  LaunchLimits limits;
};
// Small shapes make a handful of small tensors continue across launches and
// fill every launch's tensor slots; the production shapes are tested too.
// Each in both parameter layouts: the large one (eager CUDA launches) and
// the classic one (while a CUDA graph captures): their metadata differ in
// size and in the type of the block-to-slot index.
constexpr ParamLayout kLarge = ParamLayout::kLarge;
constexpr ParamLayout kClassic = ParamLayout::kClassic;
const Shape kTiny{"tiny", {16, 5, 3, 2, kLarge}};  // chunk 16, 5 blocks, 3 slots, 2 threads
const Shape kTinyClassic{"tiny classic", {16, 5, 3, 2, kClassic}};
const Shape kSmall{"small", {64, 7, 4, 8, kLarge}};  // chunk 64, 7 blocks, 4 slots, 8 threads
const Shape kSmallClassic{"small classic", {64, 7, 4, 8, kClassic}};
// Chunk auto (4K to 64K), 512 threads; 2,048 blocks (large), 320 (classic).
const Shape kProduction{"production", {}};
const Shape kProductionClassic{"production classic", {0, 0, 0, 512, kClassic}};
const Shape* const kSmallShapes[] = {&kTiny, &kTinyClassic, &kSmall, &kSmallClassic};

const BlockOrder kOrders[] = {BlockOrder::kForward, BlockOrder::kReverse, BlockOrder::kShuffled};
const char* order_name(BlockOrder o) {
  return o == BlockOrder::kForward ? "forward" : o == BlockOrder::kReverse ? "reverse" : "shuffled";
}

template <PlantedBug Bug = PlantedBug::kNone>
HostRunner<Bug> make_runner(const Shape& s, BlockOrder o, uint64_t seed, bool lr_in_device = false) {
  typename HostRunner<Bug>::Options opt;
  opt.limits = s.limits;
  opt.order = o;
  opt.seed = seed;
  opt.lr_in_device_memory = lr_in_device;
  return HostRunner<Bug>(opt);
}

// ---------------------------------------------------------------------------
// asgd_

// The same call's arguments as the kernels read them.
torchext::ASGDArgs host_args(const ASGDCase& c, const ASGDTensors& t) {
  using torchext::TensorRefs;
  torchext::ASGDArgs a =
      torchext::asgd_args(TensorRefs(at::TensorList(t.params)), TensorRefs(at::TensorList(t.grads)),
                          TensorRefs(at::TensorList(t.axs)), t.lr, hyper_of(c), opt(t.grad_scale),
                          opt(t.found_inf), opt(t.clip_coef));
  if (c.packed) {
    a.packed_mus = t.packed_mus;
    a.packed_etas = t.packed_etas;
    a.packed_steps = t.packed_steps;
  } else {
    a.mus = torchext::TensorRefs(at::TensorList(t.mus));
    a.etas = torchext::TensorRefs(at::TensorList(t.etas));
    a.steps = torchext::TensorRefs(at::TensorList(t.steps));
  }
  a.rounding_seed = c.rounding_seed;
  if (!c.rounding_ids.empty()) a.rounding_ids = c.rounding_ids;
  if (!c.rounding_offsets.empty()) a.rounding_offsets = c.rounding_offsets;
  return a;
}

template <typename Runner>
void run_on_host(const ASGDCase& c, ASGDTensors& t, Runner& runner) {
  runner.set_op("asgd_: ");
  for (int s = 0; s < c.steps; ++s) {
    // A skipped entry has no grad, as in a real step.
    ASGDTensors with_skips = t;
    for (size_t i = 0; i < c.skip.size(); ++i) {
      if (c.skip[i]) with_skips.grads[i] = at::Tensor();
    }
    torchext::kernels::asgd_launch(host_args(c, with_skips), runner);
  }
}

// torch.optim.ASGD's for-loop step as torch's CUDA kernels round it, per
// element: grad * inv_scale (GradScaler.unscale_), grad * clip_coef
// (clip_grad_norm_'s multiply: a float64 coefficient is rounded to a float32
// grad's dtype first, as a 0-d tensor operand is), maximize's negation,
// grad.add(param, alpha=wd) = one FMA, param.mul_(1 - lambd*eta),
// param.add_(grad, alpha=-eta) = one FMA, ax.add_(param.sub(ax).mul_(mu))
// (three rounded operations, adding with alpha 1 is exact before rounding)
// or ax.copy_(param) when mu == 1; then step += 1 and eta, mu from Python
// float math. Written independently of elementwise_math.h.
template <typename T>
void emulate_torch_cuda_entry(T* p, T* ax, const T* g, int64_t n, double eta, double mu,
                              const ASGDCase& c, float inv_scale) {
  const T decay = static_cast<T>(1.0 - c.lambd * eta);
  const T alpha_step = static_cast<T>(-eta);
  const T wd = static_cast<T>(c.weight_decay);
  const T tmu = static_cast<T>(mu);
  const T clip = !c.clip_coef      ? T(1)
                 : c.clip_double   ? static_cast<T>(*c.clip_coef)
                                   : static_cast<T>(static_cast<float>(*c.clip_coef));
  for (int64_t i = 0; i < n; ++i) {
    T grad = g[i];
    if (c.grad_scale) grad = grad * static_cast<T>(inv_scale);
    if (c.clip_coef) grad = grad * clip;
    if (c.maximize) grad = -grad;
    if (c.weight_decay != 0) grad = std::fma(p[i], wd, grad);
    T param = p[i] * decay;
    param = std::fma(grad, alpha_step, param);
    p[i] = param;
    if (mu != 1.0) {
      const T d = param - ax[i];
      const T e = d * tmu;
      ax[i] = ax[i] + e;
    } else {
      ax[i] = param;
    }
  }
}

// The expected tensors after c.steps steps (fp32/fp64/complex entries only;
// others are copied from `got` so that only the emulated ones are compared).
ASGDTensors emulate_torch_cuda(const ASGDCase& c, const ASGDTensors& initial,
                               const ASGDTensors& got) {
  ASGDTensors e = initial.deep_copy();
  const float inv_scale = c.grad_scale ? static_cast<float>(1.0 / *c.grad_scale) : 1.f;
  const auto n = c.entries.size();
  const auto state = [&](const std::vector<at::Tensor>& l, const at::Tensor& packed,
                         size_t i) { return c.packed ? packed[static_cast<int64_t>(i)] : l[i]; };
  for (int s = 0; s < c.steps; ++s) {
    if (c.found_inf && *c.found_inf != 0) break;
    for (size_t i = 0; i < n; ++i) {
      if (!c.skip.empty() && c.skip[i]) continue;
      at::Tensor stp = state(e.steps, e.packed_steps, i);
      at::Tensor eta_t = state(e.etas, e.packed_etas, i);
      at::Tensor mu_t = state(e.mus, e.packed_mus, i);
      const double eta = eta_t.item<double>(), mu = mu_t.item<double>();
      const at::ScalarType dt = c.entries[i].dtype;
      if (dt == at::kFloat || dt == at::kDouble || at::isComplexType(dt)) {
        const auto real = [](const at::Tensor& t) {
          return (t.is_complex() ? at::view_as_real(t) : t).contiguous();
        };
        at::Tensor p = real(e.params[i]), ax = real(e.axs[i]), g = real(e.grads[i]);
        if (p.scalar_type() == at::kFloat) {
          emulate_torch_cuda_entry<float>(p.data_ptr<float>(), ax.data_ptr<float>(),
                                          g.data_ptr<float>(), p.numel(), eta, mu, c, inv_scale);
        } else {
          emulate_torch_cuda_entry<double>(p.data_ptr<double>(), ax.data_ptr<double>(),
                                           g.data_ptr<double>(), p.numel(), eta, mu, c,
                                           inv_scale);
        }
        (e.params[i].is_complex() ? at::view_as_real(e.params[i]) : e.params[i]).copy_(p);
        (e.axs[i].is_complex() ? at::view_as_real(e.axs[i]) : e.axs[i]).copy_(ax);
      }
      const double step = stp.item<double>() + 1;
      // A tensor lr is float32; torch reads it as a Python float.
      const double lr = c.tensor_lr ? static_cast<double>(static_cast<float>(c.lr)) : c.lr;
      stp.fill_(step);
      if (c.tensor_lr) {
        // torch's tensor arithmetic on a float32 lr: one float32 rounding per
        // operation. `** alpha` is std::pow(float, double) as on torch's CPU
        // (its sqrt/square/cube special cases aside); on a GPU torch and
        // torchext both call powf, which the host runner cannot reproduce.
        const float lr_f = static_cast<float>(lr);
        const float base = 1.0f + (static_cast<float>(c.lambd) * lr_f) * static_cast<float>(step);
        const float pw = c.alpha == 0.5   ? std::sqrt(base)
                         : c.alpha == 2.0 ? base * base
                         : c.alpha == 3.0 ? base * base * base
                                          : static_cast<float>(std::pow(static_cast<double>(base),
                                                                        c.alpha));
        eta_t.fill_(static_cast<double>(lr_f / pw));
      } else {
        eta_t.fill_(lr / std::pow(1 + c.lambd * lr * step, c.alpha));
      }
      mu_t.fill_(1.0 / std::max(1.0, step - c.t0));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const at::ScalarType dt = c.entries[i].dtype;
    if (dt == at::kHalf || dt == at::kBFloat16) {
      e.params[i] = got.params[i].clone();
      e.axs[i] = got.axs[i].clone();
    }
  }
  return e;
}

// Runs case c on the host runner and checks it against the CPU kernels
// (when the CPU ISA fuses like torch's CUDA kernels) and the emulation.
template <PlantedBug Bug = PlantedBug::kNone>
::testing::AssertionResult check_asgd_case(const ASGDCase& c, const Shape& shape, BlockOrder order,
                                           bool count = true) {
  Arena arena;
  ASGDTensors host = make_asgd_tensors(c, arena);
  const ASGDTensors initial = host.deep_copy();
  ASGDTensors ref = host.deep_copy();
  auto runner = make_runner<Bug>(shape, order, c.seed + 7, c.lr_in_device);
  run_on_host(c, host, runner);
  if (count) add_counts(runner);
  const std::string where = c.describe() + ", " + shape.name + " shape, " + order_name(order) +
                            " order: ";
  if (auto r = arena.guards_intact(); !r) return ::testing::AssertionFailure() << where << r.message();
  if (cpu_isa_fuses()) {
    run_reference(c, ref);
    if (auto r = same_asgd_results(c, host, ref); !r) {
      return ::testing::AssertionFailure() << where << "vs CPU kernel: " << r.message();
    }
  }
  const ASGDTensors emu = emulate_torch_cuda(c, initial, host);
  if (auto r = same_asgd_results(c, host, emu); !r) {
    return ::testing::AssertionFailure() << where << "vs torch's CUDA rounding: " << r.message();
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaOnHost, AsgdRandomListsEveryOrder) {
  int checked = 0;
  for (const Shape* shape : kSmallShapes) {
    const bool tiny = shape == &kTiny || shape == &kTinyClassic;
    for (uint64_t seed = 1; seed <= 12; ++seed) {
      const ASGDCase c = random_asgd_case(seed * 101 + tiny, 14, 150);
      for (BlockOrder o : kOrders) {
        EXPECT_TRUE(check_asgd_case(c, *shape, o));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 144);
}

// Each option on its own, over one list that has everything else.
TEST(CudaOnHost, AsgdOptions) {
  ASGDCase base = random_asgd_case(4242, 12, 120);
  base.found_inf.reset();
  base.grad_scale.reset();
  std::vector<ASGDCase> cases;
  for (bool packed : {false, true}) {
    for (at::ScalarType sd : {at::kFloat, at::kDouble}) {
      ASGDCase c = base;
      c.packed = packed;
      c.state_dtype = sd;
      c.name = "state";
      cases.push_back(c);
      c.name = "found_inf unset";
      c.found_inf = 0.f;
      cases.push_back(c);
      c.name = "found_inf set";
      c.found_inf = 1.f;
      cases.push_back(c);
      c.found_inf.reset();
      c.name = "grad_scale";
      c.grad_scale = 65536.f;
      cases.push_back(c);
      c.name = "grad_scale + found_inf unset";
      c.found_inf = 0.f;
      cases.push_back(c);
      c.grad_scale.reset();
      c.found_inf.reset();
      for (int lr_kind = 0; lr_kind < 3; ++lr_kind) {
        c.name = "lr kind " + std::to_string(lr_kind);
        c.tensor_lr = lr_kind != 0;
        c.lr_in_device = lr_kind == 2;
        cases.push_back(c);
      }
      c.name = "weight decay + maximize";
      c.weight_decay = 0.02;
      c.maximize = true;
      cases.push_back(c);
      c.name = "mu == 1";
      c.t0 = 1e6;
      cases.push_back(c);
    }
  }
  for (const auto& c : cases) {
    EXPECT_TRUE(check_asgd_case(c, kTiny, BlockOrder::kShuffled));
    EXPECT_TRUE(check_asgd_case(c, kTinyClassic, BlockOrder::kReverse));
  }
}

// Entries the plan skips (as it skips entries whose grad is undefined):
// nothing of them is written, their schedule does not advance, and the
// others are exactly what the CPU kernel makes of the list without them.
TEST(CudaOnHost, AsgdSkippedEntries) {
  for (bool packed : {false, true}) {
    for (uint64_t seed : {11, 12, 13}) {
      ASGDCase c = random_asgd_case(seed, 10, 100);
      c.packed = packed;
      c.found_inf.reset();
      c.name = "skips";
      std::mt19937_64 rng(seed);
      for (size_t i = 0; i < c.entries.size(); ++i) c.skip.push_back(rng() % 3 == 0);
      c.skip[0] = true;
      EXPECT_TRUE(check_asgd_case(c, kTiny, BlockOrder::kReverse));
      // Skipped entries untouched.
      Arena arena;
      ASGDTensors t = make_asgd_tensors(c, arena);
      const ASGDTensors before = t.deep_copy();
      auto runner = make_runner(kTiny, BlockOrder::kForward, seed);
      run_on_host(c, t, runner);
      for (size_t i = 0; i < c.entries.size(); ++i) {
        if (!c.skip[i]) continue;
        EXPECT_TRUE(same_bits(t.params[i], before.params[i], "skipped param"));
        EXPECT_TRUE(same_bits(t.axs[i], before.axs[i], "skipped ax"));
        const auto s = [&](const std::vector<at::Tensor>& l, const at::Tensor& pk) {
          return packed ? pk[static_cast<int64_t>(i)] : l[i];
        };
        EXPECT_TRUE(same_bits(s(t.steps, t.packed_steps), s(before.steps, before.packed_steps),
                              "skipped step"));
        EXPECT_TRUE(same_bits(s(t.etas, t.packed_etas), s(before.etas, before.packed_etas),
                              "skipped eta"));
      }
    }
  }
  // Every entry skipped: no launch at all.
  ASGDCase c = random_asgd_case(5, 4, 50);
  c.skip.assign(4, true);
  Arena arena;
  ASGDTensors t = make_asgd_tensors(c, arena);
  auto runner = make_runner(kTiny, BlockOrder::kForward, 1);
  run_on_host(c, t, runner);
  EXPECT_TRUE(runner.counts().empty());
}

// Tensors whose chunk boundaries fall mid-vector or at odd offsets, on
// every alignment of each of p, g, ax.
TEST(CudaOnHost, AsgdAlignmentsAndTails) {
  for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble}) {
    ASGDCase c;
    c.name = std::string("alignments ") + c10::toString(dt);
    c.seed = 77;
    for (int64_t numel : {1, 3, 4, 5, 15, 16, 17, 33, 63, 64, 65, 127}) {
      for (int64_t op = 0; op < 4; ++op) {
        c.entries.push_back({numel, dt, {op, (op + 1) % 4, (op * 3) % 4},
                             {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
      }
    }
    c.weight_decay = 0.01;
    for (const Shape* s : kSmallShapes) EXPECT_TRUE(check_asgd_case(c, *s, BlockOrder::kForward));
  }
}

// The classic production launch shape: a list longer than one launch's
// tensor slots, and tensors that fill more than one launch's 320 blocks (one
// continues into the next launch, another spans three).
TEST(CudaOnHost, AsgdProductionShapeClassic) {
  ASGDCase many;
  many.name = "production, many tensors";
  many.seed = 3;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 90; ++i) many.entries.push_back(random_entry(rng, 3000));
  many.packed = false;  // 40 slots per launch
  EXPECT_TRUE(check_asgd_case(many, kProductionClassic, BlockOrder::kShuffled));
  many.packed = true;  // 67 slots per launch
  EXPECT_TRUE(check_asgd_case(many, kProductionClassic, BlockOrder::kReverse));

  ASGDCase big;
  big.name = "production, continuation";
  big.seed = 4;
  big.steps = 1;
  const int64_t chunk = torchext::kernels::kChunkSize;
  // 6 + 319 chunks: the launch fills its 320 blocks 314 chunks into the
  // second tensor, which continues as slot 0 of the next launch.
  for (int64_t numel : {5 * chunk + 3, 318 * chunk + 17, 2 * chunk + 1}) {
    big.entries.push_back({numel, at::kHalf, {0, 0, 0},
                           {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
  }
  big.entries[1].offset[1] = 1;  // one unaligned grad: the scalar loop for that tensor
  big.entries[2].dtype = at::kBFloat16;
  big.grad_scale = 8.f;
  EXPECT_TRUE(check_asgd_case(big, kProductionClassic, BlockOrder::kForward));
}

// 1000 small float32 and complex64 tensors (one dtype group: complex
// tensors are walked as float32) of every layout and alignment: more than
// one large launch's tensor slots (340 with list state, 566 with packed
// state).
ASGDCase asgd_many_tensors_case(bool packed) {
  ASGDCase c;
  c.name = "production, 1000 tensors";
  c.seed = 13;
  c.steps = 1;
  c.packed = packed;
  std::mt19937_64 rng(13);
  for (int i = 0; i < 1000; ++i) {
    c.entries.push_back(random_entry(rng, 600, true, {at::kFloat, at::kComplexFloat}));
  }
  return c;
}

// 300 float32 tensors of 28000 elements: 4K chunks, 7 per tensor, 2,100
// blocks. The first large launch fills its 2,048 blocks 4 chunks into
// tensor 292, which continues as slot 0 of the second launch.
ASGDCase asgd_continuation_case() {
  ASGDCase c;
  c.name = "production, continuation";
  c.seed = 14;
  c.steps = 1;
  c.packed = true;
  for (int i = 0; i < 300; ++i) {
    c.entries.push_back({28000, at::kFloat, {0, 0, 0},
                         {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
  }
  c.entries[292].offset[1] = 1;  // the continued tensor's grad unaligned: the scalar loop
  c.grad_scale = 4.f;
  return c;
}

// The large production launch shape, as eager CUDA launches use it.
TEST(CudaOnHost, AsgdProductionShape) {
  for (const bool packed : {false, true}) {
    const ASGDCase many = asgd_many_tensors_case(packed);
    EXPECT_TRUE(check_asgd_case(many, kProduction, BlockOrder::kShuffled));
    Arena arena;
    ASGDTensors t = make_asgd_tensors(many, arena);
    auto runner = make_runner(kProduction, BlockOrder::kForward, 1);
    run_on_host(many, t, runner);
    EXPECT_EQ(runner.counts().at("asgd_: asgd_ update").launches, packed ? 2 : 3);
  }
  const ASGDCase big = asgd_continuation_case();
  EXPECT_TRUE(check_asgd_case(big, kProduction, BlockOrder::kReverse));
  Arena arena;
  ASGDTensors t = make_asgd_tensors(big, arena);
  auto runner = make_runner(kProduction, BlockOrder::kForward, 1);
  run_on_host(big, t, runner);
  const RunCounts& update = runner.counts().at("asgd_: asgd_ update");
  EXPECT_EQ(update.launches, 2);
  EXPECT_EQ(update.blocks, 2100);
}

// Stochastic rounding: the bits of the CPU kernel, for every case of
// rounding_cases in every small shape (both parameter layouts) and block
// order, and at the production shapes.
TEST(CudaOnHost, AsgdStochasticRounding) {
  if (!cpu_isa_fuses()) GTEST_SKIP() << "the CPU kernels fuse like the CUDA kernels only with FMA";
  int checked = 0;
  for (const ASGDCase& c : rounding_cases(1, 10, 150)) {
    for (const Shape* shape : kSmallShapes) {
      for (BlockOrder o : kOrders) {
        EXPECT_TRUE(check_asgd_case(c, *shape, o));
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 16 * 4 * 3);
  // Tensors of several 4K chunks, 512 threads; the large layout's metadata
  // and the classic one's.
  for (const ASGDCase& c : rounding_cases(2, 8, 20000)) {
    EXPECT_TRUE(check_asgd_case(c, kProduction, BlockOrder::kShuffled));
    EXPECT_TRUE(check_asgd_case(c, kProductionClassic, BlockOrder::kReverse));
  }
}

// Stochastic rounding goes through its own launches (fp16/bf16 only) and
// changes their bits, nothing else: without rounding_seed, the same list
// gives the round-to-nearest results, which differ in some fp16/bf16
// elements and equal them in every other dtype.
TEST(CudaOnHost, AsgdStochasticRoundingOnlyWhereAsked) {
  for (const ASGDCase& sr : rounding_cases(3, 8, 100)) {
    ASGDCase nearest = sr;
    nearest.rounding_seed.reset();
    nearest.rounding_ids.clear();
    nearest.rounding_offsets.clear();
    Arena arena_sr, arena_nearest;
    ASGDTensors a = make_asgd_tensors(sr, arena_sr), b = make_asgd_tensors(nearest, arena_nearest);
    auto ra = make_runner(kSmall, BlockOrder::kForward, 1);
    auto rb = make_runner(kSmall, BlockOrder::kForward, 1);
    run_on_host(sr, a, ra);
    run_on_host(nearest, b, rb);
    const std::string sr_name = "asgd_: asgd_ update (stochastic rounding)";
    const std::string nearest_name = "asgd_: asgd_ update";
    EXPECT_GT(ra.counts().at(sr_name).launches, 0) << sr.describe();
    EXPECT_EQ(rb.counts().count(sr_name), 0u) << sr.describe();
    int64_t differ = 0;
    for (size_t i = 0; i < sr.entries.size(); ++i) {
      const at::ScalarType dt = sr.entries[i].dtype;
      if (dt == at::kHalf || dt == at::kBFloat16) {
        differ += (a.params[i].view(at::kShort) != b.params[i].view(at::kShort))
                      .sum()
                      .item<int64_t>();
      } else {
        EXPECT_TRUE(same_bits(a.params[i], b.params[i], "param"));
        EXPECT_TRUE(same_bits(a.axs[i], b.axs[i], "ax"));
      }
    }
    EXPECT_GT(differ, 0) << sr.describe() << ": stochastic rounding changed nothing";
  }
}

// The production chunk size follows the list: 64K chunks for tensors of
// more than 256K elements on average, down to 4K for small ones, about 8
// per tensor.
TEST(CudaOnHost, AutoChunkSize) {
  using torchext::kernels::auto_chunk_size;
  EXPECT_EQ(auto_chunk_size(200 * 50000, 200), 8192);
  EXPECT_EQ(auto_chunk_size(100 * 4000000LL, 100), 65536);
  EXPECT_EQ(auto_chunk_size(10000 * 100, 10000), 4096);
  EXPECT_EQ(auto_chunk_size(0, 0), 4096);
  EXPECT_EQ(auto_chunk_size(524288, 1), 65536);
  EXPECT_EQ(auto_chunk_size(524287, 1), 65536);
  EXPECT_EQ(auto_chunk_size(262145, 1), 65536);
  EXPECT_EQ(auto_chunk_size(262144, 1), 32768);

  // 40 float32 tensors of 50000 elements: chunks of 8192, 7 per tensor, 280
  // blocks; in the classic layout 40 tensors (list state) fill one launch.
  // The results are those of the CPU kernel, bit for bit.
  ASGDCase c;
  c.name = "production, 40 x 50000";
  c.seed = 9;
  c.steps = 1;
  for (int i = 0; i < 40; ++i) {
    c.entries.push_back({50000, at::kFloat, {0, 0, 0},
                         {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
  }
  EXPECT_TRUE(check_asgd_case(c, kProductionClassic, BlockOrder::kShuffled));
  Arena arena;
  ASGDTensors t = make_asgd_tensors(c, arena);
  auto runner = make_runner(kProductionClassic, BlockOrder::kForward, 1);
  run_on_host(c, t, runner);
  const RunCounts& update = runner.counts().at("asgd_: asgd_ update");
  EXPECT_EQ(update.launches, 1);
  EXPECT_EQ(update.blocks, 40 * 7);
}

// An executor that plans but runs nothing: it counts launches per kernel.
struct CountingExecutor {
  static constexpr bool kLargeParams = true;
  LaunchLimits lim;
  std::map<std::string, int64_t> launches;
  void enter(const c10::Device&) {}
  const LaunchLimits& limits() const { return lim; }
  bool kernel_reads(const at::Tensor&) const { return true; }
  at::Tensor pointer_table(int64_t count) const { return at::empty({count}, at::kLong); }
  at::Tensor scratch(int64_t bytes) const { return at::empty({bytes}, at::kByte); }
  template <typename Body, typename... Args>
  void launch(unsigned, unsigned, const Args&...) {
    ++launches[Body::kName];
  }
};

// Launches per step at the benchmark shapes (bench_cuda_host prints the same
// counts; docs/benchmarks.md lists them): asgd_'s update launches (its
// schedule is one more), and unscale_'s over the same grads.
TEST(CudaOnHost, LaunchesPerStep) {
  struct Want {
    int64_t n, numel;
    int packed_large, lists_large, scan_large, packed_classic, lists_classic, scan_classic;
  };
  for (const Want& w : {Want{200, 50000, 1, 1, 1, 5, 5, 5}, Want{1000, 1000, 2, 3, 1, 15, 25, 9},
                        Want{10000, 100, 18, 30, 10, 150, 250, 82},
                        Want{100, 4000000, 4, 4, 4, 20, 20, 20}}) {
    for (const ParamLayout layout : {kLarge, kClassic}) {
      for (const bool packed : {true, false}) {
        ASGDCase c;
        c.packed = packed;
        ASGDTensors t;
        for (int64_t i = 0; i < w.n; ++i) {
          // Never read: the plan only takes their pointers and sizes.
          t.params.push_back(at::empty({w.numel}));
          t.grads.push_back(at::empty({w.numel}));
          t.axs.push_back(at::empty({w.numel}));
          if (!packed) {
            t.mus.push_back(at::ones({}));
            t.etas.push_back(at::ones({}));
            t.steps.push_back(at::zeros({}));
          }
        }
        if (packed) {
          t.packed_mus = at::ones({w.n});
          t.packed_etas = at::ones({w.n});
          t.packed_steps = at::zeros({w.n});
        }
        t.lr = at::full({}, 0.1);
        CountingExecutor exec, scan;
        exec.lim.layout = scan.lim.layout = layout;
        torchext::kernels::asgd_launch(host_args(c, t), exec);
        torchext::kernels::unscale_launch(t.grads, at::zeros({}), at::ones({}), std::nullopt, scan);
        const bool large = layout == kLarge;
        const int want = packed ? (large ? w.packed_large : w.packed_classic)
                                : (large ? w.lists_large : w.lists_classic);
        const std::string where = std::to_string(w.n) + " x " + std::to_string(w.numel) +
                                  (packed ? " packed" : " lists") + (large ? " large" : " classic");
        EXPECT_EQ(exec.launches["asgd_ update"], want) << where;
        EXPECT_EQ(exec.launches.size(), 2u) << where;  // and one schedule launch
        EXPECT_EQ(scan.launches["scan"], large ? w.scan_large : w.scan_classic) << where;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// check_finite_ / unscale_

template <typename Runner>
void scan_on_host(const ScanCase& c, const std::vector<at::Tensor>& ts, const at::Tensor& found,
                  const at::Tensor& inv, Runner& runner) {
  if (c.inv_scale) {
    runner.set_op("unscale_: ");
    torchext::kernels::unscale_launch(ts, found, inv, c.clip(), runner);
  } else {
    runner.set_op("check_finite_: ");
    torchext::kernels::check_finite_launch(ts, found, runner);
  }
}
template <PlantedBug Bug = PlantedBug::kNone>
::testing::AssertionResult check_scan_case(const ScanCase& c, const Shape& shape, BlockOrder order,
                                           bool count = true) {
  Arena arena;
  // Where a planted value lands: in which chunk, for the auto chunk size a 64K one.
  const int64_t chunk = shape.limits.chunk_size > 0 ? shape.limits.chunk_size
                                                    : torchext::kernels::kChunkSize;
  const std::vector<at::Tensor> host = make_scan_tensors(c, arena, chunk);
  std::vector<at::Tensor> ref = clones(host);
  const at::Tensor found_host = at::full({}, c.found_inf, at::kFloat);
  const at::Tensor found_ref = found_host.clone();
  const at::Tensor inv = at::full({}, c.inv_scale.value_or(1.f), at::kFloat);
  auto runner = make_runner<Bug>(shape, order, c.seed + 3);
  scan_on_host(c, host, found_host, inv, runner);
  if (count) add_counts(runner);
  scan_reference(c, ref, found_ref, inv);
  const std::string where = c.name + ", " + shape.name + " shape, " + order_name(order) + ": ";
  if (auto r = arena.guards_intact(); !r) return ::testing::AssertionFailure() << where << r.message();
  if (auto r = same_bits(found_host, found_ref, "found_inf"); !r) {
    return ::testing::AssertionFailure() << where << r.message();
  }
  for (size_t i = 0; i < host.size(); ++i) {
    if (auto r = same_bits(host[i], ref[i], "tensors[" + std::to_string(i) + "]"); !r) {
      return ::testing::AssertionFailure() << where << r.message();
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaOnHost, CheckFiniteAndUnscale) {
  for (const Shape* shape : kSmallShapes) {
    for (uint64_t seed : {21, 22}) {
      for (const auto& c : scan_cases(seed, 16, 120)) {
        for (BlockOrder o : kOrders) EXPECT_TRUE(check_scan_case(c, *shape, o));
      }
    }
  }
}

TEST(CudaOnHost, CheckFiniteAndUnscaleProductionShape) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Classic: more than 123 tensors (one launch's slots), and a big tensor
  // of 64K chunks that continues past 320 blocks.
  {
    const int64_t chunk = torchext::kernels::kChunkSize;
    std::mt19937_64 rng(5);
    std::vector<EntrySpec> entries;
    for (int i = 0; i < 130; ++i) entries.push_back(random_entry(rng, 2000));
    entries.push_back({326 * chunk + 9, at::kHalf, {0, 0, 0},
                       {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
    const size_t big = entries.size() - 1;
    // unscale_ over a list whose last tensor continues into a second launch;
    // check_finite_ with a NaN in that tensor's last 64K elements (in a later launch).
    ScanCase unscale{"production, finite", entries, {}, 1.f / 64, 0.f, 6};
    EXPECT_TRUE(check_scan_case(unscale, kProductionClassic, BlockOrder::kShuffled));
    ScanCase check{"production, NaN in the last chunk", entries, {{big, -2, nan}},
                   std::nullopt, 0.f, 6};
    EXPECT_TRUE(check_scan_case(check, kProductionClassic, BlockOrder::kReverse));
  }
  // Large: more than 1022 tensors, and a big tensor of 4K chunks (the list's
  // mean is small) that continues past 2,048 blocks.
  {
    const int64_t chunk = torchext::kernels::kMinChunkSize;
    std::mt19937_64 rng(6);
    std::vector<EntrySpec> entries;
    for (int i = 0; i < 1100; ++i) entries.push_back(random_entry(rng, 300));
    entries.push_back({2100 * chunk + 9, at::kHalf, {0, 0, 0},
                       {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
    const size_t big = entries.size() - 1;
    ScanCase unscale{"production, finite", entries, {}, 1.f / 64, 0.f, 7};
    EXPECT_TRUE(check_scan_case(unscale, kProduction, BlockOrder::kShuffled));
    ScanCase check{"production, NaN in the last chunk", entries, {{big, -2, nan}},
                   std::nullopt, 0.f, 7};
    EXPECT_TRUE(check_scan_case(check, kProduction, BlockOrder::kReverse));
  }
}

// ---------------------------------------------------------------------------
// update_scale_

TEST(CudaOnHost, UpdateScale) {
  int cases = 0;
  HostRunner<> runner;
  runner.set_op("update_scale_: ");
  for (float scale : {1.f, 65536.f, 3.4e38f, 1e-30f}) {
    for (float found : {0.f, 1.f}) {
      for (int growth : {0, 1, 1999}) {
        for (int hyst : {0, 1, 2}) {
          for (int64_t hysteresis : {1, 2}) {
            for (auto [lo, hi] : {std::pair{torchext::UpdateScaleSettings::kNoMinScale,
                                            torchext::UpdateScaleSettings::kNoMaxScale},
                                  std::pair{1.0, 65536.0 * 2}}) {
              at::Tensor s[2], g[2], h[2];
              const at::Tensor f = at::full({}, found, at::kFloat);
              for (int k = 0; k < 2; ++k) {
                s[k] = at::full({}, scale, at::kFloat);
                g[k] = at::full({}, growth, at::kInt);
                h[k] = at::full({}, hyst, at::kInt);
              }
              const torchext::UpdateScaleSettings settings{
                  .growth_factor = 2.0,
                  .backoff_factor = 0.5,
                  .growth_interval = 2000,
                  .hysteresis = hysteresis,
                  .min_scale = lo,
                  .max_scale = hi};
              torchext::kernels::update_scale_launch(
                  {.scale = s[0], .growth_tracker = g[0], .hysteresis_tracker = h[0],
                   .found_inf = f, .settings = settings},
                  runner);
              // The CPU kernel, through the dispatcher.
              torchext::call_update_scale({.scale = s[1], .growth_tracker = g[1],
                                           .hysteresis_tracker = h[1], .found_inf = f,
                                           .settings = settings});
              EXPECT_TRUE(same_bits(s[0], s[1], "scale"));
              EXPECT_TRUE(same_bits(g[0], g[1], "growth_tracker"));
              EXPECT_TRUE(same_bits(h[0], h[1], "hysteresis_tracker"));
              ++cases;
            }
          }
        }
      }
    }
  }
  add_counts(runner);
  EXPECT_EQ(cases, 288);
}

// ---------------------------------------------------------------------------
// swap_

template <PlantedBug Bug = PlantedBug::kNone>
::testing::AssertionResult check_swap_case(const SwapCase& c, const Shape& shape, BlockOrder order) {
  Arena arena;
  std::mt19937_64 rng(c.seed);
  std::vector<at::Tensor> a, b;
  for (const auto& [x, y] : c.pairs) {
    a.push_back(arena.make(x.numel, x.dtype, x.offset[0], x.layout[0], rng));
    b.push_back(arena.make(y.numel, y.dtype, y.offset[0], y.layout[0], rng));
  }
  std::vector<at::Tensor> ra = clones(a), rb = clones(b);
  auto runner = make_runner<Bug>(shape, order, c.seed);
  runner.set_op("swap_: ");
  torchext::kernels::swap_launch(a, b, runner);
  add_counts(runner);
  static const auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("torchext::swap_", "")
      .typed<void(at::TensorList, at::TensorList)>();
  op.call(ra, rb);
  const std::string where = c.name + ", " + shape.name + " shape, " + order_name(order) + ": ";
  if (auto r = arena.guards_intact(); !r) return ::testing::AssertionFailure() << where << r.message();
  for (size_t i = 0; i < a.size(); ++i) {
    for (auto r : {same_bits(a[i], ra[i], "tensors[" + std::to_string(i) + "]"),
                   same_bits(b[i], rb[i], "others[" + std::to_string(i) + "]")}) {
      if (!r) return ::testing::AssertionFailure() << where << r.message();
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaOnHost, Swap) {
  for (const Shape* shape : kSmallShapes) {
    for (uint64_t seed : {31, 32, 33}) {
      const SwapCase c = random_swap_case(seed, 20, 150);
      for (BlockOrder o : kOrders) EXPECT_TRUE(check_swap_case(c, *shape, o));
    }
  }
  // More pairs than one production launch holds: 88 (classic), 730 (large).
  for (uint64_t seed : {34, 35}) {
    EXPECT_TRUE(check_swap_case(random_swap_case(seed, 150, 150), kProductionClassic,
                                kOrders[seed % 3]));
    EXPECT_TRUE(check_swap_case(random_swap_case(seed, 800, 150), kProduction, kOrders[seed % 3]));
  }
}

// ---------------------------------------------------------------------------
// tensor_norms

template <PlantedBug Bug = PlantedBug::kNone>
HostRunner<Bug> make_norms_runner(const Shape& s, BlockOrder o, uint64_t seed,
                                  uint8_t scratch_fill = 0xFF) {
  typename HostRunner<Bug>::Options opt;
  opt.limits = s.limits;
  opt.order = o;
  opt.seed = seed;
  opt.scratch_fill = scratch_fill;
  return HostRunner<Bug>(opt);
}

std::optional<at::Tensor> scalar_or_none(const std::optional<float>& v) {
  return v ? std::optional<at::Tensor>(at::full({}, *v, at::kFloat)) : std::nullopt;
}

// Runs case c on the host runner, order by order, against the CPU kernel:
// the norms within close_norms' tolerance, found_inf bit for bit, and
// nothing written but found_inf.
template <PlantedBug Bug = PlantedBug::kNone>
::testing::AssertionResult check_norms_case(const NormsCase& c, const Shape& shape,
                                            BlockOrder order, bool count = true,
                                            uint8_t scratch_fill = 0xFF) {
  Arena arena;
  const int64_t chunk = shape.limits.chunk_size > 0 ? shape.limits.chunk_size
                                                    : torchext::kernels::kChunkSize;
  const std::vector<at::Tensor> all = make_norms_tensors(c, arena, chunk);
  const std::vector<at::Tensor> before = clones(all);
  for (const double ord : c.ords) {
    const std::vector<at::Tensor> ts = norms_list(all, ord);
    const std::optional<at::Tensor> inv = scalar_or_none(c.inv_scale);
    const std::optional<at::Tensor> found_host = scalar_or_none(c.found_inf);
    const std::optional<at::Tensor> found_ref = scalar_or_none(c.found_inf);
    auto runner = make_norms_runner<Bug>(shape, order, c.seed + 5, scratch_fill);
    runner.set_op("tensor_norms: ");
    const at::Tensor got = torchext::kernels::tensor_norms_launch(ts, ord, inv, found_host, runner);
    if (count) add_counts(runner);
    const at::Tensor want = norms_reference(ts, ord, inv, found_ref);
    const std::string where = c.name + ", ord " + std::to_string(ord) + ", " + shape.name +
                              " shape, " + order_name(order) + ": ";
    if (auto r = arena.guards_intact(); !r) return ::testing::AssertionFailure() << where << r.message();
    for (size_t i = 0; i < all.size(); ++i) {
      if (auto r = same_bits(all[i], before[i], "tensors[" + std::to_string(i) + "]"); !r) {
        return ::testing::AssertionFailure() << where << "written: " << r.message();
      }
    }
    if (found_host) {
      if (auto r = same_bits(*found_host, *found_ref, "found_inf"); !r) {
        return ::testing::AssertionFailure() << where << r.message();
      }
    }
    if (auto r = close_norms(got, want, ts, ord); !r) {
      return ::testing::AssertionFailure() << where << "vs CPU kernel: " << r.message();
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(CudaOnHost, NormsEveryOrderAndOption) {
  int checked = 0;
  for (const Shape* shape : kSmallShapes) {
    for (uint64_t seed : {71, 72}) {
      for (const auto& c : norms_cases(seed, 16, 120)) {
        for (BlockOrder o : kOrders) {
          EXPECT_TRUE(check_norms_case(c, *shape, o));
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 4 * 2 * 30 * 3);
}

// Sizes around the vector width and the chunk, on every alignment, in each
// real dtype and complex64: the vector loop, its tail and the scalar loop.
TEST(CudaOnHost, NormsAlignmentsAndTails) {
  for (at::ScalarType dt : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble,
                            at::kComplexFloat}) {
    NormsCase c;
    c.name = std::string("alignments ") + c10::toString(dt);
    c.seed = 73;
    c.inv_scale = 0.25f;
    c.found_inf = 0.f;
    for (int64_t numel : {1, 3, 4, 5, 15, 16, 17, 33, 63, 64, 65, 127}) {
      for (int64_t off = 0; off < 4; ++off) {
        c.entries.push_back({numel, dt, {off, 0, 0},
                             {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}});
      }
    }
    for (const Shape* s : kSmallShapes) EXPECT_TRUE(check_norms_case(c, *s, BlockOrder::kShuffled));
    // inf in each tensor's last element: found_inf must see it wherever it falls.
    for (size_t i = 0; i < c.entries.size(); ++i) c.plants.push_back({i, Spot::kLastElement, kInf});
    c.name += ", inf last";
    for (const Shape* s : kSmallShapes) EXPECT_TRUE(check_norms_case(c, *s, BlockOrder::kReverse));
  }
}

TEST(CudaOnHost, NormsUnscaledUnderflow) {
  const NormsCase c = norms_underflow_case();
  for (const Shape* s : kSmallShapes) EXPECT_TRUE(check_norms_case(c, *s, BlockOrder::kForward));
  EXPECT_TRUE(check_norms_case(c, kProduction, BlockOrder::kShuffled));
}

// The production shapes: 10,000 tensors of mixed dtypes (more than one
// launch holds in either layout), and a tensor continued across launches.
NormsCase norms_many_tensors_case() {
  NormsCase c;
  c.name = "production, 10000 tensors";
  c.seed = 74;
  c.ords = {2, kInf};
  c.inv_scale = 1.f / 512;
  c.found_inf = 0.f;
  c.scale = 512;
  std::mt19937_64 rng(74);
  for (int i = 0; i < 10000; ++i) {
    c.entries.push_back(random_entry(rng, 150, true, {at::kFloat, at::kHalf, at::kBFloat16,
                                                      at::kDouble, at::kComplexFloat}));
  }
  c.plants = {{9999, Spot::kLastElement, std::numeric_limits<double>::quiet_NaN()}};
  return c;
}

// 3 + 326 + 2 chunks of 64K: a tensor that continues past the classic
// layout's 320 blocks; and a float32 tensor of 2,100 4K chunks (the list's
// mean is small) past the large layout's 2,048, beside 1,100 small ones.
NormsCase norms_continuation_case(bool large) {
  NormsCase c;
  c.name = large ? "production, continued past 2048 blocks" : "production, continued past 320 blocks";
  c.seed = 75;
  c.ords = {1, 2};
  c.inv_scale = 1.f / 8;
  c.found_inf = 0.f;
  c.scale = 8;
  const EntrySpec dense{0, at::kFloat, {0, 0, 0},
                        {Layout::kContiguous, Layout::kContiguous, Layout::kContiguous}};
  if (large) {
    std::mt19937_64 rng(75);
    for (int i = 0; i < 1100; ++i) c.entries.push_back(random_entry(rng, 300));
    EntrySpec e = dense;
    e.numel = 2100 * torchext::kernels::kMinChunkSize + 9;
    c.entries.push_back(e);
  } else {
    const int64_t chunk = torchext::kernels::kChunkSize;
    for (int64_t numel : {3 * chunk - 5, 326 * chunk + 9, 2 * chunk}) {
      EntrySpec e = dense;
      e.numel = numel;
      e.dtype = numel == 2 * chunk ? at::kBFloat16 : at::kHalf;
      c.entries.push_back(e);
    }
    c.entries[1].offset[0] = 1;  // unaligned: the scalar loop
  }
  c.plants = {{c.entries.size() - 1, Spot::kLastChunk, kInf}};
  return c;
}

TEST(CudaOnHost, NormsProductionShapes) {
  const NormsCase many = norms_many_tensors_case();
  EXPECT_TRUE(check_norms_case(many, kProduction, BlockOrder::kShuffled));
  EXPECT_TRUE(check_norms_case(many, kProductionClassic, BlockOrder::kReverse));
  EXPECT_TRUE(check_norms_case(norms_continuation_case(false), kProductionClassic,
                               BlockOrder::kShuffled));
  EXPECT_TRUE(check_norms_case(norms_continuation_case(true), kProduction, BlockOrder::kReverse));
}

// The same bits in both parameter layouts and every block order: a partial
// is its chunk's alone, the chunks do not depend on the layout, and the
// combine adds a tensor's partials in chunk order.
TEST(CudaOnHost, NormsSameBitsInEveryLayoutAndOrder) {
  NormsCase c = norms_continuation_case(false);
  std::mt19937_64 rng(76);
  for (int i = 0; i < 150; ++i) c.entries.push_back(random_entry(rng, 5000));
  c.plants.clear();
  Arena arena;
  const std::vector<at::Tensor> ts = make_norms_tensors(c, arena, torchext::kernels::kChunkSize);
  for (const double ord : {1.0, 2.0, 3.0}) {
    std::optional<at::Tensor> first;
    for (const Shape* shape : {&kProduction, &kProductionClassic}) {
      for (BlockOrder o : kOrders) {
        auto runner = make_norms_runner(*shape, o, 9);
        const at::Tensor got = torchext::kernels::tensor_norms_launch(
            ts, ord, scalar_or_none(c.inv_scale), std::nullopt, runner);
        if (!first) {
          first = got;
          EXPECT_TRUE(close_norms(got, norms_reference(ts, ord, scalar_or_none(c.inv_scale),
                                                       std::nullopt), ts, ord));
        } else {
          EXPECT_TRUE(same_bits(got, *first, "norms")) << shape->name << ", " << order_name(o);
        }
      }
    }
  }
}

// Bad input: the validator's error, before anything is launched or written.
TEST(CudaOnHost, NormsRefuseBadInputBeforeAnything) {
  const at::Tensor ok = at::randn({10}), empty = at::empty({0});
  const at::Tensor found = at::zeros({}, at::kFloat);
  const auto expect_refused = [&](const std::vector<at::Tensor>& ts, double ord,
                                  const std::optional<at::Tensor>& inv,
                                  const std::optional<at::Tensor>& f, const char* message) {
    auto runner = make_norms_runner(kTiny, BlockOrder::kForward, 1);
    try {
      torchext::kernels::tensor_norms_launch(ts, ord, inv, f, runner);
      ADD_FAILURE() << "not refused: " << message;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_TRUE(runner.counts().empty()) << message;
    EXPECT_EQ(found.item<float>(), 0.f);
  };
  expect_refused({ok, empty}, -1.0, std::nullopt, found, "is empty");
  expect_refused({ok, empty}, kInf, std::nullopt, found, "is empty");
  expect_refused({ok, at::ones({3}, at::kInt)}, 2.0, std::nullopt, found, "unsupported dtype");
  expect_refused({ok}, 2.0, at::ones({}, at::kDouble), found, "inv_scale must be a float32");
  expect_refused({ok}, 2.0, at::ones({2}), found, "exactly one element");
  expect_refused({ok}, 2.0, std::nullopt, at::zeros({}, at::kDouble), "found_inf");
  // An empty list launches nothing either, and gives an empty float32 result.
  auto runner = make_norms_runner(kTiny, BlockOrder::kForward, 1);
  const at::Tensor none = torchext::kernels::tensor_norms_launch({}, 2.0, std::nullopt, found, runner);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.scalar_type(), at::kFloat);
  EXPECT_TRUE(runner.counts().empty());
}

// Launches per call at the benchmark shapes (bench_cuda_host prints the
// same counts): the chunk launches, and one combine.
TEST(CudaOnHost, NormsLaunchesPerCall) {
  struct Want {
    int64_t n, numel;
    int large, classic;
  };
  for (const Want& w : {Want{200, 50000, 1, 5}, Want{1000, 1000, 1, 9},
                        Want{10000, 100, 10, 82}, Want{100, 4000000, 4, 20}}) {
    std::vector<at::Tensor> grads;
    for (int64_t i = 0; i < w.n; ++i) grads.push_back(at::empty({w.numel}));  // never read
    for (const ParamLayout layout : {kLarge, kClassic}) {
      CountingExecutor exec;
      exec.lim.layout = layout;
      torchext::kernels::tensor_norms_launch(grads, 2.0, at::ones({}), at::zeros({}), exec);
      const std::string where = std::to_string(w.n) + " x " + std::to_string(w.numel) +
                                (layout == kLarge ? " large" : " classic");
      EXPECT_EQ(exec.launches["norms"], layout == kLarge ? w.large : w.classic) << where;
      EXPECT_EQ(exec.launches["norms combine"], 1) << where;
      EXPECT_EQ(exec.launches.size(), 2u) << where;
    }
  }
}

// ---------------------------------------------------------------------------
// Planted bugs: the same comparisons must fail.

// How many of the tiny-shape cases fail in `shape`'s layout.
template <PlantedBug Bug>
int failing_cases(const Shape& shape, std::string* first) {
  int failures = 0;
  const auto note = [&](const ::testing::AssertionResult& r) {
    if (r) return;
    if (failures++ == 0) *first = r.message();
  };
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    note(check_asgd_case<Bug>(random_asgd_case(seed * 101 + 1, 14, 150), shape,
                              BlockOrder::kForward, /*count=*/false));
  }
  for (const auto& c : scan_cases(21, 16, 120)) {
    note(check_scan_case<Bug>(c, shape, BlockOrder::kForward, /*count=*/false));
  }
  return failures;
}

TEST(CudaOnHostPlantedBugs, ContinuationSkippingAChunkIsCaught) {
  for (const Shape* shape : {&kTiny, &kTinyClassic}) {
    std::string first;
    const int n = failing_cases<PlantedBug::kContinuationSkipsChunk>(*shape, &first);
    EXPECT_GT(n, 0) << shape->name
                    << ": a planner that loses a continued tensor's next chunk went unnoticed";
    std::printf("planted kContinuationSkipsChunk, %s: %d failing cases; first: %s\n",
                shape->name, n, first.substr(0, 300).c_str());
  }
  // The large production shape: the tensor continued past 2,048 blocks.
  const auto r = check_asgd_case<PlantedBug::kContinuationSkipsChunk>(
      asgd_continuation_case(), kProduction, BlockOrder::kForward, /*count=*/false);
  EXPECT_FALSE(r) << "the large layout's continued tensor lost a chunk unnoticed";
  std::printf("planted kContinuationSkipsChunk, production: %s\n",
              std::string(r.message()).substr(0, 300).c_str());
}

TEST(CudaOnHostPlantedBugs, WrongSlotIsCaught) {
  for (const Shape* shape : {&kTiny, &kTinyClassic}) {
    std::string first;
    const int n = failing_cases<PlantedBug::kWrongSlot>(*shape, &first);
    EXPECT_GT(n, 0) << shape->name
                    << ": a planner that points a block at the wrong tensor slot went unnoticed";
    std::printf("planted kWrongSlot, %s: %d failing cases; first: %s\n", shape->name, n,
                first.substr(0, 300).c_str());
  }
  // The large production shape: launches whose 340 (list state) or 566
  // (packed) slots are full; slot indices past 255 need the uint16 index.
  for (const bool packed : {false, true}) {
    const auto r = check_asgd_case<PlantedBug::kWrongSlot>(
        asgd_many_tensors_case(packed), kProduction, BlockOrder::kForward, /*count=*/false);
    EXPECT_FALSE(r) << "a wrong slot in a full large launch went unnoticed";
    std::printf("planted kWrongSlot, production %s: %s\n", packed ? "packed" : "lists",
                std::string(r.message()).substr(0, 300).c_str());
  }
}

// Stochastic rounding's element index counted from the chunk, or without
// the tensor's offset: the cases whose tensors span chunks (all of them in
// the tiny shapes), or that give offsets, fail.
TEST(CudaOnHostPlantedBugs, StochasticRoundingIndexIsChecked) {
  if (!cpu_isa_fuses()) GTEST_SKIP() << "the CPU kernels fuse like the CUDA kernels only with FMA";
  const std::vector<ASGDCase> cases = rounding_cases(4, 8, 120);
  for (const Shape* shape : {&kTiny, &kSmallClassic}) {
    int chunk_failures = 0, offset_failures = 0, with_offsets = 0;
    std::string first;
    for (const ASGDCase& c : cases) {
      const auto r = check_asgd_case<PlantedBug::kRoundingIndexFromChunk>(
          c, *shape, BlockOrder::kForward, /*count=*/false);
      if (!r && chunk_failures++ == 0) first = r.message();
      const auto o = check_asgd_case<PlantedBug::kRoundingOffsetDropped>(
          c, *shape, BlockOrder::kReverse, /*count=*/false);
      offset_failures += o ? 0 : 1;
      with_offsets += c.rounding_offsets.empty() ? 0 : 1;
      if (c.rounding_offsets.empty()) {
        EXPECT_TRUE(o) << "no offsets: the planted bug changes nothing, yet: " << o.message();
      }
    }
    EXPECT_EQ(chunk_failures, static_cast<int>(cases.size()))
        << shape->name << ": an element index counted from the chunk went unnoticed";
    EXPECT_EQ(offset_failures, with_offsets)
        << shape->name << ": dropped rounding_offsets went unnoticed";
    std::printf("planted kRoundingIndexFromChunk, %s: %d of %zu cases fail; first: %s\n",
                shape->name, chunk_failures, cases.size(), first.substr(0, 300).c_str());
    std::printf("planted kRoundingOffsetDropped, %s: %d of %d cases with offsets fail\n",
                shape->name, offset_failures, with_offsets);
  }
}

// tensor_norms' planted bugs, each over the cases it concerns: how many of
// them fail, and the first failure.
template <PlantedBug Bug>
int failing_norms_cases(const std::vector<NormsCase>& cases, const Shape& shape,
                        std::string* first, uint8_t scratch_fill = 0xFF) {
  const NormsStats kept = norms_stats();  // the statistics are the real kernels'
  int failures = 0;
  for (const auto& c : cases) {
    const auto r = check_norms_case<Bug>(c, shape, BlockOrder::kForward, /*count=*/false,
                                         scratch_fill);
    if (!r && failures++ == 0) *first = r.message();
  }
  norms_stats() = kept;
  return failures;
}

// A chunk's partial never written: the combine reads what the scratch holds,
// uninitialized memory (NaN here), or zeros (a partial lost from the sum).
TEST(CudaOnHostPlantedBugs, DroppedPartialIsCaught) {
  const std::vector<NormsCase> cases = norms_cases(71, 16, 120);
  for (const Shape* shape : {&kTiny, &kTinyClassic}) {
    for (const uint8_t fill : {uint8_t{0xFF}, uint8_t{0}}) {
      std::string first;
      const int n = failing_norms_cases<PlantedBug::kDroppedPartial>(cases, *shape, &first, fill);
      EXPECT_EQ(n, static_cast<int>(cases.size()))
          << shape->name << ", scratch filled with " << int(fill)
          << ": a lost partial went unnoticed in some cases";
      std::printf("planted kDroppedPartial, %s, scratch 0x%02X: %d of %zu cases fail; first: %s\n",
                  shape->name, fill, n, cases.size(), first.substr(0, 300).c_str());
    }
  }
  const NormsStats kept = norms_stats();
  const auto r = check_norms_case<PlantedBug::kDroppedPartial>(
      norms_continuation_case(true), kProduction, BlockOrder::kForward, false, 0);
  norms_stats() = kept;
  EXPECT_FALSE(r) << "the large layout's lost partial went unnoticed";
}

// x * inv_scale folded unrounded: the underflow case shows it (unscale_
// stores 0 where fp16 cannot hold the product).
TEST(CudaOnHostPlantedBugs, UnscaleNotRoundedIsCaught) {
  for (const Shape* shape : {&kTiny, &kSmallClassic, &kProduction}) {
    std::string first;
    const int n = failing_norms_cases<PlantedBug::kUnscaleNotRounded>({norms_underflow_case()},
                                                                     *shape, &first);
    EXPECT_EQ(n, 1) << shape->name << ": an unrounded unscale went unnoticed";
    std::printf("planted kUnscaleNotRounded, %s: %s\n", shape->name, first.substr(0, 300).c_str());
  }
}

// The inf/NaN check skipped in a load's partial lanes: found_inf misses an
// inf in a tensor's last element.
TEST(CudaOnHostPlantedBugs, TailCheckSkippedIsCaught) {
  std::vector<NormsCase> cases;
  for (const auto& c : norms_cases(72, 16, 120)) {
    if (c.found_inf && *c.found_inf == 0.f && !c.plants.empty() &&
        std::get<1>(c.plants[0]) == Spot::kLastElement) {
      NormsCase k = c;
      k.ords = {2};
      cases.push_back(k);
    }
  }
  ASSERT_EQ(cases.size(), 4u);
  for (const Shape* shape : kSmallShapes) {
    std::string first;
    const int n = failing_norms_cases<PlantedBug::kTailCheckSkipped>(cases, *shape, &first);
    EXPECT_GT(n, 0) << shape->name << ": an inf in a load's partial lanes went unnoticed";
    std::printf("planted kTailCheckSkipped, %s: %d of %zu cases fail; first: %s\n", shape->name,
                n, cases.size(), first.substr(0, 300).c_str());
  }
  const NormsStats kept = norms_stats();
  const auto r = check_norms_case<PlantedBug::kTailCheckSkipped>(
      norms_many_tensors_case(), kProduction, BlockOrder::kForward, false);
  norms_stats() = kept;
  EXPECT_FALSE(r) << "the production shape's NaN in a last element went unnoticed";
}

}  // namespace

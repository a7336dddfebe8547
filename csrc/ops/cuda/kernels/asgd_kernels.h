// torchext::asgd_ on an accelerator: the kernel bodies (C10_HOST_DEVICE) and
// the host-side plan that launches them through an executor: the CUDA
// executor (csrc/ops/cuda/asgd_cuda.cu) or the host runner
// (cpp_tests/host_runner.h), which runs the very same launches on the CPU.
//
// Launches, on one stream, in this order:
//   1. the elementwise update, one multi-tensor-apply series per dtype: every
//      block reads its tensor's old eta and mu; with a schedule table (list
//      state, or packed state where some entry does not step), the block of
//      chunk 0 also writes the tensor's (step, eta, mu) pointers into it;
//   2. the schedule (step += 1, then eta and mu from the new step), one
//      launch for any number of tensors: over the table, or, for packed state
//      where every entry steps, over the three packed arrays directly.
// The schedule comes after every elementwise block, so no chunk ever reads
// an eta/mu another chunk already advanced (nor, with stochastic rounding,
// a step: its blocks key their random bits by the old step + 1).
#pragma once

#include "../../asgd.h"
#include "../../../utils/cpu_scalars.h"
#include "multi_tensor_apply.h"
#include "torchext/elementwise_math.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <array>
#include <iterator>
#include <utility>
#include <vector>

namespace torchext {
namespace kernels {

// Pointer slots of the elementwise launch: p and ax are walked and stored, g
// is walked; eta, mu and step are per-tensor.
enum ASGDSlot { kP = 0, kAx = 1, kG = 2, kEta = 3, kMu = 4, kStep = 5 };

struct ASGDKernelArgs {
  const float* found_inf;   // nullptr: never skip
  const float* grad_scale;  // nullptr: grads are not scaled
  const void* clip_coef;    // nullptr: not clipped; else float or double (clip_is_double)
  void** schedule_table;    // nullptr: no table (packed state, every entry steps)
  const void* packed_etas;  // packed state without a table: eta and mu of
  const void* packed_mus;   //   entry i are element tag[slot] of these arrays
  double lambd;
  double weight_decay;
  bool maximize;
  bool state_is_double;
  bool clip_is_double;
};

// The elementwise launch's metadata. List state (or a table): 6 pointers
// per tensor, tag = its schedule-table row. Packed state where every entry
// steps: p, ax and g only, tag = the entry's index in the packed arrays, so
// that a launch holds more tensors (566 against 340 in the large layout).
template <ParamLayout L>
using ASGDListMeta = MetaFor<6, L, sizeof(ASGDKernelArgs)>;
template <ParamLayout L>
using ASGDPackedMeta = MetaFor<3, L, sizeof(ASGDKernelArgs)>;

// How ASGDElementwise stores a new fp16/bf16 parameter (its Rounding): to
// nearest, a cast; or stochastically (rounding_seed: RoundStochastic).
struct RoundToNearest {
  static constexpr int kWords = 0;  // per-tensor words after the pointers
  using KernelArgs = ASGDKernelArgs;
};

// Stochastic rounding's launch (fp16/bf16 parameters only) carries two
// 64-bit words per tensor in metadata slots after its pointers: its random
// stream (ASGDArgs::rounding_stream) and the index of its first element
// (rounding_offset). The planner moves them as it moves pointers (a
// continued tensor's too), and they reach every block as kernel parameters:
// no copy to the device, so a captured step replays them as they were. Each
// block reads its tensor's step itself (the schedule launch has not yet
// advanced it), so nothing is read on the host. The other launches keep
// their metadata and arguments: none of this is in them.
struct ASGDStochasticArgs : ASGDKernelArgs {
  const void* packed_steps;  // packed state without a table: entry i's step at tag[slot]
};
struct RoundStochastic {
  static constexpr int kWords = 2;  // stream, offset
  using KernelArgs = ASGDStochasticArgs;
  // The random bits' index of a chunk's first element: the tensor's
  // elements count from its offset, whatever chunk they fall in.
  C10_HOST_DEVICE static int64_t first_index(int64_t offset, int64_t chunk_begin) {
    return offset + chunk_begin;
  }
};

// A word in a pointer slot of the metadata, and back.
static_assert(sizeof(void*) == sizeof(uint64_t), "metadata words need 64-bit pointers");
inline void* word_slot(uint64_t w) { return reinterpret_cast<void*>(static_cast<uintptr_t>(w)); }
C10_HOST_DEVICE inline uint64_t slot_word(const void* p) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}

// The metadata of stochastic rounding's launches: the pointers of
// ASGDListMeta or ASGDPackedMeta, then the two words.
template <ParamLayout L>
using ASGDListRoundingMeta = MetaFor<6 + RoundStochastic::kWords, L, sizeof(ASGDStochasticArgs)>;
template <ParamLayout L>
using ASGDPackedRoundingMeta = MetaFor<3 + RoundStochastic::kWords, L, sizeof(ASGDStochasticArgs)>;

// ax_t: the average's storage, scalar_t or float for fp16/bf16 parameters
// (a float32 average: elementwise_math.h, asgd_average).
template <typename scalar_t, typename ax_t, typename Meta, typename Rounding = RoundToNearest>
struct ASGDElementwise {
  static constexpr bool kStochastic = Rounding::kWords > 0;
  static constexpr const char* kName =
      kStochastic ? "asgd_ update (stochastic rounding)" : "asgd_ update";
  static constexpr int kPtrs = Meta::kDepth - Rounding::kWords;  // then the words
  static constexpr bool kPacked = kPtrs == 3;
  static_assert(kPtrs == 3 || kPtrs == 6, "bad asgd_ metadata");
  static_assert(!kStochastic || std::is_same_v<scalar_t, c10::Half> ||
                    std::is_same_v<scalar_t, c10::BFloat16>,
                "stochastic rounding is for fp16/bf16 parameters");
  using Args = typename Rounding::KernelArgs;
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, const Meta& meta, const Args& args) const {
    if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
    const BlockChunk bc = block_chunk(meta, ctx.block);
    const void* eta_p;
    const void* mu_p;
    if constexpr (kPacked) {
      const int64_t off =
          static_cast<int64_t>(meta.tag[bc.slot]) * (args.state_is_double ? 8 : 4);
      eta_p = static_cast<const char*>(args.packed_etas) + off;
      mu_p = static_cast<const char*>(args.packed_mus) + off;
    } else {
      if (bc.first && ctx.thread == 0 && args.schedule_table != nullptr) {
        void** row = args.schedule_table + 3 * static_cast<int64_t>(meta.tag[bc.slot]);
        row[0] = meta.ptrs[kStep][bc.slot];
        row[1] = meta.ptrs[kEta][bc.slot];
        row[2] = meta.ptrs[kMu][bc.slot];
      }
      eta_p = meta.ptrs[kEta][bc.slot];
      mu_p = meta.ptrs[kMu][bc.slot];
    }
    if (bc.n <= 0) return;
    using opmath_t = at::opmath_type<scalar_t>;
    const bool unscale = args.grad_scale != nullptr;
    // Same float32 reciprocal as GradScaler.unscale_.
    const float inv_scale =
        unscale ? static_cast<float>(1.0 / static_cast<double>(*args.grad_scale)) : 1.f;
    const bool clipped = args.clip_coef != nullptr;
    const auto c = math::make_asgd_coeffs<opmath_t>(
        load_scalar(eta_p, args.state_is_double), load_scalar(mu_p, args.state_is_double),
        args.lambd, args.weight_decay, args.maximize, unscale, inv_scale, clipped,
        clipped ? load_scalar(args.clip_coef, args.clip_is_double) : 1.0);
    // Stochastic rounding's key (the step being taken: the old step + 1, as
    // the CPU kernel keys it) and the index of the chunk's first element.
    uint64_t sr_key = 0;
    int64_t sr_first = 0;
    if constexpr (kStochastic) {
      const void* step_p;
      if constexpr (kPacked) {
        step_p = static_cast<const char*>(args.packed_steps) +
                 static_cast<int64_t>(meta.tag[bc.slot]) * (args.state_is_double ? 8 : 4);
      } else {
        step_p = meta.ptrs[kStep][bc.slot];
      }
      const uint64_t stream = slot_word(meta.ptrs[kPtrs][bc.slot]);
      const auto offset = static_cast<int64_t>(slot_word(meta.ptrs[kPtrs + 1][bc.slot]));
      sr_key = math::sr_key(stream, math::add(load_scalar(step_p, args.state_is_double), 1.0));
      sr_first = Rounding::first_index(offset, bc.begin);
    }
    // One element (index i in the chunk; stochastic rounding only): the
    // parameter, rounded to its dtype on store; the average moves toward the
    // parameter as stored.
    const auto update = [&](scalar_t& p_s, ax_t& ax_s, scalar_t g_s, int64_t i) {
      opmath_t p = static_cast<opmath_t>(p_s);
      math::asgd_param(p, static_cast<opmath_t>(g_s), c, math::FusedMulAdd{});
      if constexpr (kStochastic) {
        p_s = math::round_stochastic<scalar_t>(p, math::sr_bits(sr_key, sr_first + i));
      } else {
        p_s = static_cast<scalar_t>(p);
      }
      opmath_t ax = static_cast<opmath_t>(ax_s);
      math::asgd_average(ax, static_cast<opmath_t>(p_s), c);
      ax_s = static_cast<ax_t>(ax);
    };
    scalar_t* const p = static_cast<scalar_t*>(meta.ptrs[kP][bc.slot]) + bc.begin;
    ax_t* const ax = static_cast<ax_t*>(meta.ptrs[kAx][bc.slot]) + bc.begin;
    scalar_t* const g = static_cast<scalar_t*>(meta.ptrs[kG][bc.slot]) + bc.begin;
    // The loops take the lanes' indices only where stochastic rounding needs
    // them: the other launches compile as they did without it.
    if constexpr (std::is_same_v<ax_t, scalar_t>) {
      scalar_t* const ptrs[3] = {p, ax, g};
      if constexpr (kStochastic) {
        chunk_loop(ctx, ptrs, bc.n, /*nstore=*/2, [&](scalar_t (&r)[3][kILP], const LaneIndex& at) {
          TORCHEXT_UNROLL
          for (int ii = 0; ii < kILP; ++ii) update(r[0][ii], r[1][ii], r[2][ii], at[ii]);
        });
      } else {
        chunk_loop(ctx, ptrs, bc.n, /*nstore=*/2, [&](scalar_t (&r)[3][kILP]) {
          TORCHEXT_UNROLL
          for (int ii = 0; ii < kILP; ++ii) update(r[0][ii], r[1][ii], r[2][ii], 0);
        });
      }
    } else {
      scalar_t* const ptrs[2] = {p, g};
      if constexpr (kStochastic) {
        chunk_loop_with(ctx, ptrs, ax, bc.n, /*nstore=*/1,
                        [&](scalar_t (&r)[2][kILP], ax_t (&u)[kILP], const LaneIndex& at) {
                          TORCHEXT_UNROLL
                          for (int ii = 0; ii < kILP; ++ii) {
                            update(r[0][ii], u[ii], r[1][ii], at[ii]);
                          }
                        });
      } else {
        chunk_loop_with(ctx, ptrs, ax, bc.n, /*nstore=*/1,
                        [&](scalar_t (&r)[2][kILP], ax_t (&u)[kILP]) {
                          TORCHEXT_UNROLL
                          for (int ii = 0; ii < kILP; ++ii) update(r[0][ii], u[ii], r[1][ii], 0);
                        });
      }
    }
  }
  static int64_t work(unsigned nblocks, unsigned, const Meta& meta, const Args&) {
    return elements_in_launch(meta, nblocks);
  }
};

struct ScheduleArgs {
  const float* found_inf;
  const void* lr_ptr;  // lr in device memory, or nullptr to use lr_value
  bool lr_is_double;
  bool lr_is_float;  // the user's lr tensor is not float64: float32 schedule math
  double lr_value;
  double lambd, alpha, t0;
  bool state_is_double;
};

// step += 1, then eta and mu from the new step, for one tensor.
C10_HOST_DEVICE inline void schedule_one(void* step_p, void* eta_p, void* mu_p,
                                         const ScheduleArgs& a) {
  const double lr = a.lr_ptr != nullptr ? load_scalar(a.lr_ptr, a.lr_is_double) : a.lr_value;
  const double step = math::add(load_scalar(step_p, a.state_is_double), 1.0);
  store_scalar(step_p, a.state_is_double, step);
  store_scalar(eta_p, a.state_is_double,
               math::asgd_eta(lr, a.lambd, a.alpha, step, a.lr_is_float));
  store_scalar(mu_p, a.state_is_double, math::asgd_mu(a.t0, step));
}

constexpr unsigned kScheduleThreads = 256;

// The schedule over the table rows the elementwise blocks wrote: one thread
// per row (step, eta, mu pointers).
struct ASGDScheduleTable {
  static constexpr const char* kName = "asgd_ schedule (table)";
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, void* const* table, int64_t n,
                                  const ScheduleArgs& args) const {
    const int64_t i = static_cast<int64_t>(ctx.block) * ctx.nthreads + ctx.thread;
    if (i >= n) return;
    if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
    schedule_one(table[3 * i], table[3 * i + 1], table[3 * i + 2], args);
  }
  static int64_t work(unsigned, unsigned, void* const*, int64_t n, const ScheduleArgs&) {
    return n;
  }
};

// The schedule over packed state (asgd_.packed): element i of each array.
struct ASGDSchedulePacked {
  static constexpr const char* kName = "asgd_ schedule (packed)";
  C10_HOST_DEVICE void operator()(const ThreadCtx& ctx, void* steps, void* etas, void* mus,
                                  int64_t n, const ScheduleArgs& args) const {
    const int64_t i = static_cast<int64_t>(ctx.block) * ctx.nthreads + ctx.thread;
    if (i >= n) return;
    if (args.found_inf != nullptr && *args.found_inf != 0.f) return;
    const int64_t off = i * (args.state_is_double ? sizeof(double) : sizeof(float));
    schedule_one(static_cast<char*>(steps) + off, static_cast<char*>(etas) + off,
                 static_cast<char*>(mus) + off, args);
  }
  static int64_t work(unsigned, unsigned, void*, void*, void*, int64_t n, const ScheduleArgs&) {
    return n;
  }
};

// ---- host side ------------------------------------------------------------

// The schedule's lr, the one place that reads ASGDArgs' lr: a value the host
// reads where that costs no device sync, else a pointer the kernel loads.
struct ScheduleLr {
  at::Tensor keep;  // a converted lr tensor, alive until the launch is queued
  const void* ptr = nullptr;
  bool is_double = false;
  double value = 0.0;
};

template <typename Exec>
ScheduleLr schedule_lr(const ASGDArgs& a, const Exec& exec) {
  ScheduleLr lr;
  if (exec.kernel_reads(a.lr)) {
    const at::Tensor& t = a.lr;
    lr.keep = t.scalar_type() == at::kDouble ? t : t.to(at::kFloat);
    lr.ptr = lr.keep.const_data_ptr();
    lr.is_double = lr.keep.scalar_type() == at::kDouble;
  } else {
    lr.value = a.lr_on_host();
  }
  return lr;
}

// asgd_ through `exec`. Each entry is checked in the same pass that reads its
// pointers (for_each_checked_entry); nothing is launched or written before
// the last one was.
template <typename Exec>
void asgd_launch(const ASGDArgs& a, Exec& exec) {
  const auto call = check_asgd_header(a);
  if (!call) return;  // no param has a grad
  const size_t n = a.params.size();
  const c10::Device device = call->device;
  const at::ScalarType state_dtype = call->state_dtype;
  exec.enter(device);
  const LaunchLimits limits = exec.limits();

  ASGDKernelArgs kargs{};
  kargs.found_inf = a.found_inf ? a.found_inf->const_data_ptr<float>() : nullptr;
  kargs.grad_scale = a.grad_scale ? a.grad_scale->const_data_ptr<float>() : nullptr;
  kargs.clip_coef = a.clip_coef ? a.clip_coef->const_data_ptr() : nullptr;
  kargs.clip_is_double = a.clip_coef && a.clip_coef->scalar_type() == at::kDouble;
  kargs.lambd = a.lambd;
  kargs.weight_decay = a.weight_decay;
  kargs.maximize = a.maximize;
  kargs.state_is_double = state_dtype == at::kDouble;

  // Entries grouped by (real) dtype and the average's dtype: one launch
  // series per group. Few pairs ever occur, so a linear search beats a map.
  // With stochastic rounding, a group also keeps its entries' words.
  using GroupKey = std::pair<at::ScalarType, at::ScalarType>;
  struct Group {
    GroupKey key;
    std::vector<TensorEntry<6>> entries;
    std::vector<std::array<uint64_t, RoundStochastic::kWords>> words;  // stochastic only
  };
  const bool stochastic = a.rounding_seed.has_value();
  std::vector<Group> groups;
  std::vector<DenseTriple> copies;  // written back after the launches
  int32_t nsteps = 0;  // entries that step (their schedule-table rows)
  for_each_checked_entry(a, *call, copies, [&](const ASGDFlatEntry& e) {
    TensorEntry<6> entry{{}, e.numel, nsteps++};
    entry.ptrs[kP] = e.p;
    entry.ptrs[kAx] = e.ax;
    entry.ptrs[kG] = const_cast<void*>(e.g);
    entry.ptrs[kEta] = a.eta_ptr(e.index);
    entry.ptrs[kMu] = a.mu_ptr(e.index);
    entry.ptrs[kStep] = a.step_ptr(e.index);
    const GroupKey key{e.dtype, e.ax_dtype};
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& grp) { return grp.key == key; });
    if (it == groups.end()) {
      groups.push_back(Group{key, {}, {}});
      it = std::prev(groups.end());
      it->entries.reserve(n);
    }
    it->entries.push_back(entry);
    if (stochastic) {
      it->words.push_back({a.rounding_stream(e.index),
                           static_cast<uint64_t>(a.rounding_offset(e.index))});
    }
  });
  if (nsteps == 0) return;

  // Packed state where every entry steps: the elementwise blocks read eta
  // and mu from the packed arrays (every entry's row is then its index: the
  // entries were read in order and none was skipped), and the schedule walks
  // the arrays. Otherwise the schedule walks the table rows the elementwise
  // blocks write (each entry then gets a block even when it has no elements).
  const bool packed_direct = a.packed() && static_cast<size_t>(nsteps) == n;
  at::Tensor table;
  if (packed_direct) {
    kargs.packed_etas = a.eta_ptr(0);
    kargs.packed_mus = a.mu_ptr(0);
  } else {
    table = exec.pointer_table(3 * static_cast<int64_t>(nsteps));
    kargs.schedule_table = static_cast<void**>(table.data_ptr());
  }
  ASGDStochasticArgs sr_args{};
  static_cast<ASGDKernelArgs&>(sr_args) = kargs;
  if (stochastic && packed_direct) sr_args.packed_steps = a.step_ptr(0);
  const EmptyTensors empty = packed_direct ? EmptyTensors::kSkip : EmptyTensors::kOneBlock;
  const auto series = [&](auto meta_tag, auto scalar_tag, auto ax_tag, auto rounding_tag,
                          const auto& entries, const auto& args) {
    using Meta = typename decltype(meta_tag)::type;
    using scalar_t = typename decltype(scalar_tag)::type;
    using ax_t = typename decltype(ax_tag)::type;
    using Rounding = typename decltype(rounding_tag)::type;
    multi_tensor_apply<Meta>(entries, limits, empty, [&](const Meta& meta, int nblocks) {
      exec.template launch<ASGDElementwise<scalar_t, ax_t, Meta, Rounding>>(
          static_cast<unsigned>(nblocks), limits.block_size, meta, args);
    });
  };
  // A group's entries with their words after their first P pointers.
  const auto with_words = [](auto ptrs_tag, const Group& grp) {
    constexpr int P = decltype(ptrs_tag)::value;
    constexpr int W = RoundStochastic::kWords;
    std::vector<TensorEntry<P + W>> out;
    out.reserve(grp.entries.size());
    for (size_t k = 0; k < grp.entries.size(); ++k) {
      const TensorEntry<6>& e = grp.entries[k];
      TensorEntry<P + W> x{{}, e.numel, e.tag};
      for (int d = 0; d < P; ++d) x.ptrs[d] = e.ptrs[d];
      for (int w = 0; w < W; ++w) x.ptrs[P + w] = word_slot(grp.words[k][w]);
      out.push_back(x);
    }
    return out;
  };
  const auto by_layout = [&](auto scalar_tag, auto ax_tag, const Group& grp) {
    with_param_layout<Exec::kLargeParams>(limits.layout, [&](auto layout) {
      constexpr ParamLayout L = decltype(layout)::value;
      if (packed_direct) {
        series(TypeTag<ASGDPackedMeta<L>>{}, scalar_tag, ax_tag, TypeTag<RoundToNearest>{},
               grp.entries, kargs);
      } else {
        series(TypeTag<ASGDListMeta<L>>{}, scalar_tag, ax_tag, TypeTag<RoundToNearest>{},
               grp.entries, kargs);
      }
    });
  };
  // fp16/bf16 parameters rounded stochastically: their own launches.
  const auto by_layout_stochastic = [&](auto scalar_tag, auto ax_tag, const Group& grp) {
    with_param_layout<Exec::kLargeParams>(limits.layout, [&](auto layout) {
      constexpr ParamLayout L = decltype(layout)::value;
      if (packed_direct) {
        series(TypeTag<ASGDPackedRoundingMeta<L>>{}, scalar_tag, ax_tag,
               TypeTag<RoundStochastic>{}, with_words(std::integral_constant<int, 3>{}, grp),
               sr_args);
      } else {
        series(TypeTag<ASGDListRoundingMeta<L>>{}, scalar_tag, ax_tag,
               TypeTag<RoundStochastic>{}, with_words(std::integral_constant<int, 6>{}, grp),
               sr_args);
      }
    });
  };
  for (const Group& grp : groups) {
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grp.key.first, "asgd_launch", [&] {
      if constexpr (std::is_same_v<scalar_t, at::Half> ||
                    std::is_same_v<scalar_t, at::BFloat16>) {
        const bool wide = grp.key.second == at::kFloat;  // a float32 average
        if (stochastic) {
          wide ? by_layout_stochastic(TypeTag<scalar_t>{}, TypeTag<float>{}, grp)
               : by_layout_stochastic(TypeTag<scalar_t>{}, TypeTag<scalar_t>{}, grp);
          return;
        }
        if (wide) {
          by_layout(TypeTag<scalar_t>{}, TypeTag<float>{}, grp);
          return;
        }
      }
      by_layout(TypeTag<scalar_t>{}, TypeTag<scalar_t>{}, grp);
    });
  }
  for (auto& d : copies) d.write_back();

  ScheduleArgs sargs{};
  sargs.found_inf = kargs.found_inf;
  sargs.lambd = a.lambd;
  sargs.alpha = a.alpha;
  sargs.t0 = a.t0;
  sargs.state_is_double = kargs.state_is_double;
  const ScheduleLr lr = schedule_lr(a, exec);
  sargs.lr_ptr = lr.ptr;
  sargs.lr_is_double = lr.is_double;
  sargs.lr_value = lr.value;
  sargs.lr_is_float = a.lr.scalar_type() != at::kDouble;
  const unsigned blocks = blocks_for(nsteps, kScheduleThreads);
  if (packed_direct) {
    exec.template launch<ASGDSchedulePacked>(blocks, kScheduleThreads, a.step_ptr(0),
                                             a.eta_ptr(0), a.mu_ptr(0),
                                             static_cast<int64_t>(nsteps), sargs);
  } else {
    exec.template launch<ASGDScheduleTable>(blocks, kScheduleThreads,
                                            static_cast<void* const*>(kargs.schedule_table),
                                            static_cast<int64_t>(nsteps), sargs);
  }
}

}  // namespace kernels
}  // namespace torchext

// The host side of the CUDA asgd_ step, timed without a GPU: the CUDA
// kernel's own plan (csrc/ops/cuda/kernels/asgd_kernels.h) through an executor that
// launches nothing, over CPU tensors standing in for device ones. What is
// timed is everything the CUDA kernel does on the host per step but the
// launches themselves: reading the dispatcher's lists (ASGDArgs), the header and
// per-entry checks, reading each entry's pointers, grouping, building the
// launch metadata (every launch's TensorListMeta, as it would be copied into
// the kernel's parameters) and the schedule table's allocation.
//
//   torchext_cuda_host_bench [--quick]
//
// Prints, per shape and state layout, microseconds per tensor for: the
// arguments (ASGDArgs over the lists, as the typed kernel makes them), the
// checks alone (check_asgd_args), and the whole plan (large parameter
// layout, as eager CUDA launches use it); the plan minus the checks is the
// pointer reading, grouping and metadata. Then the kernel launches one step
// makes at each shape, in both parameter layouts: eager (32 KB, CUDA 13
// builds) and captured into a CUDA graph (the classic 4 KB), and those of
// tensor_norms over the same grads (the clip's read). Timing is
// information, not a test: ctest runs it with --quick only to keep it built
// and working.
#include "../csrc/ops/asgd.h"
#include "../csrc/ops/cuda/kernels/amp_kernels.h"
#include "../csrc/ops/cuda/kernels/asgd_kernels.h"
#include "../csrc/ops/cuda/kernels/norms_kernels.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

namespace {

namespace k = torchext::kernels;

// The CUDA executor's interface (launch.cuh) minus the device: scalars the
// kernel would read stay pointers, the schedule table is host memory, and a
// launch only reads its metadata (as copying it into kernel parameters would).
struct NoLaunchExecutor {
  static constexpr bool kLargeParams = true;
  k::ParamLayout layout = k::ParamLayout::kLarge;
  int64_t launches = 0;
  uint64_t checksum = 0;
  void enter(const c10::Device&) {}
  k::LaunchLimits limits() const {
    k::LaunchLimits l;
    l.layout = layout;
    return l;
  }
  bool kernel_reads(const at::Tensor&) const { return true; }
  at::Tensor pointer_table(int64_t count) const { return at::empty({count}, at::kLong); }
  at::Tensor scratch(int64_t bytes) const { return at::empty({bytes}, at::kByte); }
  template <typename Body, typename... Args>
  void launch(unsigned blocks, unsigned, const Args&... args) {
    ++launches;
    ((checksum += bytes_of(args)), ...);
    checksum += blocks;
  }
  template <typename T>
  static uint64_t bytes_of(const T& x) {
    // Touch the argument's bytes the way a parameter copy would.
    uint64_t s = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(&x);
    for (size_t i = 0; i < sizeof(T); i += 64) s += p[i];
    return s;
  }
};

double median_us(const std::function<void()>& fn, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A list of n tensors of `numel` elements: random values, or, where only
// the plan is made (launch counts), left uninitialized (never touched).
at::Tensor make(int64_t numel, bool values) {
  return values ? at::randn({numel}) : at::empty({numel});
}

struct Lists {
  std::vector<at::Tensor> p, g, ax, mus, etas, steps;
  at::Tensor pm, pe, ps, lr;
};

Lists make_lists(int64_t n, int64_t numel, bool packed, bool values) {
  Lists l;
  for (int64_t i = 0; i < n; ++i) {
    l.p.push_back(make(numel, values));
    l.g.push_back(make(numel, values));
    l.ax.push_back(make(numel, values));
    if (!packed) {
      l.mus.push_back(at::ones({}));
      l.etas.push_back(at::full({}, 0.01));
      l.steps.push_back(at::zeros({}));
    }
  }
  l.pm = at::ones({n});
  l.pe = at::full({n}, 0.01);
  l.ps = at::zeros({n});
  l.lr = at::full({}, 0.01);
  return l;
}

const torchext::ASGDHyperparams kHyper{1e-4, 0.75, 0.0, 0.0, false};

// What the typed kernel does with the dispatcher's lists (asgd_registration.h).
struct ListArgs {
  torchext::TensorListArg p, g, ax, mus, etas, steps;
  explicit ListArgs(const Lists& l)
      : p(l.p), g(l.g), ax(l.ax), mus(l.mus), etas(l.etas), steps(l.steps) {}
  torchext::ASGDArgs args(const Lists& l, bool packed) const {
    using torchext::TensorRefs;
    torchext::ASGDArgs a = torchext::asgd_args(TensorRefs(p), TensorRefs(g), TensorRefs(ax), l.lr,
                                               kHyper, std::nullopt, std::nullopt);
    if (packed) {
      a.packed_mus = l.pm;
      a.packed_etas = l.pe;
      a.packed_steps = l.ps;
    } else {
      a.mus = TensorRefs(mus);
      a.etas = TensorRefs(etas);
      a.steps = TensorRefs(steps);
    }
    return a;
  }
};

void run(int64_t n, int64_t numel, bool packed, int reps) {
  const Lists lists = make_lists(n, numel, packed, /*values=*/true);
  const ListArgs lists_args(lists);
  NoLaunchExecutor exec;
  const double args_us = median_us([&] { (void)lists_args.args(lists, packed); }, reps);
  const torchext::ASGDArgs a = lists_args.args(lists, packed);
  const double checks = median_us([&] { torchext::check_asgd_args(a); }, reps);
  const double plan = median_us([&] { k::asgd_launch(a, exec); }, reps);
  const double per = 1.0 / static_cast<double>(n);
  std::printf("| %6lld x %-8lld | %-6s | %8.3f | %8.3f | %8.3f | %8.3f |\n",
              static_cast<long long>(n), static_cast<long long>(numel),
              packed ? "packed" : "lists", args_us * per, checks * per, (plan - checks) * per,
              (args_us + plan) * per);
}

struct StepLaunches {
  int64_t step, unscale, norms;
};

// Kernel launches of one asgd_ step (update launches + 1 schedule), of one
// unscale_ over the same grads, and of one tensor_norms over them (chunk
// launches + 1 combine), in `layout`.
StepLaunches launches_per_step(const Lists& l, bool packed, k::ParamLayout layout) {
  NoLaunchExecutor step, unscale, norms;
  step.layout = unscale.layout = norms.layout = layout;
  k::asgd_launch(ListArgs(l).args(l, packed), step);
  const at::Tensor found = at::zeros({}), inv = at::ones({});
  k::unscale_launch(l.g, found, inv, std::nullopt, unscale);
  k::tensor_norms_launch(l.g, 2.0, inv, found, norms);
  return {step.launches, unscale.launches, norms.launches};
}

void print_launches(int64_t n, int64_t numel) {
  for (const bool packed : {true, false}) {
    const Lists l = make_lists(n, numel, packed, /*values=*/false);
    const StepLaunches eager = launches_per_step(l, packed, k::ParamLayout::kLarge);
    const StepLaunches graph = launches_per_step(l, packed, k::ParamLayout::kClassic);
    std::printf("| %6lld x %-8lld | %-6s | %12lld | %12lld | %12lld | %12lld | %12lld | %12lld |\n",
                static_cast<long long>(n), static_cast<long long>(numel),
                packed ? "packed" : "lists", static_cast<long long>(eager.step),
                static_cast<long long>(graph.step), static_cast<long long>(eager.unscale),
                static_cast<long long>(graph.unscale), static_cast<long long>(eager.norms),
                static_cast<long long>(graph.norms));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  at::set_num_threads(1);
  const int reps = quick ? 3 : 51;
  std::printf("The CUDA asgd_ step's host side, no launches (us per tensor, median of %d)\n",
              reps);
  std::printf("| tensors x numel   | state  | args     | checks   | plan-chk | total    |\n");
  std::printf("|-------------------|--------|----------|----------|----------|----------|\n");
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{100, 10}}
            : std::vector<std::pair<int64_t, int64_t>>{{10000, 100}, {1000, 1000}, {200, 50000}};
  for (const auto& [n, numel] : shapes) {
    for (const bool packed : {true, false}) run(n, numel, packed, reps);
  }
  std::printf("\nKernel launches per step: asgd_ (update launches + 1 schedule), unscale_ and\n"
              "tensor_norms (chunk launches + 1 combine) over its grads; eager = 32 KB\n"
              "parameters (CUDA 13 builds), graph = 4 KB (while the stream captures a CUDA graph)\n");
  std::printf("| tensors x numel   | state  | asgd_ eager  | asgd_ graph  | unscale_ eag | unscale_ gr  | norms eager  | norms graph  |\n");
  std::printf("|-------------------|--------|--------------|--------------|--------------|--------------|--------------|--------------|\n");
  const std::vector<std::pair<int64_t, int64_t>> launch_shapes =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{100, 10}}
            : std::vector<std::pair<int64_t, int64_t>>{
                  {10000, 100}, {1000, 1000}, {200, 50000}, {10, 5000000}, {100, 4000000}};
  for (const auto& [n, numel] : launch_shapes) print_launches(n, numel);
  return 0;
}

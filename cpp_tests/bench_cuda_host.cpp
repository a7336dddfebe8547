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
// arguments (ASGDArgs over the lists, as the typed kernel makes them), the checks alone (check_asgd_args), and the whole plan; the plan
// minus the checks is the pointer reading, grouping and metadata. Timing is
// information, not a test: ctest runs it with --quick only to keep it built
// and working.
#include "../csrc/ops/asgd.h"
#include "../csrc/ops/cuda/kernels/asgd_kernels.h"

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
  int64_t launches = 0;
  uint64_t checksum = 0;
  void enter(const c10::Device&) {}
  k::LaunchLimits limits() const { return {}; }
  bool kernel_reads(const at::Tensor&) const { return true; }
  at::Tensor pointer_table(int64_t count) const { return at::empty({count}, at::kLong); }
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

void run(int64_t n, int64_t numel, bool packed, int reps) {
  std::vector<at::Tensor> p, g, ax, mus, etas, steps;
  for (int64_t i = 0; i < n; ++i) {
    p.push_back(at::randn({numel}));
    g.push_back(at::randn({numel}));
    ax.push_back(at::zeros({numel}));
    if (!packed) {
      mus.push_back(at::ones({}));
      etas.push_back(at::full({}, 0.01));
      steps.push_back(at::zeros({}));
    }
  }
  const at::Tensor pm = at::ones({n}), pe = at::full({n}, 0.01), ps = at::zeros({n});
  const at::Tensor lr = at::full({}, 0.01);
  const torchext::ASGDHyperparams h{1e-4, 0.75, 0.0, 0.0, false};
  using torchext::TensorListArg;
  const TensorListArg lp(p), lg(g), lax(ax), lmus(mus), letas(etas), lsteps(steps);
  // What the typed kernel does with the dispatcher's lists (asgd_registration.h).
  const auto args = [&] {
    torchext::ASGDArgs a =
        torchext::asgd_args(torchext::TensorRefs(lp), torchext::TensorRefs(lg),
                            torchext::TensorRefs(lax), lr, h, std::nullopt, std::nullopt);
    if (packed) {
      a.packed_mus = pm;
      a.packed_etas = pe;
      a.packed_steps = ps;
    } else {
      a.mus = torchext::TensorRefs(lmus);
      a.etas = torchext::TensorRefs(letas);
      a.steps = torchext::TensorRefs(lsteps);
    }
    return a;
  };
  NoLaunchExecutor exec;
  const double args_us = median_us([&] { (void)args(); }, reps);
  const torchext::ASGDArgs a = args();
  const double checks = median_us([&] { torchext::check_asgd_args(a); }, reps);
  const double plan = median_us([&] { k::asgd_launch(a, exec); }, reps);
  const double per = 1.0 / static_cast<double>(n);
  std::printf("| %6lld x %-8lld | %-6s | %8.3f | %8.3f | %8.3f | %8.3f | %8lld |\n",
              static_cast<long long>(n), static_cast<long long>(numel),
              packed ? "packed" : "lists", args_us * per, checks * per, (plan - checks) * per,
              (args_us + plan) * per, static_cast<long long>(exec.launches / (reps + 0)));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  at::set_num_threads(1);
  const int reps = quick ? 3 : 51;
  std::printf("The CUDA asgd_ step's host side, no launches (us per tensor, median of %d)\n",
              reps);
  std::printf("| tensors x numel   | state  | args     | checks   | plan-chk | total    | launches |\n");
  std::printf("|-------------------|--------|----------|----------|----------|----------|----------|\n");
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      quick ? std::vector<std::pair<int64_t, int64_t>>{{100, 10}}
            : std::vector<std::pair<int64_t, int64_t>>{{10000, 100}, {1000, 1000}, {200, 50000}};
  for (const auto& [n, numel] : shapes) {
    for (const bool packed : {true, false}) run(n, numel, packed, reps);
  }
  return 0;
}

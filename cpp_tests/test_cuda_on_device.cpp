// cuda_on_device: the cases of cuda_on_host (cuda_cases.h) through the real
// CUDA kernels, bit for bit against torchext's CPU kernels (tensor_norms:
// within close_norms' tolerance of them, and bit for bit against the host
// runner where no device math library is involved). Run by
// scripts/gpu_check.sh; every test skips without a GPU or without
// torchext's CUDA kernels.
#include "../csrc/ops/cuda/kernels/multi_tensor_apply.h"
#include "cuda_cases.h"
#include "host_runner.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>
#include <vector>

namespace {

bool have_cuda_kernels() {
  if (!torch::cuda::is_available()) return false;
  for (const char* name : {"torchext::asgd_", "torchext::tensor_norms"}) {
    const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
    if (!op.hasKernelForDispatchKey(c10::DispatchKey::CUDA)) return false;
  }
  return true;
}

std::optional<at::Tensor> on(const std::optional<float>& v, const at::Device& d) {
  return v ? std::optional<at::Tensor>(at::full({}, *v, at::TensorOptions(at::kFloat).device(d)))
           : std::nullopt;
}

TEST(CudaDevice, AsgdMatchesCpuKernelsBitForBit) {
  if (!have_cuda_kernels()) GTEST_SKIP() << "no CUDA device, or torchext built without CUDA";
  ASSERT_TRUE(cpu_isa_fuses()) << "the CPU kernels fuse like torch's CUDA kernels only with FMA";
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    ASGDCase c = random_asgd_case(seed * 13, 40, 300000);
    c.state_dtype = at::kFloat;  // float64 state: eta's pow is libdevice's on the GPU
    c.lr_in_device = false;
    c.steps = 3;
    Arena arena;
    ASGDTensors cpu = make_asgd_tensors(c, arena);
    ASGDTensors gpu = cpu.to(at::kCUDA);
    if (c.tensor_lr && seed % 2) gpu.lr = cpu.lr.clone();  // a CPU lr with CUDA params
    run_reference(c, cpu);
    for (int s = 0; s < c.steps; ++s) {
      call_asgd(c, gpu);
    }
    EXPECT_TRUE(same_asgd_results(c, gpu.to(at::kCPU), cpu)) << c.describe();
  }
}

// Stochastic rounding: rounding_cases (cuda_on_host's) at production chunk
// sizes, bit for bit against the CPU kernel. Float64 state takes one step
// (its schedule's pow is libdevice's on the GPU: the next step's eta would
// differ), which still keys the bits by the float64 step read on the device.
TEST(CudaDevice, AsgdStochasticRoundingMatchesCpuKernelsBitForBit) {
  if (!have_cuda_kernels()) GTEST_SKIP() << "no CUDA device, or torchext built without CUDA";
  ASSERT_TRUE(cpu_isa_fuses()) << "the CPU kernels fuse like torch's CUDA kernels only with FMA";
  for (ASGDCase c : rounding_cases(5, 12, 300000)) {
    if (c.state_dtype == at::kDouble) c.steps = 1;
    Arena arena;
    ASGDTensors cpu = make_asgd_tensors(c, arena);
    ASGDTensors gpu = cpu.to(at::kCUDA);
    run_reference(c, cpu);
    for (int s = 0; s < c.steps; ++s) {
      ASGDTensors with_skips = gpu;  // a skipped entry has no grad, as in a real step
      for (size_t i = 0; i < c.skip.size(); ++i) {
        if (c.skip[i]) with_skips.grads[i] = at::Tensor();
      }
      call_asgd(c, with_skips);
    }
    EXPECT_TRUE(same_asgd_results(c, gpu.to(at::kCPU), cpu)) << c.describe();
  }
}

TEST(CudaDevice, ScanMatchesCpuKernelsBitForBit) {
  if (!have_cuda_kernels()) GTEST_SKIP() << "no CUDA device, or torchext built without CUDA";
  for (const auto& c : scan_cases(41, 30, 200000)) {
    Arena arena;
    std::vector<at::Tensor> cpu = make_scan_tensors(c, arena, torchext::kernels::kChunkSize);
    std::vector<at::Tensor> gpu;
    for (const auto& t : cpu) gpu.push_back(t.to(at::kCUDA));
    const at::Tensor f_cpu = at::full({}, c.found_inf, at::kFloat), f_gpu = f_cpu.cuda();
    const at::Tensor inv = at::full({}, c.inv_scale.value_or(1.f), at::kFloat);
    scan_reference(c, cpu, f_cpu, inv);
    scan_reference(c, gpu, f_gpu, inv.cuda());  // (clip_coef on inv's device)
    EXPECT_TRUE(same_bits(f_gpu, f_cpu, "found_inf")) << c.name;
    for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(same_bits(gpu[i], cpu[i], c.name));
  }
}

TEST(CudaDevice, SwapMatchesCpuKernels) {
  if (!have_cuda_kernels()) GTEST_SKIP() << "no CUDA device, or torchext built without CUDA";
  const SwapCase c = random_swap_case(51, 100, 200000);
  Arena arena;
  std::mt19937_64 rng(c.seed);
  std::vector<at::Tensor> a, b, ga, gb;
  for (const auto& [x, y] : c.pairs) {
    a.push_back(arena.make(x.numel, x.dtype, x.offset[0], x.layout[0], rng));
    b.push_back(arena.make(y.numel, y.dtype, y.offset[0], y.layout[0], rng));
    ga.push_back(a.back().to(at::kCUDA));
    gb.push_back(b.back().to(at::kCUDA));
  }
  static const auto op = c10::Dispatcher::singleton()
      .findSchemaOrThrow("torchext::swap_", "")
      .typed<void(at::TensorList, at::TensorList)>();
  op.call(a, b);
  op.call(ga, gb);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(same_bits(ga[i], a[i], "tensors"));
    EXPECT_TRUE(same_bits(gb[i], b[i], "others"));
  }
}

// Every order and option of cuda_on_host's cases, larger tensors (production
// chunk sizes): the norms within close_norms' tolerance of the CPU kernel's,
// found_inf bit for bit, the tensors untouched.
TEST(CudaDevice, NormsMatchCpuKernels) {
  if (!have_cuda_kernels()) GTEST_SKIP() << "no CUDA device, or torchext built without CUDA";
  for (const auto& c : norms_cases(81, 30, 200000)) {
    Arena arena;
    const std::vector<at::Tensor> all =
        make_norms_tensors(c, arena, torchext::kernels::kChunkSize);
    for (const double ord : c.ords) {
      const std::vector<at::Tensor> cpu = norms_list(all, ord);
      std::vector<at::Tensor> gpu;
      for (const auto& t : cpu) gpu.push_back(t.to(at::kCUDA));
      const auto f_cpu = on(c.found_inf, at::kCPU), f_gpu = on(c.found_inf, at::kCUDA);
      const at::Tensor want = norms_reference(cpu, ord, on(c.inv_scale, at::kCPU), f_cpu);
      const at::Tensor got = norms_reference(gpu, ord, on(c.inv_scale, at::kCUDA), f_gpu);
      EXPECT_TRUE(close_norms(got, want, cpu, ord)) << c.name << ", ord " << ord;
      if (f_cpu) EXPECT_TRUE(same_bits(*f_gpu, *f_cpu, "found_inf")) << c.name;
      for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(same_bits(gpu[i], cpu[i], "tensors"));
    }
  }
}

// The real kernels against the host runner at the production launch shape:
// the same bits for the orders whose math is plain float/double arithmetic
// (0, 1, 2, inf, -inf) on real dtypes (pow and hypot are the device's own).
TEST(CudaDevice, NormsMatchHostRunnerBitForBit) {
  if (!have_cuda_kernels()) GTEST_SKIP() << "no CUDA device, or torchext built without CUDA";
  std::mt19937_64 rng(82);
  NormsCase c;
  c.inv_scale = 1.f / 256;
  c.scale = 256;
  c.seed = 82;
  for (int i = 0; i < 300; ++i) {
    c.entries.push_back(random_entry(rng, 300000, true, {at::kFloat, at::kHalf, at::kBFloat16,
                                                         at::kDouble}));
  }
  Arena arena;
  const std::vector<at::Tensor> all = make_norms_tensors(c, arena, torchext::kernels::kChunkSize);
  for (const double ord : {0.0, 1.0, 2.0, kInf, -kInf}) {
    const std::vector<at::Tensor> cpu = norms_list(all, ord);
    std::vector<at::Tensor> gpu;
    for (const auto& t : cpu) gpu.push_back(t.to(at::kCUDA));
    torchext::kernels::HostRunner<> runner;  // the production shape, large layout
    const at::Tensor host = torchext::kernels::tensor_norms_launch(
        cpu, ord, on(c.inv_scale, at::kCPU), std::nullopt, runner);
    const at::Tensor dev = norms_reference(gpu, ord, on(c.inv_scale, at::kCUDA), std::nullopt);
    EXPECT_TRUE(same_bits(dev, host, "norms")) << "ord " << ord;
  }
}

}  // namespace

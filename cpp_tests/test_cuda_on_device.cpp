// cuda_on_device: the cases of cuda_on_host (cuda_cases.h) through the real
// CUDA kernels, bit for bit against torchext's CPU kernels. Run by
// scripts/gpu_check.sh; every test skips without a GPU or without
// torchext's CUDA kernels.
#include "../csrc/ops/cuda/kernels/multi_tensor_apply.h"
#include "cuda_cases.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>
#include <vector>

namespace {

bool have_cuda_kernels() {
  if (!torch::cuda::is_available()) return false;
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "");
  return op.hasKernelForDispatchKey(c10::DispatchKey::CUDA);
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

}  // namespace

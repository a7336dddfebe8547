// torchext ops on the LibTorch stable ABI (torch/csrc/stable, target 2.13):
// a prototype measuring what moving the op library there would cost. Two ops
// of namespace torchext_stable, CPU kernels only:
//   check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()
//     the same schema and result as torchext::check_finite_ (float32 only);
//   asgd_fp32_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] axs,
//              float eta, float mu, float lambd, float weight_decay) -> ()
//     torch.optim.ASGD's elementwise update with given eta/mu (no step
//     schedule), through plain per-ISA C++ loops (asgd_loop.h).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "asgd_loop.h"

using torch::stable::Tensor;

extern "C" void proto_asgd_loop_default(float*, const float*, float*, int64_t, proto::Coeffs);
extern "C" void proto_asgd_loop_avx2(float*, const float*, float*, int64_t, proto::Coeffs);
extern "C" void proto_asgd_loop_avx512(float*, const float*, float*, int64_t, proto::Coeffs);

namespace {
using LoopFn = void (*)(float*, const float*, float*, int64_t, proto::Coeffs);

// The stable ABI has no at::cpu capability query: pick like ATen does, from
// the CPU and ATEN_CPU_CAPABILITY.
LoopFn pick_loop(std::string* name) {
  const char* env = std::getenv("ATEN_CPU_CAPABILITY");
  std::string want = env ? env : "";
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (avx512 && (want.empty() || want == "avx512")) {
    *name = "avx512";
    return proto_asgd_loop_avx512;
  }
  if (avx2 && want != "default") {
    *name = "avx2";
    return proto_asgd_loop_avx2;
  }
  *name = "default";
  return proto_asgd_loop_default;
}

std::string g_isa;
const LoopFn g_loop = pick_loop(&g_isa);

void check_finite_cpu(std::vector<Tensor> tensors, Tensor found_inf) {
  STD_TORCH_CHECK(found_inf.scalar_type() == torch::headeronly::ScalarType::Float &&
                      found_inf.numel() == 1 && found_inf.is_cpu(),
                  "check_finite_: found_inf must be a one-element float32 CPU tensor");
  bool bad = false;
  for (const Tensor& t : tensors) {
    STD_TORCH_CHECK(t.is_cpu() && t.scalar_type() == torch::headeronly::ScalarType::Float &&
                        t.is_contiguous(),
                    "check_finite_ (prototype): contiguous float32 CPU tensors only");
    const float* x = static_cast<const float*>(t.const_data_ptr());
    const int64_t n = t.numel();
    float acc = 0.0f;
    for (int64_t i = 0; i < n; ++i) acc += x[i] * 0.0f;  // NaN iff some x is inf/NaN
    bad |= std::isnan(acc);
  }
  if (bad) *static_cast<float*>(found_inf.mutable_data_ptr()) = 1.0f;
}

void asgd_fp32_cpu(std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> axs,
                   double eta, double mu, double lambd, double weight_decay) {
  const size_t n = params.size();
  STD_TORCH_CHECK(grads.size() == n && axs.size() == n, "asgd_fp32_: lists of different lengths");
  for (size_t i = 0; i < n; ++i) {
    for (const Tensor* t : {&params[i], &grads[i], &axs[i]}) {
      STD_TORCH_CHECK(t->is_cpu() && t->scalar_type() == torch::headeronly::ScalarType::Float &&
                          t->is_contiguous() && t->numel() == params[i].numel(),
                      "asgd_fp32_ (prototype): contiguous float32 CPU tensors of one size");
    }
  }
  proto::Coeffs c;
  c.weight_decay = static_cast<float>(weight_decay);
  c.has_weight_decay = weight_decay != 0.0;
  c.decay = static_cast<float>(1.0 - lambd * eta);
  c.step_size = static_cast<float>(-eta);
  c.mu = static_cast<float>(mu);
  c.average = mu != 1.0;
  for (size_t i = 0; i < n; ++i) {
    float* p = static_cast<float*>(params[i].mutable_data_ptr());
    const float* g = static_cast<const float*>(grads[i].const_data_ptr());
    float* ax = static_cast<float*>(axs[i].mutable_data_ptr());
    const int64_t numel = params[i].numel();
    if (numel < 32768) {
      g_loop(p, g, ax, numel, c);
    } else {
      // torch::stable::parallel_for (2.10+), chunks of whole cache lines
      torch::stable::parallel_for(0, (numel + 4095) / 4096, 4, [&](int64_t b, int64_t e) {
        const int64_t lo = b * 4096, hi = std::min(numel, e * 4096);
        g_loop(p + lo, g + lo, ax + lo, hi - lo, c);
      });
    }
  }
}

// Which loop runs (for the benchmark's bit-exactness table).
Tensor isa_probe(Tensor like) {
  Tensor out = torch::stable::new_empty(like, {static_cast<int64_t>(g_isa.size())},
                                        torch::headeronly::ScalarType::Byte);
  std::memcpy(out.mutable_data_ptr(), g_isa.data(), g_isa.size());
  return out;
}
}  // namespace

STABLE_TORCH_LIBRARY(torchext_stable, m) {
  m.def("check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()");
  m.def("asgd_fp32_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] axs, float eta, float mu, "
        "float lambd, float weight_decay) -> ()");
  m.def("isa_probe(Tensor like) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(torchext_stable, CPU, m) {
  m.impl("check_finite_", TORCH_BOX(&check_finite_cpu));
  m.impl("asgd_fp32_", TORCH_BOX(&asgd_fp32_cpu));
  m.impl("isa_probe", TORCH_BOX(&isa_probe));
}

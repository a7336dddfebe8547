// A float32 average for float16/bfloat16 parameters (issue 47):
// ASGDOptions::average_dtype, the state it creates, both checkpoint formats
// (ax re-taken in the rule's dtype on load), AveragedParameters' scratch
// copies, and the bit-for-bit replay of Python's runs (make_reference.py
// low_precision_reference: lowp_*.pt).
#include "common.h"

#include <torchext/torchext.h>

#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>
#include <functional>
#include <sstream>

using torchext::optim::ASGD;
using torchext::optim::ASGDOptions;
using torchext::optim::ASGDParamState;
using torch::optim::OptimizerParamGroup;
using namespace torchext_test;

namespace {

using Ref = std::map<std::string, torch::Tensor>;

// make_reference.py's LP_GROUPS: params {0, 1} with the default average_dtype
// (float32 ax), param 2 opted out (ax in the param's dtype).
std::unique_ptr<ASGD> lp_asgd(const std::vector<torch::Tensor>& params,
                              std::optional<bool> fused = std::nullopt) {
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]},
                      std::make_unique<ASGDOptions>(
                          ASGDOptions(0.05).lambd(1e-3).alpha(0.75).t0(3.0).weight_decay(1e-2)
                              .fused(fused)));
  groups.emplace_back(std::vector<torch::Tensor>{params[2]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.02).lambd(1e-4).alpha(0.75)
                                                        .t0(0.0).fused(fused)
                                                        .average_dtype(std::nullopt)));
  return std::make_unique<ASGD>(groups);
}

// Two groups with other options than the files': a load must set them.
std::unique_ptr<ASGD> other_asgd(const std::vector<torch::Tensor>& params) {
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.5)));
  groups.emplace_back(std::vector<torch::Tensor>{params[2]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.25)));
  return std::make_unique<ASGD>(groups);
}

std::vector<torch::Tensor> params_from(const Ref& ref, const std::string& key) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < 3; ++i) out.push_back(R(ref, idx(key, i)).clone().requires_grad_());
  return out;
}

void run(ASGD& opt, const std::vector<torch::Tensor>& params, const Ref& ref,
         const std::string& dtype, int64_t start, int64_t stop) {
  for (int64_t s = start; s < stop; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = R(ref, dtype + "/" + idx("grads", i))[s].clone();
    }
    opt.step();
  }
}

// Params and every state tensor equal (values and dtypes) to Python's `prefix`.
void expect_state(const ASGD& opt, const std::vector<torch::Tensor>& params, const Ref& ref,
                  const std::string& prefix) {
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    const auto& st = state_of(opt, params[i]);
    const std::vector<std::pair<std::string, torch::Tensor>> got = {
        {"param", params[i].detach()}, {"step", st.step()}, {"eta", st.eta()},
        {"mu", st.mu()}, {"ax", st.ax()}};
    for (const auto& [key, t] : got) {
      const auto& want = R(ref, prefix + idx(key, i));
      EXPECT_EQ(t.scalar_type(), want.scalar_type()) << key;
      EXPECT_TRUE(torch::equal(t, want)) << key << ": " << t << " vs " << want;
    }
  }
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

// Same dtype and bits.
void expect_identical(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(a, b)) << what;
}

void save_tensors(const std::vector<torch::Tensor>& ts, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> d;
  for (size_t i = 0; i < ts.size(); ++i) d.insert(idx("param", i), ts[i].detach().clone());
  const auto bytes = torch::jit::pickle_save(d);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST(LowPrecision, OptionIsValidatedAndCompared) {
  EXPECT_EQ(ASGDOptions().average_dtype(), std::optional<at::ScalarType>(at::kFloat));
  ASGDOptions().validate();
  ASGDOptions().average_dtype(std::nullopt).validate();
  for (const auto bad : {at::kDouble, at::kBFloat16, at::kHalf, at::kInt}) {
    EXPECT_THROW_MSG(ASGDOptions().average_dtype(bad).validate(),
                     "average_dtype must be at::kFloat");
    auto p = torch::zeros({2}, torch::kBFloat16).requires_grad_();
    EXPECT_THROW_MSG(ASGD({p}, ASGDOptions().average_dtype(bad)), "average_dtype");
  }
  EXPECT_FALSE(ASGDOptions() == ASGDOptions().average_dtype(std::nullopt));
  EXPECT_TRUE(ASGDOptions().average_dtype(std::nullopt) ==
              ASGDOptions().average_dtype(std::nullopt));
}

TEST(LowPrecision, StateCreationFollowsTheRule) {
  // {param dtype, average_dtype} -> ax dtype.
  const std::vector<std::tuple<at::ScalarType, std::optional<at::ScalarType>, at::ScalarType>>
      cases = {{at::kBFloat16, at::kFloat, at::kFloat},   {at::kHalf, at::kFloat, at::kFloat},
               {at::kBFloat16, std::nullopt, at::kBFloat16}, {at::kHalf, std::nullopt, at::kHalf},
               {at::kFloat, at::kFloat, at::kFloat},       {at::kDouble, at::kFloat, at::kDouble},
               {at::kComplexFloat, at::kFloat, at::kComplexFloat},
               {at::kFloat, std::nullopt, at::kFloat}};
  for (const auto& [dt, avg, want] : cases) {
    SCOPED_TRACE(c10::str(dt, " ", avg.has_value() ? c10::str(*avg) : "nullopt"));
    for (const bool fused : {true, false}) {
      auto p = torch::randn({3, 2}).to(dt).requires_grad_();
      ASGD opt({p}, ASGDOptions(0.1).t0(0).average_dtype(avg).fused(fused));
      p.mutable_grad() = torch::ones_like(p);
      opt.step();
      const auto& ax = state_of(opt, p).ax();
      EXPECT_EQ(ax.scalar_type(), want);
      // mu was 1: the first step copies the stepped param into ax.
      EXPECT_TRUE(torch::equal(ax, p.detach().to(want)));
    }
  }
}

// A bf16 average that would freeze in bf16 keeps moving in float32.
TEST(LowPrecision, Float32AverageKeepsMovingWhereBf16Freezes) {
  auto run_mean = [](std::optional<at::ScalarType> avg) {
    auto p = torch::full({1}, 256.0, torch::kBFloat16).requires_grad_();
    ASGD opt({p}, ASGDOptions(1.0).lambd(0).t0(0).average_dtype(avg));
    for (int s = 0; s < 64; ++s) {
      p.mutable_grad() = torch::full({1}, s % 2 == 0 ? -2.0 : 2.0, torch::kBFloat16);
      opt.step();  // p alternates 258, 256: mean 257
    }
    return state_of(opt, p).ax().to(torch::kDouble).item<double>();
  };
  EXPECT_NEAR(run_mean(at::kFloat), 257.0, 0.1);
  EXPECT_GT(std::abs(run_mean(std::nullopt) - 257.0), 0.5);  // bf16 ulp at 256 is 2
}

// Python's runs (torchext.optim.ASGD, fused and fused=False, bf16 and fp16):
// the C++ replay matches bit for bit, float32 ax included.
TEST(LowPrecision, ReplaysPythonBitForBit) {
  const auto ref = load_ref("lowp_ref.pt");
  const int64_t steps = R(ref, "steps").item<int64_t>();
  for (const std::string dtype : {"bfloat16", "float16"}) {
    for (const bool fused : {true, false}) {
      SCOPED_TRACE(dtype + (fused ? " fused" : " unfused"));
      auto params = params_from(ref, dtype + "/init");
      auto opt = lp_asgd(params, fused);
      run(*opt, params, ref, dtype, 0, steps);
      EXPECT_EQ(state_of(*opt, params[0]).ax().scalar_type(), at::kFloat);
      expect_state(*opt, params, ref, dtype + (fused ? "/fused/" : "/unfused/"));
    }
  }
}

TEST(LowPrecision, AveragedParametersRoundTripIsBitForBit) {
  const auto ref = load_ref("lowp_ref.pt");
  auto params = params_from(ref, "bfloat16/init");
  auto opt = lp_asgd(params);
  run(*opt, params, ref, "bfloat16", 0, 10);
  std::vector<torch::Tensor> axs;
  std::vector<void*> ptrs;
  for (const auto& p : params) {
    axs.push_back(state_of(*opt, p).ax());
    ptrs.push_back(p.data_ptr());
  }
  const auto params_before = clones(params), axs_before = clones(axs);
  {
    auto guard = opt->averaged_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE("param " + std::to_string(i));
      EXPECT_EQ(params[i].data_ptr(), ptrs[i]);
      EXPECT_EQ(params[i].scalar_type(), at::kBFloat16);
      // The average rounded once to bf16.
      expect_identical(params[i].detach(), axs_before[i].to(at::kBFloat16), "param inside");
    }
    // The wider ax (params 0 and 1) is not touched; the swapped one holds
    // the training value.
    expect_identical(axs[0], axs_before[0], "ax0 inside");
    expect_identical(axs[1], axs_before[1], "ax1 inside");
    expect_identical(axs[2], params_before[2], "ax2 inside (swapped)");
    EXPECT_THROW_MSG(opt->step(), "hold their averages");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    EXPECT_EQ(params[i].data_ptr(), ptrs[i]);
    expect_identical(params[i].detach(), params_before[i], "param after");
    expect_identical(state_of(*opt, params[i]).ax(), axs_before[i], "ax after");
  }
  // Training goes on as if the block never happened.
  run(*opt, params, ref, "bfloat16", 10, R(ref, "steps").item<int64_t>());
  expect_state(*opt, params, ref, "bfloat16/fused/");
}

TEST(LowPrecision, LibTorchArchiveKeepsFloat32AxAndTheOption) {
  const auto ref = load_ref("lowp_ref.pt");
  auto params = params_from(ref, "bfloat16/init");
  auto opt = lp_asgd(params);
  run(*opt, params, ref, "bfloat16", 0, 20);
  std::stringstream buf;
  torch::save(*opt, buf);
  auto copy = other_asgd(params);
  torch::load(*copy, buf);
  EXPECT_EQ(options_of(*copy, 0).average_dtype(), std::optional<at::ScalarType>(at::kFloat));
  EXPECT_EQ(options_of(*copy, 1).average_dtype(), std::nullopt);
  for (const auto& p : params) {
    expect_identical(state_of(*copy, p).ax(), state_of(*opt, p).ax(), "ax");
  }
  run(*copy, params, ref, "bfloat16", 20, R(ref, "steps").item<int64_t>());
  expect_state(*copy, params, ref, "bfloat16/fused/");
}

// Python's bf16 checkpoint (average_dtype "float32" and None in its groups;
// also with torch.float32, a pickled global, as Python's first version
// wrote it): C++ continues it bit for bit and saves it back
// (resume_in_python.py loads that).
TEST(LowPrecision, PythonCheckpointContinuesBitForBit) {
  const auto ref = load_ref("lowp_ref.pt");
  for (const std::string file : {"lowp_py_dtype_bfloat16.pt", "lowp_py_bfloat16.pt"}) {
    SCOPED_TRACE(file);
    auto params = params_from(ref, "bfloat16/half_param");
    auto opt = other_asgd(params);
    torchext::load_state_dict(*opt, ref_path(file));
    EXPECT_EQ(options_of(*opt, 0).average_dtype(), std::optional<at::ScalarType>(at::kFloat));
    EXPECT_EQ(options_of(*opt, 1).average_dtype(), std::nullopt);
    EXPECT_EQ(options_of(*opt, 0).lr(), 0.05);
    expect_state(*opt, params, ref, "bfloat16/half_");
    const int64_t steps = R(ref, "steps").item<int64_t>();
    run(*opt, params, ref, "bfloat16", steps / 2, steps);
    expect_state(*opt, params, ref, "bfloat16/fused/");
    torchext::save_state_dict(*opt, ref_path("lowp_cpp_bfloat16.pt"));
    save_tensors(params, ref_path("lowp_cpp_params_bfloat16.pt"));
    // And back into C++: float32 ax exactly, the option kept.
    auto again = other_asgd(params);
    torchext::load_state_dict(*again, ref_path("lowp_cpp_bfloat16.pt"));
    EXPECT_EQ(options_of(*again, 0).average_dtype(), std::optional<at::ScalarType>(at::kFloat));
    EXPECT_EQ(options_of(*again, 1).average_dtype(), std::nullopt);
    expect_state(*again, params, ref, "bfloat16/fused/");
  }
}

// torch.optim.ASGD's bf16 checkpoint: no average_dtype (the default applies)
// and a bf16 ax, which widens to float32; torchext's continuation of it in
// Python is matched bit for bit.
TEST(LowPrecision, TorchBf16CheckpointLoadsWidened) {
  const auto ref = load_ref("lowp_ref.pt");
  auto params = params_from(ref, "torch_half_param");
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.5)));
  groups.emplace_back(std::vector<torch::Tensor>{params[2]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.25).average_dtype(std::nullopt)));
  ASGD opt(groups);
  torchext::load_state_dict(opt, ref_path("lowp_torch_bfloat16.pt"));
  for (size_t g = 0; g < 2; ++g) {
    EXPECT_EQ(options_of(opt, g).average_dtype(), std::optional<at::ScalarType>(at::kFloat));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& want = R(ref, idx("torch_half_ax", i));
    ASSERT_EQ(want.scalar_type(), at::kBFloat16);
    expect_identical(state_of(opt, params[i]).ax(), want.to(at::kFloat), "ax widened");
  }
  const int64_t steps = R(ref, "steps").item<int64_t>();
  run(opt, params, ref, "bfloat16", steps / 2, steps);
  expect_state(opt, params, ref, "torch_cont_");
}

// average_dtype None in the file, float32 ax saved: ax narrows to bf16.
TEST(LowPrecision, OptedOutCheckpointNarrowsAx) {
  const auto ref = load_ref("lowp_ref.pt");
  auto params = params_from(ref, "bfloat16/half_param");
  auto opt = other_asgd(params);
  torchext::load_state_dict(*opt, ref_path("lowp_py_optout_bfloat16.pt"));
  for (size_t g = 0; g < 2; ++g) EXPECT_EQ(options_of(*opt, g).average_dtype(), std::nullopt);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& saved = R(ref, idx("bfloat16/half_ax", i));
    expect_identical(state_of(*opt, params[i]).ax(), saved.to(at::kBFloat16), "ax narrowed");
  }
}

// A C++ checkpoint saved with a float32 ax, loaded where the optimizer was
// built opted out: the file's options win (as Python's load_state_dict), and
// ax stays float32. And the reverse: a bf16 ax with the option on widens.
TEST(LowPrecision, PythonFormatRoundTripInCpp) {
  const auto ref = load_ref("lowp_ref.pt");
  const std::string path = ref_path("lowp_cpp_roundtrip.pt");
  for (const bool opt_out : {false, true}) {
    SCOPED_TRACE(opt_out ? "saved opted out" : "saved with float32 ax");
    auto params = params_from(ref, "bfloat16/init");
    auto opt = std::make_unique<ASGD>(
        params, ASGDOptions(0.05).t0(0).average_dtype(opt_out ? std::nullopt
                                                              : std::optional(at::kFloat)));
    run(*opt, params, ref, "bfloat16", 0, 5);
    torchext::save_state_dict(*opt, path);
    ASGD other(params, ASGDOptions(0.5).average_dtype(opt_out ? std::optional(at::kFloat)
                                                              : std::nullopt));
    torchext::load_state_dict(other, path);
    EXPECT_EQ(options_of(other, 0).average_dtype(), options_of(*opt, 0).average_dtype());
    for (const auto& p : params) {
      expect_identical(state_of(other, p).ax(), state_of(*opt, p).ax(), "ax");
    }
  }
  std::remove(path.c_str());
}

// Only torch.float32 or None: another dtype, or a string, is refused whole.
TEST(LowPrecision, BadAverageDtypeInAFileIsRefusedWhole) {
  const auto ref = load_ref("lowp_ref.pt");
  auto params = params_from(ref, "bfloat16/half_param");
  auto opt = lp_asgd(params);
  run(*opt, params, ref, "bfloat16", 0, 3);
  std::vector<torch::Tensor> axs;
  for (const auto& p : params) axs.push_back(state_of(*opt, p).ax().clone());
  const auto before = clones(params);
  for (const std::string bad : {"lowp_bad_dtype.pt", "lowp_bad_str.pt"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW_MSG(torchext::load_state_dict(*opt, ref_path(bad)),
                     "param_groups[1]['average_dtype']: average_dtype must be torch.float32");
    EXPECT_EQ(options_of(*opt, 0).lr(), 0.05);
    EXPECT_EQ(options_of(*opt, 1).average_dtype(), std::nullopt);
    for (size_t i = 0; i < params.size(); ++i) {
      expect_identical(params[i].detach(), before[i], "param");
      expect_identical(state_of(*opt, params[i]).ax(), axs[i], "ax");
    }
  }
}

// ASGDOptions in LibTorch's archive: an archive from before the option reads
// as the default (kFloat), None as nullopt, another dtype is refused.
TEST(LowPrecision, LibTorchOptionsArchiveOldNoneAndBad) {
  using Fill = std::function<void(torch::serialize::OutputArchive&)>;
  auto read_back = [](const Fill& fill) {
    torch::serialize::OutputArchive out;
    for (const char* key : {"lr", "lambd", "alpha", "t0", "weight_decay"}) {
      out.write(key, c10::IValue(0.1));
    }
    out.write("maximize", c10::IValue(false));
    out.write("capturable", c10::IValue(false));
    fill(out);
    std::stringstream buf;
    out.save_to(buf);
    torch::serialize::InputArchive in;
    in.load_from(buf);
    ASGDOptions o(0.3);
    o.average_dtype(at::kBFloat16);  // (not valid: must be overwritten)
    o.serialize(in);
    return o;
  };
  EXPECT_EQ(read_back([](auto&) {}).average_dtype(), std::optional<at::ScalarType>(at::kFloat));
  EXPECT_EQ(read_back([](auto& out) { out.write("average_dtype", c10::IValue()); }).average_dtype(),
            std::nullopt);
  EXPECT_THROW_MSG(read_back([](auto& out) {
                     out.write("average_dtype",
                               c10::IValue(static_cast<int64_t>(at::kDouble)));
                   }),
                   "'average_dtype' must be float32");
}

// Stochastic rounding of float16/bfloat16 parameters (issue 47) in the C++
// API: ASGDOptions::stochastic_rounding / rounding_seed, each op call's
// rounding ids (group << 32 | index in the group, whatever call a param lands
// in), the scaler's and the clips' steps, both checkpoint formats, and the
// bit-for-bit replay of Python's runs (make_reference.py
// stochastic_rounding_reference: sr_*.pt; resume_in_python.py finishes the
// run C++ saved).
#include "common.h"

#include <torchext/elementwise_math.h>
#include <torchext/torchext.h>

#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <sstream>

using torchext::optim::ASGD;
using torchext::optim::ASGDOptions;
using torchext::optim::ASGDParamState;
using torch::optim::OptimizerParamGroup;
using namespace torchext_test;

namespace {

using Ref = std::map<std::string, torch::Tensor>;

int64_t default_seed(const Ref& ref) { return R(ref, "default_seed").item<int64_t>(); }

// make_reference.py's SR_GROUPS: group 0 (params 0-2, split into two op calls
// by t0_per_param) with the default seed, group 1 (param 3) with its own.
std::unique_ptr<ASGD> sr_asgd(const std::vector<torch::Tensor>& params, const Ref& ref,
                              bool sr = true) {
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1], params[2]},
                      std::make_unique<ASGDOptions>(
                          ASGDOptions(0.05).lambd(1e-3).alpha(0.75).t0(3.0).weight_decay(1e-2)
                              .t0_per_param({3.0, 0.0, 3.0}).stochastic_rounding(sr)
                              .rounding_seed(default_seed(ref))));
  groups.emplace_back(std::vector<torch::Tensor>{params[3]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.02).lambd(1e-4).alpha(0.75)
                                                        .t0(0.0).stochastic_rounding(sr)
                                                        .rounding_seed(-7)));
  return std::make_unique<ASGD>(groups);
}

// The same groups with other options (rounding off, seed 0): a load must set them.
std::unique_ptr<ASGD> other_asgd(const std::vector<torch::Tensor>& params,
                                 ASGDOptions defaults = {}) {
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1], params[2]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.5)));
  groups.emplace_back(std::vector<torch::Tensor>{params[3]},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.25)));
  return std::make_unique<ASGD>(groups, defaults);
}

std::vector<torch::Tensor> params_from(const Ref& ref, const std::string& key, size_t n = 4) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < n; ++i) out.push_back(R(ref, idx(key, i)).clone().requires_grad_());
  return out;
}

// make_reference.py's sr_steps: param 1 has no grad at the "no_grad" steps.
void run(ASGD& opt, const std::vector<torch::Tensor>& params, const Ref& ref,
         const std::string& dtype, int64_t start, int64_t stop) {
  const auto no_grad = R(ref, "no_grad");
  for (int64_t s = start; s < stop; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      const bool none = i == 1 && (no_grad == s).any().item<bool>();
      params[i].mutable_grad() =
          none ? torch::Tensor() : R(ref, dtype + "/" + idx("grads", i))[s].clone();
    }
    opt.step();
  }
}

// Params and every state tensor identical (values and dtypes) to Python's `prefix`.
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

void expect_options(const ASGD& opt, bool sr, int64_t seed0, int64_t seed1) {
  EXPECT_EQ(options_of(opt, 0).stochastic_rounding(), sr);
  EXPECT_EQ(options_of(opt, 1).stochastic_rounding(), sr);
  EXPECT_EQ(options_of(opt, 0).rounding_seed(), seed0);
  EXPECT_EQ(options_of(opt, 1).rounding_seed(), seed1);
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && torch::equal(a, b);
}

// Everything the optimizer holds, to compare before/after a refused load.
std::vector<torch::Tensor> snapshot(const ASGD& opt, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p.detach().clone());
    const auto& st = state_of(opt, p);
    for (const auto& t : {st.step(), st.eta(), st.mu(), st.ax()}) out.push_back(t.clone());
  }
  for (size_t g = 0; g < opt.param_groups().size(); ++g) {
    const auto& o = options_of(opt, g);
    out.push_back(torch::tensor({o.lr(), o.t0(), o.fused().has_value() ? *o.fused() : -1.0,
                                 static_cast<double>(o.stochastic_rounding())},
                                torch::kDouble));
    out.push_back(torch::tensor(o.rounding_seed(), torch::kLong));
    out.push_back(torch::tensor(o.t0_per_param(), torch::kDouble));
  }
  return out;
}

void expect_unchanged(const std::vector<torch::Tensor>& before,
                      const std::vector<torch::Tensor>& after) {
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(same_bits(before[i], after[i])) << "entry " << i;
  }
}

void save_tensors(const std::vector<torch::Tensor>& ts, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> d;
  for (size_t i = 0; i < ts.size(); ++i) d.insert(idx("param", i), ts[i].detach().clone());
  const auto bytes = torch::jit::pickle_save(d);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A LibTorch archive rewritten: `edit` sees every value of every nested
// archive by key and returns its replacement, or nullopt to drop it.
using Edit = std::function<std::optional<c10::IValue>(const std::string&, const c10::IValue&)>;

void copy_archive(torch::serialize::InputArchive& in, torch::serialize::OutputArchive& out,
                  const Edit& edit) {
  for (const auto& key : in.keys()) {
    if (key == "training") continue;  // the archive module's own attribute
    torch::serialize::InputArchive sub;
    if (in.try_read(key, sub)) {
      torch::serialize::OutputArchive sub_out(out.compilation_unit());
      copy_archive(sub, sub_out, edit);
      out.write(key, sub_out);
      continue;
    }
    c10::IValue v;
    in.read(key, v);
    const auto e = edit(key, v);
    if (!e.has_value()) continue;
    if (e->isTensor()) {
      out.write(key, e->toTensor());
    } else {
      out.write(key, *e);
    }
  }
}

std::string edited_archive(const ASGD& opt, const Edit& edit) {
  std::stringstream saved;
  torch::save(opt, saved);
  torch::serialize::InputArchive in;
  in.load_from(saved);
  torch::serialize::OutputArchive out;
  copy_archive(in, out, edit);
  std::stringstream edited;
  out.save_to(edited);
  return edited.str();
}

}  // namespace

TEST(StochasticRounding, OptionsDefaultsCompareAndValidate) {
  EXPECT_FALSE(ASGDOptions().stochastic_rounding());
  EXPECT_EQ(ASGDOptions().rounding_seed(), 0);
  EXPECT_FALSE(ASGDOptions() == ASGDOptions().stochastic_rounding(true));
  EXPECT_FALSE(ASGDOptions().rounding_seed(1) == ASGDOptions().rounding_seed(2));
  EXPECT_TRUE(ASGDOptions().stochastic_rounding(true).rounding_seed(5) ==
              ASGDOptions().stochastic_rounding(true).rounding_seed(5));
  for (const int64_t seed : {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                             std::numeric_limits<int64_t>::max()}) {
    ASGDOptions().stochastic_rounding(true).rounding_seed(seed).validate();
  }
  ASGDOptions().stochastic_rounding(true).fused(true).validate();
  ASGDOptions().stochastic_rounding(false).fused(false).validate();
  // Python's check_rounding: the unfused path rounds to nearest, so the flag
  // is refused there, not ignored.
  const auto unfused = ASGDOptions().stochastic_rounding(true).fused(false);
  EXPECT_THROW_MSG(unfused.validate(), "stochastic_rounding=true needs the fused op");
  auto p = torch::zeros({3}, torch::kBFloat16).requires_grad_();
  EXPECT_THROW_MSG(ASGD({p}, unfused), "fused=false");
  ASGD opt({p});
  auto q = torch::zeros({2}, torch::kBFloat16).requires_grad_();
  EXPECT_THROW_MSG(opt.add_param_group(OptimizerParamGroup(
                       {q}, std::make_unique<ASGDOptions>(unfused))),
                   "needs the fused op");
  EXPECT_EQ(opt.param_groups().size(), 1u);
}

// Python's runs (bf16 and fp16, two groups with their own seeds, a group in
// two op calls, a param without a grad at some steps): the C++ replay is
// bit for bit the same, and not the run rounded to nearest.
TEST(StochasticRounding, ReplaysPythonBitForBit) {
  const auto ref = load_ref("sr_ref.pt");
  const int64_t steps = R(ref, "steps").item<int64_t>();
  for (const std::string dtype : {"bfloat16", "float16"}) {
    SCOPED_TRACE(dtype);
    auto params = params_from(ref, dtype + "/init");
    auto opt = sr_asgd(params, ref);
    run(*opt, params, ref, dtype, 0, steps);
    expect_state(*opt, params, ref, dtype + "/final_");
  }
  auto params = params_from(ref, "bfloat16/init");
  auto opt = sr_asgd(params, ref, /*sr=*/false);
  run(*opt, params, ref, "bfloat16", 0, steps);
  expect_state(*opt, params, ref, "bfloat16/nearest_");
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_FALSE(torch::equal(R(ref, idx("bfloat16/final_param", i)),
                              R(ref, idx("bfloat16/nearest_param", i))))
        << "param " << i << ": stochastic rounding changed nothing";
  }
}

// The same seed gives the same bits; another seed other bits, only in the
// group that has it.
TEST(StochasticRounding, DeterministicPerSeed) {
  const auto ref = load_ref("sr_ref.pt");
  auto train = [&](int64_t seed0) {
    auto params = params_from(ref, "bfloat16/init");
    auto opt = sr_asgd(params, ref);
    static_cast<ASGDOptions&>(opt->param_groups()[0].options()).rounding_seed(seed0);
    run(*opt, params, ref, "bfloat16", 0, 8);
    std::vector<torch::Tensor> out;
    for (const auto& p : params) out.push_back(p.detach().clone());
    return out;
  };
  const auto a = train(123), b = train(123), c = train(124);
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    EXPECT_TRUE(same_bits(a[i], b[i]));
    if (i < 3) {
      EXPECT_FALSE(torch::equal(a[i], c[i]));  // group 0: its seed changed
    } else {
      EXPECT_TRUE(same_bits(a[i], c[i]));  // group 1: its own seed, unchanged
    }
  }
}

// float32, float64 and complex params ignore the flag: bit for bit the run
// without it, also beside a bf16 param of the same group (which it moves).
TEST(StochasticRounding, Float32AndWiderIgnoreTheFlag) {
  torch::manual_seed(3);
  const std::vector<at::ScalarType> dtypes = {at::kBFloat16, at::kFloat, at::kDouble,
                                              at::kComplexFloat};
  std::vector<torch::Tensor> init, grads;
  for (const auto dt : dtypes) {
    init.push_back(torch::randn({6, 5}, torch::kDouble).to(dt));
    grads.push_back(torch::randn({10, 6, 5}, torch::kDouble).to(dt));
  }
  auto train = [&](bool sr) {
    std::vector<torch::Tensor> params;
    for (const auto& t : init) params.push_back(t.clone().requires_grad_());
    ASGD opt(params, ASGDOptions(0.05).t0(2).stochastic_rounding(sr).rounding_seed(77));
    for (int64_t s = 0; s < 10; ++s) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = grads[i][s].clone();
      opt.step();
    }
    std::vector<torch::Tensor> out;
    for (const auto& p : params) {
      out.push_back(p.detach().clone());
      out.push_back(state_of(opt, p).ax().clone());
    }
    return out;
  };
  const auto on = train(true), off = train(false);
  EXPECT_FALSE(torch::equal(on[0], off[0])) << "the bf16 param was rounded to nearest";
  for (size_t i = 1; i < dtypes.size(); ++i) {
    SCOPED_TRACE(c10::str(dtypes[i]));
    EXPECT_TRUE(same_bits(on[2 * i], off[2 * i]));
    EXPECT_TRUE(same_bits(on[2 * i + 1], off[2 * i + 1]));
  }
}

// GradScaler::step, GradScaler::clip_and_step (overflows skipped) and
// ASGD::clip_and_step pass the rounding on: Python's runs bit for bit.
TEST(StochasticRounding, ScalerAndClipStepsReplayPython) {
  const auto ref = load_ref("sr_ref.pt");
  const int64_t steps = R(ref, "amp_steps").item<int64_t>();
  const double max_norm = R(ref, "amp_max_norm").item<double>();
  const std::vector<int64_t> overflow = {2, 6};  // make_reference.py's SR_AMP_OVERFLOW
  for (const std::string variant : {"scaler_step", "scaler_clip_and_step", "clip_and_step"}) {
    SCOPED_TRACE(variant);
    auto params = params_from(ref, "bfloat16/init", 2);
    ASGD opt(params, ASGDOptions(0.05).t0(3).stochastic_rounding(true).rounding_seed(99));
    torchext::amp::GradScaler scaler(
        torchext::amp::GradScalerOptions().init_scale(16.0).growth_interval(3));
    const bool scaled = variant != "clip_and_step";
    for (int64_t s = 0; s < steps; ++s) {
      const double scale = scaled ? (scaler.scale(torch::ones({})), scaler.get_scale()) : 1.0;
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = R(ref, idx("bfloat16/grads", i))[s] * scale;
      }
      if (!scaled) {
        opt.clip_and_step(max_norm);
        continue;
      }
      if (std::find(overflow.begin(), overflow.end(), s) != overflow.end()) {
        params[0].mutable_grad().view(-1)[1].fill_(std::numeric_limits<double>::infinity());
      }
      if (variant == "scaler_step") {
        scaler.step(opt);
      } else {
        scaler.clip_and_step(opt, max_norm);
      }
      scaler.update();
    }
    expect_state(opt, params, ref, "amp/" + variant + "/");
  }
}

// A group whose step would take torch's unfused path is refused before
// anything is written or created.
TEST(StochasticRounding, UnfusedStepIsRefusedWhole) {
  auto p = torch::ones({3}, torch::kBFloat16).requires_grad_();
  ASGD opt({p}, ASGDOptions(0.1).stochastic_rounding(true));
  static_cast<ASGDOptions&>(opt.param_groups()[0].options()).fused(false);  // past the check
  p.mutable_grad() = torch::ones({3}, torch::kBFloat16);
  EXPECT_THROW_MSG(opt.step(), "torch's unfused path (fused=false)");
  EXPECT_TRUE(opt.state().empty());
  EXPECT_TRUE(torch::equal(p.detach(), torch::ones({3}, torch::kBFloat16)));
}

// Python -> C++ -> C++ and Python: Python's run saved halfway loads into an
// optimizer built with other settings (the file's win), continues bit for
// bit, is saved again (resume_in_python.py finishes that file in Python) and
// reloads in C++ to the same end.
TEST(StochasticRounding, PythonCheckpointContinuesBitForBit) {
  const auto ref = load_ref("sr_ref.pt");
  const int64_t half = R(ref, "half").item<int64_t>(), stop = R(ref, "cpp_stop").item<int64_t>(),
                steps = R(ref, "steps").item<int64_t>();
  for (const std::string dtype : {"bfloat16", "float16"}) {
    SCOPED_TRACE(dtype);
    auto params = params_from(ref, dtype + "/half_param");
    auto opt = other_asgd(params);
    torchext::load_state_dict(*opt, ref_path("sr_py_" + dtype + ".pt"));
    expect_options(*opt, true, default_seed(ref), -7);
    EXPECT_EQ(options_of(*opt, 0).t0_per_param(), (std::vector<double>{3.0, 0.0, 3.0}));
    expect_state(*opt, params, ref, dtype + "/half_");
    run(*opt, params, ref, dtype, half, stop);
    const std::string saved = ref_path("sr_cpp_" + dtype + ".pt");
    torchext::save_state_dict(*opt, saved);
    save_tensors(params, ref_path("sr_cpp_params_" + dtype + ".pt"));
    std::vector<torch::Tensor> resumed;
    for (const auto& p : params) resumed.push_back(p.detach().clone().requires_grad_());
    run(*opt, params, ref, dtype, stop, steps);
    expect_state(*opt, params, ref, dtype + "/final_");

    auto again = other_asgd(resumed);
    torchext::load_state_dict(*again, saved);
    expect_options(*again, true, default_seed(ref), -7);
    run(*again, resumed, ref, dtype, stop, steps);
    expect_state(*again, resumed, ref, dtype + "/final_");
  }
}

// torch::save / torch::load mid-run: the options come back and the resumed
// run has the uninterrupted run's bits.
TEST(StochasticRounding, LibTorchArchiveResumesTheSameBits) {
  const auto ref = load_ref("sr_ref.pt");
  const int64_t half = R(ref, "half").item<int64_t>(), steps = R(ref, "steps").item<int64_t>();
  auto params = params_from(ref, "bfloat16/init");
  auto opt = sr_asgd(params, ref);
  run(*opt, params, ref, "bfloat16", 0, half);
  std::stringstream buf;
  torch::save(*opt, buf);
  auto copy = other_asgd(params);
  torch::load(*copy, buf);
  expect_options(*copy, true, default_seed(ref), -7);
  run(*copy, params, ref, "bfloat16", half, steps);
  expect_state(*copy, params, ref, "bfloat16/final_");
}

// A file from before the keys (Python's format) or an archive without them
// (LibTorch's): each group gets the optimizer's defaults, as Python's
// __setstate__ keeps the constructor's settings.
TEST(StochasticRounding, CheckpointsWithoutTheKeysTakeTheDefaults) {
  const auto ref = load_ref("sr_ref.pt");
  const int64_t half = R(ref, "half").item<int64_t>();
  const auto on = ASGDOptions().stochastic_rounding(true).rounding_seed(default_seed(ref));
  {
    auto params = params_from(ref, "bfloat16/half_param");
    auto opt = other_asgd(params, on);
    torchext::load_state_dict(*opt, ref_path("sr_py_old_bfloat16.pt"));
    expect_options(*opt, true, default_seed(ref), default_seed(ref));
    EXPECT_EQ(options_of(*opt, 0).lr(), 0.05);  // the rest from the file
    auto plain = other_asgd(params);
    torchext::load_state_dict(*plain, ref_path("sr_py_old_bfloat16.pt"));
    expect_options(*plain, false, 0, 0);
  }
  auto params = params_from(ref, "bfloat16/init");
  auto src = sr_asgd(params, ref);
  run(*src, params, ref, "bfloat16", 0, half);
  const auto old = edited_archive(*src, [](const std::string& key, const c10::IValue& v) {
    return key == "stochastic_rounding" || key == "rounding_seed" ? std::nullopt
                                                                  : std::optional(v);
  });
  for (const bool defaults_on : {true, false}) {
    SCOPED_TRACE(defaults_on ? "defaults on" : "default defaults");
    auto opt = other_asgd(params, defaults_on ? on : ASGDOptions());
    std::istringstream in(old);
    torch::load(*opt, in);
    expect_options(*opt, defaults_on, defaults_on ? default_seed(ref) : 0,
                   defaults_on ? default_seed(ref) : 0);
    EXPECT_EQ(options_of(*opt, 0).lr(), 0.05);
  }
  // ASGDOptions alone: absent keys leave the values as they are.
  auto read_back = [](bool with_keys) {
    torch::serialize::OutputArchive out;
    for (const char* key : {"lr", "lambd", "alpha", "t0", "weight_decay"}) {
      out.write(key, c10::IValue(0.1));
    }
    out.write("maximize", c10::IValue(false));
    out.write("capturable", c10::IValue(false));
    if (with_keys) {
      out.write("stochastic_rounding", c10::IValue(false));
      out.write("rounding_seed", c10::IValue(int64_t{-3}));
    }
    std::stringstream bytes;
    out.save_to(bytes);
    torch::serialize::InputArchive in;
    in.load_from(bytes);
    auto o = ASGDOptions(0.3).stochastic_rounding(true).rounding_seed(9);
    o.serialize(in);
    return o;
  };
  EXPECT_TRUE(read_back(false).stochastic_rounding());
  EXPECT_EQ(read_back(false).rounding_seed(), 9);
  EXPECT_FALSE(read_back(true).stochastic_rounding());
  EXPECT_EQ(read_back(true).rounding_seed(), -3);
}

// Seeds across int64 from Python, whichever way its pickle wrote them
// (BININT, LONG1 of 5 to 8 bytes: Note [Python pickles rewritten for the
// TorchScript unpickler]), and back: C++ reads the value Python saved.
TEST(StochasticRounding, SeedsAcrossInt64LoadFromPython) {
  const auto ref = load_ref("sr_ref.pt");
  const auto seeds = R(ref, "seeds");
  auto params = params_from(ref, "bfloat16/half_param");
  for (int64_t k = 0; k < seeds.numel(); ++k) {
    const int64_t seed = seeds[k].item<int64_t>();
    SCOPED_TRACE(seed);
    auto opt = other_asgd(params);
    torchext::load_state_dict(*opt, ref_path(c10::str("sr_seed", k, "_bfloat16.pt")));
    expect_options(*opt, true, default_seed(ref), seed);
    const std::string path = ref_path("sr_seed_roundtrip.pt");
    torchext::save_state_dict(*opt, path);
    auto again = other_asgd(params);
    torchext::load_state_dict(*again, path);
    expect_options(*again, true, default_seed(ref), seed);
    std::remove(path.c_str());
  }
}

// Bad values, in either format, are refused naming the entry, and nothing
// changes: not a bool, not an int64, the flag where the unfused path runs.
TEST(StochasticRounding, BadValuesAreRefusedWhole) {
  const auto ref = load_ref("sr_ref.pt");
  auto params = params_from(ref, "bfloat16/half_param");
  auto opt = other_asgd(params);
  torchext::load_state_dict(*opt, ref_path("sr_py_bfloat16.pt"));
  const auto before = snapshot(*opt, params);
  const std::vector<std::pair<std::string, std::string>> files = {
      {"sr_none", "['stochastic_rounding'] must be a bool"},
      {"sr_string", "['stochastic_rounding'] must be a bool"},
      {"seed_bool", "['rounding_seed'] must be an int"},
      {"seed_none", "['rounding_seed'] must be an int"},
      {"seed_tensor", "['rounding_seed'] must be an int"},
      {"sr_fused_false", "stochastic_rounding=true needs the fused op"},
      {"sr_differentiable", "differentiable=True takes torch's unfused path"},
      {"seed_beyond_int64", "an int beyond int64 (9 bytes)"}};
  for (const auto& [name, msg] : files) {
    SCOPED_TRACE(name);
    EXPECT_THROW_MSG(torchext::load_state_dict(*opt, ref_path("sr_bad_" + name + ".pt")), msg);
    if (name != "seed_beyond_int64") {  // (refused while reading: no entry known yet)
      EXPECT_THROW_MSG(torchext::load_state_dict(*opt, ref_path("sr_bad_" + name + ".pt")),
                       "param_groups[1]");
    }
    expect_unchanged(before, snapshot(*opt, params));
  }
  // LibTorch archives: a value of another type, and the flag with fused=false.
  auto src = other_asgd(params);
  torchext::load_state_dict(*src, ref_path("sr_py_bfloat16.pt"));
  const std::vector<std::tuple<std::string, c10::IValue, std::string>> archives = {
      {"stochastic_rounding", c10::IValue(int64_t{1}), "'stochastic_rounding' must be a bool"},
      {"stochastic_rounding", c10::IValue(), "'stochastic_rounding' must be a bool"},
      {"rounding_seed", c10::IValue(1.5), "'rounding_seed' must be an int"},
      {"rounding_seed", c10::IValue(true), "'rounding_seed' must be an int"},
      {"rounding_seed", c10::IValue("7"), "'rounding_seed' must be an int"}};
  for (const auto& [key, value, msg] : archives) {
    SCOPED_TRACE(key + " = " + c10::str(value));
    std::istringstream in(edited_archive(*src, [&](const std::string& k, const c10::IValue& v) {
      return std::optional(k == key ? value : v);
    }));
    EXPECT_THROW_MSG(torch::load(*opt, in), msg);
    expect_unchanged(before, snapshot(*opt, params));
  }
  static_cast<ASGDOptions&>(src->param_groups()[1].options()).fused(false);  // past the check
  std::stringstream unfused;
  torch::save(*src, unfused);
  EXPECT_THROW_MSG(torch::load(*opt, unfused), "needs the fused op");
  expect_unchanged(before, snapshot(*opt, params));
}

// The CPU kernel rounds fp16 lanes with fp16_value_stochastic (a float32
// value, then the conversion to nearest); CUDA and the contract use
// fp16_bits_stochastic. The two agree: every 13-bit random value on the
// edges (fp16's subnormal/normal boundary, its largest value, the float32
// subnormals, inf, NaN, zero), and a sweep of float32 bit patterns with a
// spread of random values.
TEST(StochasticRounding, Fp16ValueIsTheBitsAsAFloat) {
  namespace math = torchext::math;
  auto agree = [](uint32_t bits, uint16_t r) {
    const float x = math::float_from_bits(bits);
    const c10::Half h(math::fp16_value_stochastic(x, r));
    const uint16_t want = math::fp16_bits_stochastic(x, r);
    if (h.x != want) {
      ADD_FAILURE() << "x bits 0x" << std::hex << bits << " r 0x" << r << ": value gives 0x"
                    << h.x << ", bits give 0x" << want;
      return false;
    }
    return true;
  };
  std::vector<uint32_t> edges;
  for (uint32_t mid : {0x38800000u, 0x477fe000u, 0x47800000u, 0x33800000u, 0x00000000u,
                       0x00800000u, 0x7f7fffffu, 0x7f800000u, 0x7fc00000u}) {
    for (uint32_t d = 0; d < 40; ++d) {
      edges.push_back(mid + d * 0x101u);
      edges.push_back(mid - d * 0x101u);
    }
  }
  edges.push_back(0x7f800001u);  // a signalling NaN
  edges.push_back(0x7fffffffu);
  for (uint32_t b : edges) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (uint32_t r = 0; r < 65536; r += 8) {
        if (!agree(b | sign, static_cast<uint16_t>(r | (r >> 13)))) return;
      }
    }
  }
  uint32_t r = 12345;
  for (uint64_t b = 0; b <= 0xffffffffull; b += 997) {
    r = r * 1664525u + 1013904223u;
    if (!agree(static_cast<uint32_t>(b), static_cast<uint16_t>(r >> 16))) return;
  }
}

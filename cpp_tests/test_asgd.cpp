// torchext::optim::ASGD: parity with torch.optim.ASGD (reference data from
// make_reference.py), param groups, closures, serialization, bad input, CUDA.
#include "common.h"
#include "../csrc/api/device_groups.h"

#include <torchext/torchext.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/lazy/ts_backend/ts_backend_impl.h>

#include <limits>

using torchext::optim::ASGD;
using torchext::optim::ASGDOptions;
using torchext::optim::ASGDParamState;
using torch::optim::OptimizerParamGroup;
using namespace torchext_test;

namespace {

ASGDOptions options_from(const torch::Tensor& row) {
  const auto v = row.accessor<double, 1>();
  return ASGDOptions(v[0]).lambd(v[1]).alpha(v[2]).t0(v[3]).weight_decay(v[4]).maximize(v[5] != 0);
}

std::vector<torch::Tensor> clones(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

// A small problem with several groups, used by the serialization tests.
struct Problem {
  std::vector<torch::Tensor> params;
  std::vector<OptimizerParamGroup> groups() const {
    std::vector<OptimizerParamGroup> g;
    g.emplace_back(std::vector<torch::Tensor>{params[0], params[1]},
                   std::make_unique<ASGDOptions>(ASGDOptions(0.03).t0(3).weight_decay(1e-2)));
    g.emplace_back(std::vector<torch::Tensor>{params[2]},
                   std::make_unique<ASGDOptions>(ASGDOptions(0.01).lambd(1e-2).t0(0).maximize(true)));
    return g;
  }
  explicit Problem(int64_t seed) {
    torch::manual_seed(seed);
    for (auto shape : {std::vector<int64_t>{4, 3}, {3}, {2, 2}}) {
      params.push_back(torch::randn(shape).requires_grad_());
    }
  }
  void set_grads(int64_t step) {
    torch::manual_seed(1000 + step);
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
  }
};

}  // namespace

// Runs make_reference.py's torch.optim.ASGD cases (100 steps each) in C++;
// fused: the ASGDOptions::fused of every group; exact: bit for bit, else
// ~1e-6 (the fused kernel is another kernel than torch's for-loop).
void expect_torch_optim_asgd_cases(std::optional<bool> fused, bool exact,
                                   bool capturable = false) {
  const auto ref = load_ref("asgd_ref.pt");
  const int64_t cases = R(ref, "num_cases").item<int64_t>();
  const int64_t steps = R(ref, "steps").item<int64_t>();
  ASSERT_GE(cases, 5);
  for (int64_t c = 0; c < cases; ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    const std::string pre = "case" + std::to_string(c) + "/";
    std::vector<torch::Tensor> params;
    for (int i = 0; i < 3; ++i) {
      params.push_back(R(ref, pre + "init" + std::to_string(i)).clone().requires_grad_());
    }
    std::vector<OptimizerParamGroup> groups;
    const int64_t ngroups = R(ref, pre + "num_groups").item<int64_t>();
    for (int64_t g = 0; g < ngroups; ++g) {
      const std::string gp = pre + "group" + std::to_string(g) + "/";
      std::vector<torch::Tensor> ps;
      const auto idx = R(ref, gp + "params");
      for (int64_t k = 0; k < idx.numel(); ++k) ps.push_back(params[idx[k].item<int64_t>()]);
      auto o = options_from(R(ref, gp + "options")).fused(fused).capturable(capturable);
      groups.emplace_back(ps, std::make_unique<ASGDOptions>(o));
    }
    ASGD opt(groups);
    ASSERT_EQ(opt.param_groups().size(), static_cast<size_t>(ngroups));
    for (int64_t s = 0; s < steps; ++s) {
      for (int i = 0; i < 3; ++i) {
        params[i].mutable_grad() = R(ref, pre + "grads" + std::to_string(i))[s].clone();
      }
      opt.step();
    }
    for (int i = 0; i < 3; ++i) {
      const std::string k = std::to_string(i);
      const auto& st = state_of(opt, params[i]);
      const std::vector<std::pair<const char*, torch::Tensor>> got = {
          {"param", params[i].detach()}, {"ax", st.ax()}, {"eta", st.eta()}, {"mu", st.mu()}};
      for (const auto& [key, t] : got) {
        const auto& want = R(ref, pre + key + k);
        if (exact) {
          EXPECT_TRUE(torch::equal(t, want)) << key << " " << i << ": " << (t - want).abs().max();
        } else {
          EXPECT_TRUE(close(t, want)) << key << " " << i;
        }
      }
      EXPECT_EQ(st.step().item<double>(), R(ref, pre + "step" + k).item<double>());
      EXPECT_EQ(st.step().scalar_type(), torch::kFloat);
      EXPECT_EQ(st.step().dim(), 0);
    }
  }
}

TEST(ASGD, MatchesPythonTorchOptimASGD) {
  expect_torch_optim_asgd_cases(std::nullopt, /*exact=*/false);
}

// fused=false follows torch.optim.ASGD's for-loop path op for op (ax copied
// while mu == 1, step/eta/mu read on the host): the same bits.
TEST(ASGD, UnfusedPathIsTorchOptimASGDBitForBit) {
  expect_torch_optim_asgd_cases(false, /*exact=*/true);
}

// capturable=true: the sync-free tensor form of the same update.
TEST(ASGD, UnfusedCapturablePathMatchesTorchOptimASGD) {
  expect_torch_optim_asgd_cases(false, /*exact=*/false, /*capturable=*/true);
}

// The unfused step (fused=false) and the state creation against Python's
// (torchext.optim.ASGD(fused=False): functional.reference_asgd and
// ASGD._create_state), bit for bit, over make_reference.py's UNFUSED_CASES:
// capturable or not, float or tensor lr (changed in place after each step),
// grad_scale/found_inf (an overflow at step 0: the state is created and the
// step skipped), maximize, weight decay, complex, float64.
TEST(UnfusedStep, StepAndStateCreationMatchPythonBitForBit) {
  const auto ref = load_ref("unfused_ref.pt");
  std::vector<std::string> names;
  {
    std::ifstream in(ref_path("unfused_cases.txt"));
    for (std::string line; std::getline(in, line);) names.push_back(line);
  }
  const int64_t cases = R(ref, "num_cases").item<int64_t>();
  const int64_t steps = R(ref, "steps").item<int64_t>();
  const auto overflow_at = R(ref, "overflow_at");
  ASSERT_GE(cases, 10);
  ASSERT_EQ(static_cast<int64_t>(names.size()), cases);
  for (int64_t c = 0; c < cases; ++c) {
    SCOPED_TRACE(names[c]);
    const std::string pre = "case" + std::to_string(c) + "/";
    const bool tensor_lr = R(ref, pre + "tensor_lr").item<bool>();
    const bool amp = R(ref, pre + "amp").item<bool>();
    torch::Tensor lr = tensor_lr ? R(ref, pre + "lr_tensor").clone() : torch::Tensor();
    ASGDOptions o = tensor_lr ? ASGDOptions(lr) : ASGDOptions(R(ref, pre + "lr").item<double>());
    const auto v = R(ref, pre + "options").accessor<double, 1>();
    o.lambd(v[0]).alpha(v[1]).t0(v[2]).weight_decay(v[3]).maximize(v[4] != 0).capturable(v[5] != 0)
        .fused(false);
    std::vector<torch::Tensor> params;
    for (int i = 0; i < 2; ++i) {
      params.push_back(R(ref, pre + "init" + std::to_string(i)).clone().requires_grad_());
    }
    ASGD opt(params, o);
    const auto grad_scale = torch::tensor(8.0f);
    auto expect_state = [&](const std::string& prefix) {
      for (int i = 0; i < 2; ++i) {
        const std::string k = std::to_string(i);
        const auto& st = state_of(opt, params[i]);
        const std::vector<std::pair<const char*, torch::Tensor>> got = {
            {"param", params[i].detach()}, {"step", st.step()}, {"eta", st.eta()},
            {"mu", st.mu()}, {"ax", st.ax()}};
        for (const auto& [key, t] : got) {
          const auto& want = R(ref, pre + prefix + key + k);
          EXPECT_TRUE(t.scalar_type() == want.scalar_type() && torch::equal(t, want))
              << prefix << key << i << ": " << t << " vs " << want;
        }
      }
    };
    for (int64_t s = 0; s < steps; ++s) {
      for (int i = 0; i < 2; ++i) {
        const auto g = R(ref, pre + "grads" + std::to_string(i))[s];
        params[i].mutable_grad() = (amp ? g * 8.0 : g).clone();
      }
      if (amp) {
        const bool overflow = (overflow_at == s).any().item<bool>();
        opt.step_with_amp(grad_scale, torch::tensor(overflow ? 1.0f : 0.0f), {});
      } else {
        opt.step();
      }
      if (tensor_lr) lr.mul_(0.9);
      if (s == 0) expect_state("after0_");
    }
    expect_state("final_");
  }
}

TEST(ASGD, StateIsCreatedLazilyLikePython) {
  auto p = torch::randn({3}).requires_grad_();
  auto q = torch::randn({2}).requires_grad_();
  ASGD opt({p, q}, ASGDOptions(0.25));
  EXPECT_TRUE(opt.state().empty());
  p.mutable_grad() = torch::zeros({3});
  opt.step();  // q has no grad: no state, untouched
  EXPECT_EQ(opt.state().size(), 1u);
  EXPECT_EQ(opt.state().count(q.unsafeGetTensorImpl()), 0u);
  const auto& st = state_of(opt, p);
  EXPECT_EQ(st.step().item<float>(), 1.0f);
  EXPECT_EQ(st.step().device(), p.device());
  EXPECT_EQ(st.ax().sizes(), p.sizes());
}

// The fused default follows one device rule in both languages: the ops have
// kernels for cpu, cuda and meta (Python: torchext/_devices.py KERNEL_DEVICES,
// tested by test_asgd_optimizer.py's test_fused_none_picks_fused_op_on_meta).
// A meta param steps through the op's Meta kernel; the unfused reference
// would read eta on the host, which meta cannot.
TEST(ASGD, FusedDefaultMetaParamsTakeTheFusedOpAsInPython) {
  auto cpu = torch::randn({3}).requires_grad_();
  auto meta = torch::empty({3}, torch::kMeta).requires_grad_();
  cpu.mutable_grad() = torch::ones({3});
  meta.mutable_grad() = torch::empty({3}, torch::kMeta);
  ASGD opt({cpu, meta}, ASGDOptions(0.25));
  EXPECT_NO_THROW(opt.step());
  EXPECT_TRUE(state_of(opt, meta).ax().is_meta());
  EXPECT_EQ(state_of(opt, cpu).step().item<float>(), 1.0f);
  EXPECT_NO_THROW(ASGD({meta}, ASGDOptions(0.25).fused(true)).step());
  ASGD unfused({meta}, ASGDOptions(0.25).fused(false));
  EXPECT_ANY_THROW(unfused.step());
}

// The fused default is decided over every param of the group, with a grad
// or not, as in Python (test_asgd_optimizer.py's
// test_fused_none_is_decided_over_every_param_of_the_group, the same case):
// a param without a grad on the lazy device (no torchext kernels) makes the
// group unfused, so the meta param beside it takes the reference step,
// which reads eta on the host and cannot on meta.
TEST(ASGD, FusedDefaultCountsParamsWithoutGrads) {
  torch::lazy::InitTorchScriptBackend();
  auto meta = torch::empty({3}, torch::kMeta).requires_grad_();
  auto lazy = torch::zeros({3}, torch::Device(torch::kLazy)).requires_grad_();
  meta.mutable_grad() = torch::empty({3}, torch::kMeta);
  ASGD with_lazy({meta, lazy}, ASGDOptions(0.25));
  EXPECT_THROW_MSG(with_lazy.step(), "_local_scalar_dense");  // item() on meta
  EXPECT_NO_THROW(ASGD({meta}, ASGDOptions(0.25)).step());  // alone: the fused op
}

// ASGD's split of a group into op calls, one per device and t0, gives the
// same groups in the same order as Python's slot groups (split_ref.pt:
// devices in order of first appearance, then t0s in order of first
// appearance within a device).
TEST(ASGD, SplitIntoOpCallsMatchesPython) {
  const auto ref = load_ref("split_ref.pt");
  const c10::Device devices[] = {c10::Device(c10::kCPU), c10::Device(c10::kMeta)};
  const int64_t cases = R(ref, "num_cases").item<int64_t>();
  ASSERT_GE(cases, 4);
  for (int64_t c = 0; c < cases; ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    const std::string pre = "case" + std::to_string(c) + "/";
    std::vector<torch::Tensor> params;
    const auto on = R(ref, pre + "devices");
    for (const auto i : c10::irange(on.numel())) {
      params.push_back(torch::zeros({1}, torch::TensorOptions().device(devices[on[i].item<int64_t>()])));
    }
    const auto t0s_t = R(ref, pre + "t0s");
    const std::vector<double> t0s(t0s_t.data_ptr<double>(), t0s_t.data_ptr<double>() + t0s_t.numel());
    const auto groups = torchext::api::index_by_device_and_t0(params, t0s);
    ASSERT_EQ(static_cast<int64_t>(groups.size()), R(ref, pre + "num_groups").item<int64_t>());
    for (const auto k : c10::irange(groups.size())) {
      const std::string g = pre + "group" + std::to_string(k) + "/";
      EXPECT_EQ(groups[k].device, devices[R(ref, g + "device").item<int64_t>()]) << k;
      EXPECT_EQ(groups[k].t0, R(ref, g + "t0").item<double>()) << k;
      const auto idx = R(ref, g + "idx");
      EXPECT_EQ(std::vector<int64_t>(groups[k].idx.begin(), groups[k].idx.end()),
                std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel()))
          << k;
    }
  }
}

TEST(ASGD, ParamGroupsKeepTheirOptions) {
  auto a = torch::randn({2}).requires_grad_();
  auto b = torch::randn({2}).requires_grad_();
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{a});  // takes the defaults
  groups.emplace_back(std::vector<torch::Tensor>{b},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.5).lambd(0.1).t0(7).maximize(true)));
  ASGD opt(groups, ASGDOptions(0.02).alpha(0.6));
  const auto& g0 = static_cast<const ASGDOptions&>(opt.param_groups()[0].options());
  const auto& g1 = static_cast<const ASGDOptions&>(opt.param_groups()[1].options());
  EXPECT_EQ(g0.lr(), 0.02);
  EXPECT_EQ(g0.alpha(), 0.6);
  EXPECT_EQ(g1.lr(), 0.5);
  EXPECT_EQ(g1.lambd(), 0.1);
  EXPECT_EQ(g1.t0(), 7);
  EXPECT_TRUE(g1.maximize());
  // add_param_group after construction, and the LR-scheduler interface.
  auto c = torch::randn({1}).requires_grad_();
  opt.add_param_group(OptimizerParamGroup({c}, std::make_unique<ASGDOptions>(ASGDOptions(0.3))));
  EXPECT_EQ(opt.param_groups()[2].options().get_lr(), 0.3);
  opt.param_groups()[2].options().set_lr(0.4);
  EXPECT_EQ(static_cast<const ASGDOptions&>(opt.param_groups()[2].options()).lr(), 0.4);
}

TEST(ASGD, StepRunsTheClosure) {
  auto w = torch::ones({3}).requires_grad_();
  ASGD opt({w}, ASGDOptions(0.1).lambd(0));
  int calls = 0;
  auto loss = opt.step([&] {
    ++calls;
    opt.zero_grad();
    auto l = (w * w).sum();
    l.backward();
    return l;
  });
  EXPECT_EQ(calls, 1);
  EXPECT_FLOAT_EQ(loss.item<float>(), 3.0f);
  EXPECT_TRUE(close(w, torch::full({3}, 0.8f)));  // 1 - 0.1 * 2
}

TEST(ASGD, FusedAndTensorOpPathsAgree) {
  Problem a(1), b(1);
  ASGD fused(a.groups()), plain(b.groups());
  for (auto& g : plain.param_groups()) static_cast<ASGDOptions&>(g.options()).fused(false);
  for (int s = 0; s < 20; ++s) {
    a.set_grads(s);
    b.set_grads(s);
    fused.step();
    plain.step();
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_TRUE(close(a.params[i], b.params[i], 1e-5, 1e-6));
    EXPECT_TRUE(close(state_of(fused, a.params[i]).ax(), state_of(plain, b.params[i]).ax(), 1e-5,
                      1e-6));
  }
}

TEST(ASGD, StepWithAmpUnscalesAndSkipsOnDevice) {
  auto p = torch::ones({4}).requires_grad_();
  auto q = torch::ones({4}).requires_grad_();
  ASGD a({p}, ASGDOptions(0.1).lambd(0)), b({q}, ASGDOptions(0.1).lambd(0));
  p.mutable_grad() = torch::full({4}, 8.0f);
  q.mutable_grad() = torch::full({4}, 1.0f);
  a.step_with_amp(torch::full({}, 8.0f), torch::zeros({}), {});
  b.step();
  EXPECT_TRUE(close(p, q));
  const auto before = p.detach().clone();
  a.step_with_amp(torch::full({}, 8.0f), torch::ones({}), {});  // overflow: nothing changes
  EXPECT_TRUE(torch::equal(p, before));
  EXPECT_EQ(state_of(a, p).step().item<float>(), 1.0f);
}

// ASGD::clip_grad_norm_ against LibTorch's torch::nn::utils::clip_grad_norm_
// then step(): applied when called (Note [Clip: applied when called, folded
// only inside one call]), so the grads are LibTorch's clipped grads (within
// fp32 rounding: LibTorch sums the norms in another order), and so are the
// parameters after each step; steps without a clip use no coefficient.
TEST(ASGD, ClipGradNormClipsWhenCalled) {
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "fused=false");
    Problem a(1), b(1);
    ASGD ours(a.groups()), reference(b.groups());
    for (auto* opt : {&ours, &reference}) {
      for (auto& g : opt->param_groups()) static_cast<ASGDOptions&>(g.options()).fused(fused);
    }
    for (int s = 0; s < 6; ++s) {
      a.set_grads(s);
      b.set_grads(s);
      if (s < 4) {  // clipping active (the max norm is below every total norm)
        const auto norm = ours.clip_grad_norm_(0.5);
        const double want = torch::nn::utils::clip_grad_norm_(b.params, 0.5);
        ASSERT_GT(want, 0.5);
        EXPECT_NEAR(norm.item<double>(), want, 1e-6 * want);
        for (size_t i = 0; i < a.params.size(); ++i) {
          EXPECT_TRUE(close(a.params[i].grad(), b.params[i].grad(), 1e-6)) << i;
        }
      }
      ours.step();  // steps 4 and 5: no clip
      reference.step();
    }
    for (size_t i = 0; i < a.params.size(); ++i) {
      EXPECT_TRUE(close(a.params[i], b.params[i], 1e-6));
    }
  }
}

// ASGD::clip_and_step: the closure first (it computes the grads), then the
// measure, then one step with the coefficient folded in, the grads left
// unclipped; against LibTorch's recipe (closure, clip_grad_norm_, step) on
// the same ASGD. Returns the total norm and the closure's loss.
TEST(ASGD, ClipAndStepMatchesLibTorchsRecipe) {
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "fused=false");
    Problem a(2), b(2);
    ASGD ours(a.groups()), reference(b.groups());
    for (auto* opt : {&ours, &reference}) {
      for (auto& g : opt->param_groups()) static_cast<ASGDOptions&>(g.options()).fused(fused);
    }
    for (int s = 0; s < 6; ++s) {
      const double bound = s == 4 ? std::numeric_limits<double>::infinity() : 0.5;
      int calls = 0;
      std::vector<torch::Tensor> grads;
      const auto result = ours.clip_and_step(bound, 2.0, false, [&] {
        ++calls;
        a.set_grads(s);
        for (const auto& p : a.params) grads.push_back(p.grad().clone());
        return torch::full({}, static_cast<double>(s));
      });
      EXPECT_EQ(calls, 1);
      ASSERT_TRUE(result.result.defined());
      EXPECT_EQ(result.result.item<double>(), s);  // the closure's loss
      for (size_t i = 0; i < grads.size(); ++i) {
        EXPECT_TRUE(torch::equal(a.params[i].grad(), grads[i]));  // left as they were
      }
      b.set_grads(s);
      const double want = torch::nn::utils::clip_grad_norm_(b.params, bound);
      if (s != 4) ASSERT_GT(want, 0.5);
      EXPECT_NEAR(result.total_norm.item<double>(), want, 1e-6 * want);
      reference.step();
      for (size_t i = 0; i < a.params.size(); ++i) {
        EXPECT_TRUE(close(a.params[i], b.params[i], 1e-6)) << "step " << s << ", param " << i;
      }
    }
    // No closure: the loss is undefined; error_if_nonfinite refuses before
    // the step, changing nothing.
    a.set_grads(7);
    EXPECT_FALSE(ours.clip_and_step(0.5).result.defined());
    a.params[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
    const auto before = clones(a.params);
    EXPECT_THROW_MSG(ours.clip_and_step(0.5, 2.0, true), "non-finite");
    for (size_t i = 0; i < a.params.size(); ++i) {
      EXPECT_TRUE(torch::equal(a.params[i], before[i]));
    }
  }
}

TEST(ASGD, SaveLoadRoundTrip) {
  Problem a(2), b(2);
  ASGD opt_a(a.groups());
  for (int s = 0; s < 10; ++s) {
    a.set_grads(s);
    opt_a.step();
  }
  std::stringstream stream;
  torch::save(opt_a, stream);
  // b: same params as a (copied), fresh optimizer with other options.
  for (size_t i = 0; i < a.params.size(); ++i) {
    torch::NoGradGuard ng;
    b.params[i].copy_(a.params[i]);
  }
  ASGD opt_b(b.groups(), ASGDOptions(0.9));
  static_cast<ASGDOptions&>(opt_b.param_groups()[0].options()).lr(0.9);
  torch::load(opt_b, stream);
  EXPECT_EQ(static_cast<const ASGDOptions&>(opt_b.param_groups()[0].options()).lr(), 0.03);
  for (int s = 10; s < 20; ++s) {
    a.set_grads(s);
    b.set_grads(s);
    opt_a.step();
    opt_b.step();
  }
  for (size_t i = 0; i < a.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(a.params[i], b.params[i]));
    EXPECT_TRUE(torch::equal(state_of(opt_a, a.params[i]).ax(), state_of(opt_b, b.params[i]).ax()));
    EXPECT_EQ(state_of(opt_b, b.params[i]).eta().scalar_type(), torch::kFloat);
  }
}

// ---- bad input: c10::Error with a clear message, nothing changes ---------

TEST(ASGDBadInput, OptionsAreValidated) {
  auto p = torch::randn({2}).requires_grad_();
  EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(-1.0)), "invalid learning rate");
  EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(0.1).lambd(-1)), "invalid lambd");
  EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(0.1).alpha(-1)), "invalid alpha");
  EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(0.1).weight_decay(-1)), "invalid weight_decay");
  ASGD opt({p});
  EXPECT_THROW_MSG(opt.add_param_group(OptimizerParamGroup({p})), "more than one parameter group");
  auto q = torch::randn({2}).requires_grad_();
  EXPECT_THROW_MSG(opt.add_param_group(OptimizerParamGroup(
                       {q}, std::make_unique<torch::optim::SGDOptions>(0.1))),
                   "must be torchext::optim::ASGDOptions");
  EXPECT_THROW_MSG(opt.add_param_group(OptimizerParamGroup({q * 2})), "non-leaf");
  EXPECT_EQ(opt.param_groups().size(), 1u);
}

// Issue 25: a non-finite lr, lambd, alpha or weight_decay makes the step's
// params and state NaN: refused by the constructor (defaults and per-group
// options) and add_param_group, naming it; t0 = inf (never average) stays.
TEST(ASGDBadInput, NonFiniteOptionsAreRefused) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto p = torch::randn({2}).requires_grad_();
  auto q = torch::randn({3}).requires_grad_();
  using Set = ASGDOptions (*)(double);
  const std::vector<std::pair<std::string, Set>> keys = {
      {"invalid learning rate", [](double v) { return ASGDOptions(v); }},
      {"invalid lambd", [](double v) { return ASGDOptions(0.1).lambd(v); }},
      {"invalid alpha", [](double v) { return ASGDOptions(0.1).alpha(v); }},
      {"invalid weight_decay", [](double v) { return ASGDOptions(0.1).weight_decay(v); }},
  };
  for (const auto& [msg, set] : keys) {
    for (const double v : {inf, -inf, nan}) {
      SCOPED_TRACE(msg + " " + std::to_string(v));
      EXPECT_THROW_MSG(ASGD({p}, set(v)), msg);
      EXPECT_THROW_MSG(ASGD({p}, set(v)), "finite");
      std::vector<OptimizerParamGroup> groups;
      groups.emplace_back(std::vector<torch::Tensor>{p},
                          std::make_unique<ASGDOptions>(set(v)));
      EXPECT_THROW_MSG(ASGD(groups, ASGDOptions(0.1)), msg);
      ASGD opt({p}, ASGDOptions(0.1));
      EXPECT_THROW_MSG(opt.add_param_group(OptimizerParamGroup(
                           {q}, std::make_unique<ASGDOptions>(set(v)))),
                       msg);
      EXPECT_EQ(opt.param_groups().size(), 1u);  // nothing added
    }
  }
  // A CPU tensor lr is read when it is given (no sync: it is on the host).
  for (const double v : {inf, nan}) {
    for (const auto dt : {torch::kFloat, torch::kDouble}) {
      EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(torch::full({}, v, dt))), "invalid learning rate");
    }
  }
  // t0: any number but NaN.
  EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(0.1).t0(nan)), "invalid t0");
  EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(0.1).t0_per_param({nan})), "t0_per_param[0]");
  auto r = torch::randn({3}).requires_grad_();
  ASGD never({r}, ASGDOptions(0.1).t0(inf));
  for (int i = 0; i < 3; ++i) {
    r.mutable_grad() = torch::ones({3});
    never.step();
  }
  EXPECT_TRUE(torch::isfinite(r).all().item<bool>());
  EXPECT_EQ(state_of(never, r).mu().item<double>(), 1.0);  // never averages
  EXPECT_TRUE(torch::equal(state_of(never, r).ax(), r.detach()));
}

// An option made non-finite after construction is refused by the op at the
// step (its validator, before anything is written): nothing changes.
TEST(ASGDBadInput, NonFiniteOptionSetLaterIsRefusedByTheStep) {
  const double inf = std::numeric_limits<double>::infinity();
  auto p = torch::randn({3}).requires_grad_();
  ASGD opt({p}, ASGDOptions(0.1));
  p.mutable_grad() = torch::ones({3});
  opt.step();
  const auto before = p.detach().clone();
  const auto ax = state_of(opt, p).ax().clone();
  auto& o = static_cast<ASGDOptions&>(opt.param_groups()[0].options());
  o.lambd(inf);
  EXPECT_THROW_MSG(opt.step(), "invalid lambd");
  o.lambd(1e-4).lr(torch::full({}, inf, torch::kDouble));  // a CPU tensor lr is read per call
  EXPECT_THROW_MSG(opt.step(), "invalid learning rate");
  EXPECT_TRUE(torch::equal(p.detach(), before));
  EXPECT_TRUE(torch::equal(state_of(opt, p).ax(), ax));
  EXPECT_EQ(state_of(opt, p).step().item<double>(), 1.0);
}

// Everything the optimizer holds: params, and per param its state (or "no
// state"), in order.
std::vector<torch::Tensor> full_state(const ASGD& opt) {
  std::vector<torch::Tensor> out;
  for (const auto& g : opt.param_groups()) {
    for (const auto& p : g.params()) {
      out.push_back(p.detach().clone());
      auto it = opt.state().find(p.unsafeGetTensorImpl());
      if (it == opt.state().end()) {
        out.push_back(torch::full({}, -1.0));
        continue;
      }
      const auto& st = static_cast<const ASGDParamState&>(*it->second);
      for (const auto& t : {st.step(), st.eta(), st.mu(), st.ax()}) out.push_back(t.clone());
    }
  }
  return out;
}

// All or nothing: bad input in a LATER group (after a group that would step
// fine, and with a param that has no state yet) changes nothing at all.
TEST(ASGDBadInput, BadGradientInALaterGroupChangesNothing) {
  auto p = torch::randn({3}).requires_grad_();
  auto q = torch::randn({2}).requires_grad_();
  auto r = torch::randn({2}).requires_grad_();
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p});
  groups.emplace_back(std::vector<torch::Tensor>{q, r},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.1).t0(0)));
  ASGD opt(groups);
  p.mutable_grad() = torch::ones({3});
  q.mutable_grad() = torch::ones({2});
  opt.step();  // p and q have state now, r has none
  const std::vector<std::pair<torch::Tensor, const char*>> bad = {
      {torch::ones({5}), "has shape"},
      {torch::ones({2}, torch::kDouble), "dtype"},
      {torch::ones({2}, torch::kInt), "dtype"},
      {torch::ones({2}).to_sparse(), "sparse"},
  };
  for (const auto& [grad, msg] : bad) {
    SCOPED_TRACE(msg);
    const auto before = full_state(opt);
    r.mutable_grad() = grad;
    EXPECT_THROW_MSG(opt.step(), msg);
    EXPECT_THROW_MSG(opt.step(), "param_groups[1]");  // says where
    const auto after = full_state(opt);
    ASSERT_EQ(after.size(), before.size());
    for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << i;
    EXPECT_EQ(opt.state().count(r.unsafeGetTensorImpl()), 0u);  // no new state
  }
  r.mutable_grad() = torch::ones({2});
  opt.step();
  EXPECT_EQ(state_of(opt, r).step().item<float>(), 1.0f);
  EXPECT_EQ(state_of(opt, p).step().item<float>(), 2.0f);
}

TEST(ASGDBadInput, BadGradientChangesNothing) {
  auto p = torch::randn({3}).requires_grad_();
  auto q = torch::randn({2}).requires_grad_();
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p});
  groups.emplace_back(std::vector<torch::Tensor>{q});
  ASGD opt(groups);
  const auto p0 = p.detach().clone();
  p.mutable_grad() = torch::ones({3});
  q.mutable_grad() = torch::ones({5});  // wrong shape, in the second group
  EXPECT_THROW_MSG(opt.step(), "has shape");
  EXPECT_TRUE(torch::equal(p, p0));
  EXPECT_TRUE(opt.state().empty());
  q.mutable_grad() = torch::ones({2}, torch::kDouble);
  EXPECT_THROW_MSG(opt.step(), "dtype");
  EXPECT_TRUE(torch::equal(p, p0));
  EXPECT_TRUE(opt.state().empty());
}

TEST(ASGDBadInput, MismatchedCheckpointChangesNothing) {
  Problem a(3);
  ASGD opt_a(a.groups());
  a.set_grads(0);
  opt_a.step();
  std::stringstream stream;
  torch::save(opt_a, stream);
  const std::string bytes = stream.str();

  // Different number of groups.
  auto x = torch::randn({4, 3}).requires_grad_();
  ASGD one_group({x});
  x.mutable_grad() = torch::ones({4, 3});
  one_group.step();
  const auto ax_before = state_of(one_group, x).ax().clone();
  std::istringstream s1(bytes);
  EXPECT_THROW_MSG(torch::load(one_group, s1), "different number of parameter groups");
  EXPECT_TRUE(torch::equal(state_of(one_group, x).ax(), ax_before));

  // Same structure, a parameter of another shape.
  Problem b(3);
  b.params[0] = torch::randn({5, 3}).requires_grad_();
  ASGD opt_b(b.groups());
  std::istringstream s2(bytes);
  EXPECT_THROW_MSG(torch::load(opt_b, s2), "has shape");
  EXPECT_TRUE(opt_b.state().empty());
  EXPECT_EQ(static_cast<const ASGDOptions&>(opt_b.param_groups()[0].options()).lr(), 0.03);

  // Not an optimizer archive at all.
  std::stringstream other;
  torch::save(torch::ones({2}), other);
  EXPECT_THROW(torch::load(opt_b, other), c10::Error);
  EXPECT_TRUE(opt_b.state().empty());
}

TEST(ASGDBadInput, OpErrorsSurfaceAsCppExceptions) {
  // A gradient of another device/kind than CPU float is rejected by the op
  // itself; here: an integer parameter.
  auto p = torch::ones({2}, torch::kLong);
  ASGD opt({p});
  p.mutable_grad() = torch::ones({2}, torch::kLong);
  EXPECT_THROW_MSG(opt.step(), "unsupported dtype");
}

TEST(ASGDCuda, MatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "");
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::CUDA)) {
    GTEST_SKIP() << "torchext was built without CUDA kernels (TORCHEXT_CUDA=OFF)";
  }
  Problem cpu(4), gpu(4);
  for (auto& p : gpu.params) p = p.detach().to(torch::kCUDA).requires_grad_();
  ASGD a(cpu.groups()), b(gpu.groups());
  for (int s = 0; s < 50; ++s) {
    cpu.set_grads(s);
    gpu.set_grads(s);
    for (auto& p : gpu.params) p.mutable_grad() = p.grad().to(torch::kCUDA);
    a.step();
    b.step();
  }
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    EXPECT_TRUE(close(gpu.params[i], cpu.params[i], 1e-5, 1e-6));
    EXPECT_EQ(state_of(b, gpu.params[i]).step().device().type(), torch::kCUDA);
  }
}

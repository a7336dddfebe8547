// torchext::amp::GradScaler: parity with torch.amp.GradScaler("cpu") (fused
// ASGD path and the unscale-and-check path of a foreign optimizer),
// hysteresis / min / max scale, skip reporting, save/load, bad input.
#include "common.h"

#include <torchext/torchext.h>

#include <limits>

using torchext::amp::GradScaler;
using torchext::amp::GradScalerOptions;
using namespace torchext_test;

namespace {

GradScalerOptions ref_options(const std::map<std::string, torch::Tensor>& ref) {
  const auto o = R(ref, "options");
  return GradScalerOptions()
      .init_scale(o[0].item<double>())
      .growth_factor(o[1].item<double>())
      .backoff_factor(o[2].item<double>())
      .growth_interval(o[3].item<int64_t>());
}

// The loop of make_reference.py's scaler_run, in C++.
torch::Tensor run(torch::optim::Optimizer& opt, torch::Tensor& w, GradScaler& scaler,
                  const torch::Tensor& xs) {
  std::vector<double> scales;
  for (int64_t s = 0; s < xs.size(0); ++s) {
    opt.zero_grad();
    auto loss = 0.5 * (w * xs[s]).pow(2).sum();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    scales.push_back(scaler.get_scale());
  }
  return torch::tensor(scales, torch::kDouble);
}

}  // namespace

TEST(GradScaler, FusedASGDPathMatchesPython) {
  const auto ref = load_ref("scaler_ref.pt");
  auto w = R(ref, "w0").clone().requires_grad_();
  torchext::optim::ASGD opt({w}, torchext::optim::ASGDOptions(0.05).lambd(1e-3).t0(4));
  GradScaler scaler(ref_options(ref));
  const auto scales = run(opt, w, scaler, R(ref, "xs"));
  EXPECT_TRUE(torch::equal(scales, R(ref, "asgd_scales"))) << scales << R(ref, "asgd_scales");
  EXPECT_TRUE(close(w, R(ref, "asgd_param")));
  EXPECT_EQ(scaler.num_skipped_steps(), 4);  // OVERFLOW_AT in make_reference.py
}

TEST(GradScaler, ForeignOptimizerPathMatchesPython) {
  const auto ref = load_ref("scaler_ref.pt");
  auto w = R(ref, "w0").clone().requires_grad_();
  torch::optim::SGD opt({w}, torch::optim::SGDOptions(0.05).momentum(0.9));
  GradScaler scaler(ref_options(ref));
  const auto scales = run(opt, w, scaler, R(ref, "xs"));
  EXPECT_TRUE(torch::equal(scales, R(ref, "sgd_scales"))) << scales << R(ref, "sgd_scales");
  EXPECT_TRUE(close(w, R(ref, "sgd_param")));
}

TEST(GradScaler, UnscaleThenStepGivesTheSameResult) {
  // Explicit unscale_ (e.g. for gradient clipping) before step(): ASGD then
  // gets found_inf but no grad_scale.
  const auto ref = load_ref("scaler_ref.pt");
  auto w = R(ref, "w0").clone().requires_grad_();
  torchext::optim::ASGD opt({w}, torchext::optim::ASGDOptions(0.05).lambd(1e-3).t0(4));
  GradScaler scaler(ref_options(ref));
  const auto xs = R(ref, "xs");
  for (int64_t s = 0; s < xs.size(0); ++s) {
    opt.zero_grad();
    scaler.scale(0.5 * (w * xs[s]).pow(2).sum()).backward();
    scaler.unscale_(opt);
    scaler.step(opt);
    scaler.update();
  }
  EXPECT_TRUE(close(w, R(ref, "asgd_param")));
}

TEST(GradScaler, SkipReportingOnDevice) {
  auto w = torch::ones({2}).requires_grad_();
  torchext::optim::ASGD opt({w});
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  EXPECT_FALSE(scaler.last_step_skipped().defined());
  for (float x : {1.0f, std::numeric_limits<float>::infinity(), 1.0f}) {
    opt.zero_grad();
    scaler.scale((w * x).sum()).backward();
    scaler.step(opt);
    scaler.update();
    EXPECT_EQ(scaler.last_step_skipped().item<bool>(), std::isinf(x));
    EXPECT_EQ(scaler.last_step_skipped().device(), w.device());
  }
  EXPECT_EQ(scaler.num_skipped_steps(), 1);
  EXPECT_EQ(scaler.skipped_steps().scalar_type(), torch::kLong);
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

TEST(GradScaler, HysteresisAndClampsFollowTheRule) {
  // Hand rule: with hysteresis 2 the scale backs off at the 2nd overflow in a
  // row; growth resets the hysteresis tracker; min/max clamp.
  auto w = torch::ones({2}).requires_grad_();
  torchext::optim::ASGD opt({w});
  GradScaler scaler(GradScalerOptions()
                        .init_scale(16.0)
                        .growth_interval(2)
                        .hysteresis(2)
                        .min_scale(4.0)
                        .max_scale(32.0));
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<float, double>> steps = {
      {inf, 16}, {inf, 8},   // two overflows in a row: one backoff
      {inf, 4},              // tracker at 0: backs off again (clamped at min 4)
      {inf, 4},              // stays at min_scale
      {1, 4},   {1, 8},      // growth after 2 good steps, hysteresis reset
      {inf, 8}, {1, 8},      // one overflow tolerated
      {1, 16}, {1, 16}, {1, 32}, {1, 32}, {1, 32},  // clamped at max 32
  };
  for (const auto& [x, want] : steps) {
    opt.zero_grad();
    scaler.scale((w * x).sum()).backward();
    scaler.step(opt);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), want) << "x=" << x;
  }
}

TEST(GradScaler, SettingsReachTheOpByName) {
  // Every two settings differ (make_reference.py's UPDATE_SCALE_SETTINGS):
  // update() passing two of them swapped gives another trajectory (or is
  // refused), against Python's torchext GradScaler with the same options.
  const auto ref = load_ref("update_scale_ref.pt");
  const auto num = [&](const char* key) { return R(ref, key).item<double>(); };
  auto w = R(ref, "scaler/w0").clone().requires_grad_();
  torch::optim::SGD opt({w}, 0.05);
  GradScaler scaler(GradScalerOptions()
                        .init_scale(1024.0)
                        .growth_factor(num("growth_factor"))
                        .backoff_factor(num("backoff_factor"))
                        .growth_interval(R(ref, "growth_interval").item<int64_t>())
                        .hysteresis(R(ref, "hysteresis").item<int64_t>())
                        .min_scale(num("min_scale"))
                        .max_scale(num("max_scale")));
  const auto xs = R(ref, "scaler/xs");
  const auto scales = R(ref, "scaler/scales");
  const auto skipped = R(ref, "scaler/skipped");
  for (int64_t s = 0; s < xs.size(0); ++s) {
    opt.zero_grad();
    scaler.scale(0.5 * (w * xs[s]).pow(2).sum()).backward();
    // The skip record exists with the state, on its device, before any update.
    ASSERT_TRUE(scaler.last_step_skipped().defined());
    EXPECT_EQ(scaler.last_step_skipped().scalar_type(), torch::kBool);
    EXPECT_EQ(scaler.last_step_skipped().dim(), 0);
    if (s == 0) EXPECT_FALSE(scaler.last_step_skipped().item<bool>());
    const auto record = scaler.last_step_skipped();
    scaler.step(opt);
    scaler.update();
    EXPECT_TRUE(scaler.last_step_skipped().is_same(record)) << "written in place";
    ASSERT_EQ(scaler.get_scale(), scales[s].item<double>()) << "step " << s;
    ASSERT_EQ(scaler.last_step_skipped().item<bool>(), skipped[s].item<bool>()) << "step " << s;
  }
  EXPECT_EQ(scaler.num_skipped_steps(), R(ref, "scaler/num_skipped").item<int64_t>());
}

TEST(GradScaler, DisabledIsAPassThrough) {
  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt({w}, 0.5);
  GradScaler scaler(GradScalerOptions().enabled(false));
  auto loss = (w * 2).sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(torch::equal(w, torch::zeros({2})));
}

TEST(GradScaler, UpdateWithNewScale) {
  auto w = torch::ones({2}).requires_grad_();
  torchext::optim::ASGD opt({w});
  GradScaler scaler;
  scaler.scale(w.sum()).backward();
  scaler.step(opt);
  scaler.update(128.0);
  EXPECT_EQ(scaler.get_scale(), 128.0);
  scaler.update(torch::full({1}, 64.0f));
  EXPECT_EQ(scaler.get_scale(), 64.0);
}

TEST(GradScaler, SaveLoadRoundTrip) {
  auto w = torch::ones({2}).requires_grad_();
  torchext::optim::ASGD opt({w});
  GradScaler a(GradScalerOptions().init_scale(64).growth_interval(3).hysteresis(2));
  for (float x : {1.0f, 1.0f, std::numeric_limits<float>::infinity()}) {
    opt.zero_grad();
    a.scale((w * x).sum()).backward();
    a.step(opt);
    a.update();
  }
  std::stringstream stream;
  torch::save(a, stream);
  GradScaler b;  // other options: the checkpoint's win
  torch::load(b, stream);
  EXPECT_EQ(b.get_scale(), a.get_scale());
  EXPECT_EQ(b.get_growth_tracker(), a.get_growth_tracker());
  EXPECT_EQ(b.hysteresis_tracker().item<int>(), 1);
  EXPECT_EQ(b.num_skipped_steps(), 1);  // the overflowed step was skipped (no backoff yet)
  EXPECT_EQ(b.get_scale(), 64.0);
  EXPECT_EQ(b.options().growth_interval(), 3);
  EXPECT_EQ(b.options().hysteresis(), 2);
}

TEST(GradScaler, SkipRecordAfterLoadingIntoAScalerWithoutState) {
  // A checkpoint holds no last_step_skipped: load() into a scaler that has
  // no state restores the rest, and update() still records the skip (here
  // with no scale() in between: the grads were never scaled).
  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt({w}, 0.5);
  GradScaler a(GradScalerOptions().init_scale(64));
  std::stringstream stream;
  a.scale(w.sum()).backward();
  a.step(opt);
  a.update();
  torch::save(a, stream);
  GradScaler b;
  torch::load(b, stream);
  EXPECT_FALSE(b.last_step_skipped().defined());
  opt.zero_grad();
  (w * std::numeric_limits<float>::infinity()).sum().backward();
  b.step(opt);
  b.update();
  ASSERT_TRUE(b.last_step_skipped().defined());
  EXPECT_TRUE(b.last_step_skipped().item<bool>());
  EXPECT_EQ(b.last_step_skipped().device(), b.scale_tensor().device());
  EXPECT_EQ(b.num_skipped_steps(), 1);
  EXPECT_EQ(b.get_scale(), 64.0 * 0.5);
}

TEST(GradScalerBadInput, ClearErrorsAndNoChange) {
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions().growth_factor(1.0)), "growth_factor");
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions().backoff_factor(1.5)), "backoff_factor");
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions().growth_interval(0)), "growth_interval");
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions().hysteresis(0)), "hysteresis");
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions().min_scale(8).max_scale(4)), "min_scale");
  // Python's check_options: a finite init_scale > 0.
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions().init_scale(
                       std::numeric_limits<double>::infinity())),
                   "init_scale");
  EXPECT_THROW_MSG(GradScaler(GradScalerOptions().init_scale(0)), "init_scale");
  // Issue 25: nothing non-finite that would make the scale so; max_scale =
  // inf is "no clamp" (as nullopt).
  {
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const double v : {inf, nan}) {
      EXPECT_THROW_MSG(GradScaler(GradScalerOptions().growth_factor(v)), "growth_factor");
      EXPECT_THROW_MSG(GradScaler(GradScalerOptions().backoff_factor(v)), "backoff_factor");
      EXPECT_THROW_MSG(GradScaler(GradScalerOptions().init_scale(v)), "init_scale");
      EXPECT_THROW_MSG(GradScaler(GradScalerOptions().min_scale(v)), "min_scale");
    }
    EXPECT_THROW_MSG(GradScaler(GradScalerOptions().backoff_factor(-inf)), "backoff_factor");
    EXPECT_THROW_MSG(GradScaler(GradScalerOptions().init_scale(-inf)), "init_scale");
    EXPECT_THROW_MSG(GradScaler(GradScalerOptions().max_scale(nan)), "max_scale must not be NaN");
    EXPECT_THROW_MSG(GradScaler(GradScalerOptions().max_scale(-inf)), "max_scale");
    GradScaler unclamped(GradScalerOptions().max_scale(inf));
    EXPECT_EQ(unclamped.options().max_scale(), inf);
    unclamped.scale(torch::ones({}));
    std::stringstream saved;
    torch::save(unclamped, saved);
    GradScaler back;
    torch::load(back, saved);  // its own archive loads
    EXPECT_EQ(back.options().max_scale(), inf);
  }

  auto w = torch::ones({2}).requires_grad_();
  torch::optim::SGD opt({w}, 0.1);
  GradScaler scaler;
  EXPECT_THROW_MSG(scaler.unscale_(opt), "scale(loss or outputs)");
  scaler.scale(w.sum()).backward();
  scaler.unscale_(opt);
  const auto grad = w.grad().clone();
  EXPECT_THROW_MSG(scaler.unscale_(opt), "already been called");
  EXPECT_TRUE(torch::equal(w.grad(), grad));
  scaler.step(opt);
  EXPECT_THROW_MSG(scaler.step(opt), "already been called");
  EXPECT_THROW_MSG(scaler.update(torch::full({}, 2.0, torch::kDouble)), "float32");
  const double scale = scaler.get_scale();
  std::stringstream other;
  torch::save(torch::ones({2}), other);
  EXPECT_THROW(torch::load(scaler, other), c10::Error);
  EXPECT_EQ(scaler.get_scale(), scale);
}

// All or nothing over param groups: a bad gradient in the LATER group of a
// torchext ASGD (fused, sync-free path) or of a foreign optimizer (unscale_)
// changes nothing: params, grads, optimizer state, scaler state.
TEST(GradScalerBadInput, BadGradientInALaterGroupChangesNothing) {
  auto p = torch::randn({3}).requires_grad_();
  auto q = torch::randn({2}).requires_grad_();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p});
  groups.emplace_back(std::vector<torch::Tensor>{q});
  torchext::optim::ASGD asgd(groups);
  GradScaler scaler(GradScalerOptions().init_scale(8.0).growth_interval(1));
  const auto p0 = p.detach().clone(), q0 = q.detach().clone();
  const std::vector<std::pair<torch::Tensor, const char*>> bad = {
      {torch::ones({5}), "has shape"},
      {torch::ones({2}, torch::kInt), "dtype"},
      {torch::ones({2}).to_sparse(), "sparse"},
  };
  for (const auto& [grad, msg] : bad) {
    SCOPED_TRACE(msg);
    scaler.scale(p.sum()).backward();
    q.mutable_grad() = grad;
    const auto gp = p.grad().clone();
    EXPECT_THROW_MSG(scaler.step(asgd), msg);
    EXPECT_TRUE(torch::equal(p, p0));
    EXPECT_TRUE(torch::equal(q, q0));
    EXPECT_TRUE(torch::equal(p.grad(), gp));
    EXPECT_TRUE(asgd.state().empty());  // no new state
    EXPECT_EQ(scaler.get_scale(), 8.0);
    p.mutable_grad() = torch::Tensor();
  }
  // A foreign optimizer: unscale_ checks every group before unscaling any.
  torch::optim::SGD sgd(groups, 0.1);
  scaler.scale(p.sum()).backward();
  q.mutable_grad() = torch::ones({2}, torch::kInt);
  const auto gp = p.grad().clone();
  EXPECT_THROW_MSG(scaler.unscale_(sgd), "dtype");
  EXPECT_TRUE(torch::equal(p.grad(), gp));
  EXPECT_THROW_MSG(scaler.step(sgd), "dtype");
  EXPECT_TRUE(torch::equal(p.grad(), gp));
  EXPECT_TRUE(torch::equal(p, p0));
  // Fixed, the step goes through: the failed calls left no half-done stage.
  q.mutable_grad() = torch::ones({2});
  scaler.step(asgd);
  scaler.update();
  EXPECT_FALSE(torch::equal(p, p0));
  EXPECT_EQ(scaler.get_scale(), 16.0);
}

// ---- the fused-step protocol (torchext/amp/fused_step.h) -------------------

namespace {

// torchext's ASGD, counting the scaler's calls of the fused step.
struct CountingASGD : torchext::optim::ASGD {
  using ASGD::ASGD;
  std::vector<bool> found_inf_given;  // one per call: was found_inf passed?
  torch::Tensor step_with_amp(const torch::Tensor& grad_scale, const torch::Tensor& found_inf,
                              const torch::Tensor& clip_coef) override {
    found_inf_given.push_back(found_inf.defined());
    return ASGD::step_with_amp(grad_scale, found_inf, clip_coef);
  }
};

}  // namespace

// C++ scaler + C++ ASGD through overflows against Python's torchext scaler +
// torchext ASGD (make_reference.py amp_protocol_reference): which steps
// called the optimizer (capturable: every one, skipped on the device), the
// scales, and the params and state bit for bit.
TEST(GradScaler, FusedProtocolMatchesPythonTorchextScaler) {
  const auto ref = load_ref("amp_protocol_ref.pt");
  const auto xs = R(ref, "xs");
  for (const std::string variant : {"plain", "capturable", "unscale_first"}) {
    SCOPED_TRACE(variant);
    const std::string pre = variant + "/";
    auto w = R(ref, "w0").clone().requires_grad_();
    CountingASGD opt(std::vector<torch::Tensor>{w},
                     torchext::optim::ASGDOptions(0.05).lambd(1e-3).t0(4).capturable(
                         variant == "capturable"));
    EXPECT_EQ(opt.amp_step_must_not_sync(), variant == "capturable");
    GradScaler scaler(GradScalerOptions().init_scale(1024).growth_factor(2).backoff_factor(0.5)
                          .growth_interval(3));
    std::vector<bool> called;
    std::vector<double> scales;
    for (int64_t s = 0; s < xs.size(0); ++s) {
      opt.zero_grad();
      scaler.scale(0.5 * (w * xs[s]).pow(2).sum()).backward();
      if (variant == "unscale_first") scaler.unscale_(opt);
      const size_t before = opt.found_inf_given.size();
      EXPECT_FALSE(scaler.step(opt).defined());  // ASGD's step returns nothing
      called.push_back(opt.found_inf_given.size() > before);
      if (called.back()) {  // found_inf only when the skip is left to the device
        EXPECT_EQ(opt.found_inf_given.back(), variant == "capturable");
      }
      scaler.update();
      scales.push_back(scaler.get_scale());
    }
    const auto want_called = R(ref, pre + "called");
    ASSERT_EQ(static_cast<int64_t>(called.size()), want_called.numel());
    for (size_t s = 0; s < called.size(); ++s) {
      EXPECT_EQ(called[s], want_called[s].item<bool>()) << "step " << s;
    }
    EXPECT_TRUE(torch::equal(torch::tensor(scales, torch::kDouble), R(ref, pre + "scales")));
    EXPECT_TRUE(torch::equal(w.detach(), R(ref, pre + "w")));
    const auto& st = static_cast<const torchext::optim::ASGDParamState&>(
        *opt.state().at(w.unsafeGetTensorImpl()));
    for (const auto& [key, t] : std::vector<std::pair<std::string, torch::Tensor>>{
             {"step", st.step()}, {"eta", st.eta()}, {"mu", st.mu()}, {"ax", st.ax()}}) {
      EXPECT_TRUE(torch::equal(t, R(ref, pre + key))) << key << ": " << t << " vs "
                                                       << R(ref, pre + key);
    }
    EXPECT_EQ(scaler.num_skipped_steps(), R(ref, pre + "skipped").item<int64_t>());
  }
}

namespace {

// A plain optimizer whose step() returns a value (what GradScaler::step must
// hand back), and one implementing the fused protocol, also returning one.
struct ReturningSGD : torch::optim::SGD {
  using SGD::SGD;
  int64_t calls = 0;
  torch::Tensor step(LossClosure closure = nullptr) override {
    SGD::step(closure);
    return torch::full({}, static_cast<double>(++calls));
  }
};

struct FusedSGD : torch::optim::SGD, torchext::amp::FusedAmpStep {
  using SGD::SGD;
  bool device_skip = false;
  std::vector<std::pair<bool, bool>> seen;  // (grad_scale given, found_inf given)
  torch::Tensor step_with_amp(const torch::Tensor& grad_scale, const torch::Tensor& found_inf,
                              const torch::Tensor& /*clip_coef*/) override {
    seen.emplace_back(grad_scale.defined(), found_inf.defined());
    return torch::full({}, 7.0);
  }
  bool amp_step_must_not_sync() const override { return device_skip; }
};

}  // namespace

TEST(GradScaler, StepReturnsWhatTheOptimizersStepReturned) {
  const float inf = std::numeric_limits<float>::infinity();
  {  // plain: step() runs only without an overflow, and its value comes back
    auto w = torch::ones({2}).requires_grad_();
    ReturningSGD opt({w}, torch::optim::SGDOptions(0.1));
    GradScaler scaler(GradScalerOptions().init_scale(4));
    std::vector<double> got;
    for (float x : {1.0f, inf, 1.0f}) {
      opt.zero_grad();
      scaler.scale((w * x).sum()).backward();
      const auto r = scaler.step(opt);
      got.push_back(r.defined() ? r.item<double>() : -1.0);
      scaler.update();
    }
    EXPECT_EQ(got, (std::vector<double>{1.0, -1.0, 2.0}));
  }
  for (const bool device_skip : {false, true}) {  // any optimizer with the protocol
    SCOPED_TRACE(device_skip ? "device skip" : "host skip");
    auto w = torch::ones({2}).requires_grad_();
    FusedSGD opt({w}, torch::optim::SGDOptions(0.1));
    opt.device_skip = device_skip;
    GradScaler scaler(GradScalerOptions().init_scale(4));
    std::vector<bool> returned;
    for (float x : {1.0f, inf}) {
      opt.zero_grad();
      scaler.scale((w * x).sum()).backward();
      returned.push_back(scaler.step(opt).defined());
      scaler.update();
    }
    // Host skip: not called on the overflow (undefined back); device skip:
    // always called, with found_inf.
    EXPECT_EQ(returned, (std::vector<bool>{true, device_skip}));
    ASSERT_EQ(opt.seen.size(), device_skip ? 2u : 1u);
    for (const auto& [gs, fi] : opt.seen) {
      EXPECT_TRUE(gs);
      EXPECT_EQ(fi, device_skip);
    }
    EXPECT_EQ(scaler.get_scale(), 2.0);  // backed off once either way
    EXPECT_TRUE(torch::equal(w, torch::ones({2})));  // FusedSGD's step changes nothing
  }
}

// A fused step that throws leaves the scaler's records as they were: the
// same iteration goes through once the problem is fixed.
TEST(GradScalerBadInput, RefusedFusedStepKeepsTheRecords) {
  auto p = torch::ones({2}).requires_grad_();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p});
  torchext::optim::ASGD opt(groups);
  GradScaler scaler(GradScalerOptions().init_scale(8));
  scaler.scale(p.sum()).backward();
  // t0_per_param of the wrong length: ASGD's step refuses before any write.
  static_cast<torchext::optim::ASGDOptions&>(opt.param_groups()[0].options())
      .t0_per_param({1.0, 2.0});
  EXPECT_THROW_MSG(scaler.step(opt), "t0_per_param");
  EXPECT_THROW_MSG(scaler.update(), "no inf checks were recorded");
  static_cast<torchext::optim::ASGDOptions&>(opt.param_groups()[0].options()).t0_per_param({});
  scaler.step(opt);
  scaler.update();
  EXPECT_FALSE(torch::equal(p, torch::ones({2})));
}

// ---- the clip: GradScaler::clip_grad_norm_, clip_and_step ------------------
// See Note [Clip: applied when called, folded only inside one call]
// (csrc/api/clip_grad.h).

namespace {

// make_reference.py's clip model: Linear 6->16, tanh, Linear 16->3, MSE.
torch::Tensor clip_model_loss(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                              const torch::Tensor& y) {
  const auto h = torch::tanh(torch::linear(x, p[0], p[1]));
  return torch::mse_loss(torch::linear(h, p[2], p[3]), y);
}

// Bit for bit, NaN where NaN (the overflow steps' norms).
::testing::AssertionResult same_bits(const torch::Tensor& got, const torch::Tensor& want) {
  if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes() ||
      !torch::equal(got.isnan(), want.isnan()) ||
      !torch::equal(got.nan_to_num(0, 0, 0), want.nan_to_num(0, 0, 0))) {
    return ::testing::AssertionFailure() << "got " << got << "\nwant " << want;
  }
  return ::testing::AssertionSuccess();
}

struct ClipVariant {
  std::string name, opt, scaler;  // opt: asgd, asgd_capturable, sgd; scaler: on, off, none
  bool unscale_first;
  bool one_call;  // clip_and_step instead of clip_grad_norm_ then step
};

// LibTorch's own recipe for a scaler's clip, the reference of the tests
// below: each gradient unscaled as torch's unscale_ stores it
// (grad.mul_(inv), inv = the float32 reciprocal of the scale computed in
// double), the inf check, then torch::nn::utils::clip_grad_norm_ over all the
// parameters. Returns whether a gradient was inf/NaN (the step is skipped).
bool torch_recipe_clip(const std::vector<torch::Tensor>& params, const torch::Tensor& scale,
                       double max_norm, const std::vector<bool>& unscale = {}) {
  torch::NoGradGuard no_grad;
  const auto inv = scale.to(torch::kDouble).reciprocal().to(torch::kFloat);
  bool found = false;
  for (size_t i = 0; i < params.size(); ++i) {
    auto g = params[i].grad();
    if (!g.defined()) continue;
    if (unscale.empty() || unscale[i]) g.mul_(inv);
    found = found || !g.isfinite().all().item<bool>();
  }
  torch::nn::utils::clip_grad_norm_(params, max_norm);
  return found;
}

// A 2x3 weight and a bias; loss mean(linear(x (1 + k), w, b)^2) / 2 in
// float32, whatever the parameters' dtype.
torch::Tensor small_loss(const std::vector<torch::Tensor>& p, int k) {
  const auto x = torch::tensor({{1.0, 2.0, -1.0}, {0.5, -2.0, 3.0}, {-1.5, 1.0, 0.5},
                                {2.0, 0.0, -0.5}}, torch::kFloat) * (1.0 + k);
  return torch::linear(x, p[0].to(torch::kFloat), p[1].to(torch::kFloat)).pow(2).mean() * 0.5;
}

std::vector<torch::Tensor> small_params(torch::ScalarType dtype = torch::kFloat) {
  return {torch::tensor({{0.5, -1.0, 2.0}, {1.5, 0.25, -0.75}}).to(dtype).requires_grad_(),
          torch::tensor({0.1, -0.2}).to(dtype).requires_grad_()};
}

std::unique_ptr<torch::optim::Optimizer> small_optimizer(const std::string& kind,
                                                         const std::vector<torch::Tensor>& p) {
  if (kind == "asgd") {
    return std::make_unique<torchext::optim::ASGD>(p, torchext::optim::ASGDOptions(0.05).t0(2));
  }
  return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
}

// unscale_() refuses once the record is kUnscaled (or kStepped).
bool record_is_unscaled(GradScaler& scaler, torch::optim::Optimizer& opt) {
  try {
    scaler.unscale_(opt);
  } catch (const c10::Error& e) {
    return std::string(e.what_without_backtrace()).find("already been called") !=
           std::string::npos;
  }
  return false;
}

// LibTorch's SGD whose next step throws once, before it writes anything;
// torchext's ASGD whose next fused step does.
struct ThrowingSGD : torch::optim::SGD {
  using SGD::SGD;
  bool armed = true;
  torch::Tensor step(LossClosure closure = nullptr) override {
    if (armed) {
      armed = false;
      TORCH_CHECK(false, "injected");
    }
    return SGD::step(closure);
  }
};
struct ThrowingASGD : torchext::optim::ASGD {
  using ASGD::ASGD;
  bool armed = true;
  torch::Tensor step_with_amp(const torch::Tensor& g, const torch::Tensor& f,
                              const torch::Tensor& c) override {
    if (armed) {
      armed = false;
      TORCH_CHECK(false, "injected");
    }
    return ASGD::step_with_amp(g, f, c);
  }
};

}  // namespace

// C++ against Python's torchext (make_reference.py clip_reference), the same
// calls: the scaler's clip with torchext's ASGD and with LibTorch's SGD, as
// two calls (clip_grad_norm_ then step) and as one (clip_and_step), after
// unscale_, with a disabled scaler, and ASGD's own clip without a scaler;
// through an inf and a NaN step with clipping active. Every norm, scale,
// skip and parameter bit for bit.
TEST(GradScaler, ClipMatchesPython) {
  const auto ref = load_ref("clip_ref.pt");
  const auto x = R(ref, "x"), y = R(ref, "y");
  const int64_t steps = R(ref, "steps").item<int64_t>();
  const double max_norm = R(ref, "max_norm").item<double>();
  std::vector<ClipVariant> variants;
  for (const bool one_call : {false, true}) {
    const std::string suffix = one_call ? "_one_call" : "";
    for (const auto& v : std::vector<ClipVariant>{
             {"asgd", "asgd", "on", false, one_call},
             {"asgd_capturable", "asgd_capturable", "on", false, one_call},
             {"asgd_unscale_first", "asgd", "on", true, one_call},
             {"asgd_inf_norm", "asgd", "on", false, one_call},
             {"sgd", "sgd", "on", false, one_call},
             {"sgd_unscale_first", "sgd", "on", true, one_call},
             {"asgd_disabled", "asgd", "off", false, one_call},
             {"sgd_disabled", "sgd", "off", false, one_call},
             {"asgd_no_scaler", "asgd", "none", false, one_call}}) {
      variants.push_back(v);
      variants.back().name += suffix;
    }
  }
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    const std::string pre = v.name + "/";
    const double norm_type = R(ref, pre + "norm_type").item<double>();
    std::vector<torch::Tensor> params;
    for (int i = 0; i < 4; ++i) {
      params.push_back(R(ref, "init" + std::to_string(i)).clone().requires_grad_());
    }
    std::unique_ptr<torch::optim::Optimizer> opt;
    torchext::optim::ASGD* asgd = nullptr;
    if (v.opt == "sgd") {
      opt = std::make_unique<torch::optim::SGD>(params,
                                                torch::optim::SGDOptions(0.05).momentum(0.9));
    } else {
      auto a = std::make_unique<torchext::optim::ASGD>(
          params,
          torchext::optim::ASGDOptions(0.05).t0(5).capturable(v.opt == "asgd_capturable"));
      asgd = a.get();
      opt = std::move(a);
    }
    GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(4).enabled(
        v.scaler == "on"));
    std::vector<torch::Tensor> norms;
    std::vector<double> scales;
    for (int64_t s = 0; s < steps; ++s) {
      opt->zero_grad();
      const auto loss = clip_model_loss(params, x, y);
      if (v.scaler == "none") {
        loss.backward();
        if (v.one_call) {
          norms.push_back(asgd->clip_and_step(max_norm, norm_type).total_norm);
        } else {
          norms.push_back(asgd->clip_grad_norm_(max_norm, norm_type));
          opt->step();
        }
        continue;
      }
      scaler.scale(loss).backward();
      const std::string bad = "bad_at" + std::to_string(s);
      if (v.scaler == "on" && ref.count(bad)) {
        params[0].grad().view(-1)[1] = R(ref, bad).item<float>();
      }
      if (v.unscale_first) scaler.unscale_(*opt);
      if (v.one_call) {
        norms.push_back(scaler.clip_and_step(*opt, max_norm, norm_type).total_norm);
      } else {
        norms.push_back(scaler.clip_grad_norm_(*opt, max_norm, norm_type));
        scaler.step(*opt);
      }
      scaler.update();
      scales.push_back(scaler.get_scale());
    }
    EXPECT_TRUE(same_bits(torch::stack(norms), R(ref, pre + "norms")));
    EXPECT_TRUE(torch::equal(torch::tensor(scales, torch::kDouble), R(ref, pre + "scales")))
        << torch::tensor(scales, torch::kDouble) << R(ref, pre + "scales");
    EXPECT_EQ(scaler.num_skipped_steps(), R(ref, pre + "skipped").item<int64_t>());
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(same_bits(params[i].detach(), R(ref, pre + "param" + std::to_string(i))))
          << "param" << i;
    }
  }
}

// What the grads hold: after the two-call clip, unscaled and clipped for
// every optimizer (written when called); after clip_and_step, still scaled
// and unclipped with torchext's ASGD (the coefficient went to its step),
// unscaled and clipped with another optimizer. The norm stays on the device
// (0-d, the grads' dtype).
TEST(GradScaler, ClipLeavesTheGradsAsDocumented) {
  for (const bool one_call : {false, true}) {
    for (const bool fused : {true, false}) {
      SCOPED_TRACE(std::string(fused ? "ASGD" : "SGD") + (one_call ? ", one call" : ""));
      auto w = torch::tensor({3.0f, 4.0f}).requires_grad_();
      std::unique_ptr<torch::optim::Optimizer> opt;
      if (fused) {
        opt = std::make_unique<torchext::optim::ASGD>(std::vector<torch::Tensor>{w});
      } else {
        opt = std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{w},
                                                  torch::optim::SGDOptions(0.0));
      }
      GradScaler scaler(GradScalerOptions().init_scale(8));
      scaler.scale((w * w).sum() / 2).backward();  // grad = 8 * (3, 4): norm 40, unscaled 5
      const auto total = one_call ? scaler.clip_and_step(*opt, 1.0).total_norm
                                  : scaler.clip_grad_norm_(*opt, 1.0);
      EXPECT_EQ(total.dim(), 0);
      EXPECT_EQ(total.scalar_type(), torch::kFloat);
      EXPECT_EQ(total.item<float>(), 5.0f);
      if (one_call && fused) {
        EXPECT_TRUE(torch::equal(w.grad(), torch::tensor({24.0f, 32.0f})));
      } else {  // (3, 4) * 1 / (5 + 1e-6)
        EXPECT_TRUE(close(w.grad(), torch::tensor({0.6f, 0.8f}), 1e-6));
      }
      if (!one_call) scaler.step(*opt);
      EXPECT_THROW_MSG(scaler.step(*opt), "already been called");  // kStepped
      scaler.update();
    }
  }
}

// The two-call clip against LibTorch's recipe (unscale_, clip_grad_norm_):
// the grads it leaves (within 1e-6: the norms are summed in double in
// another order) and torch's record, kUnscaled with the inf check: unscale_
// refuses, and an overflow is skipped by step() and backs off update().
TEST(GradScaler, TwoCallClipLeavesTorchsRecipe) {
  for (const bool overflow : {false, true}) {
    SCOPED_TRACE(overflow ? "overflow" : "finite");
    auto ours = small_params(), theirs = small_params();
    auto opt = small_optimizer("sgd", ours);
    GradScaler scaler(GradScalerOptions().init_scale(1024));
    scaler.scale(small_loss(ours, 1)).backward();
    const auto scale = scaler.scale_tensor().clone();
    (small_loss(theirs, 1) * scale).backward();
    if (overflow) {
      ours[0].grad()[0][1] = std::numeric_limits<float>::infinity();
      theirs[0].grad()[0][1] = std::numeric_limits<float>::infinity();
    }
    const auto total = scaler.clip_grad_norm_(*opt, 0.05);
    EXPECT_EQ(torch_recipe_clip(theirs, scale, 0.05), overflow);
    EXPECT_EQ(total.isfinite().item<bool>(), !overflow);
    for (size_t i = 0; i < ours.size(); ++i) {
      if (!overflow) {
        EXPECT_TRUE(close(ours[i].grad(), theirs[i].grad(), 1e-6)) << i;
      } else {  // both NaN where the coefficient is NaN or 0 * inf
        EXPECT_EQ(ours[i].grad().isfinite().all().item<bool>(),
                  theirs[i].grad().isfinite().all().item<bool>());
      }
    }
    EXPECT_TRUE(record_is_unscaled(scaler, *opt));
    const auto before = ours[0].detach().clone();
    EXPECT_EQ(scaler.step(*opt).defined(), false);  // SGD's step returns nothing either way
    EXPECT_EQ(torch::equal(ours[0], before), overflow);
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), overflow ? 512.0 : 1024.0);
    EXPECT_EQ(scaler.num_skipped_steps(), overflow ? 1 : 0);
  }
}

// After the two-call clip nothing waits: code that replaces or edits the
// grads before step() is stepped with what they hold, as in torch's recipe
// doing the same edit (torchext's ASGD and LibTorch's SGD).
TEST(GradScaler, EditsBetweenTheTwoCallClipAndStepAreStepped) {
  for (const std::string kind : {"asgd", "sgd"}) {
    SCOPED_TRACE(kind);
    auto ours = small_params(), theirs = small_params();
    auto opt = small_optimizer(kind, ours), ref = small_optimizer(kind, theirs);
    GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2));
    for (int s = 0; s < 4; ++s) {
      opt->zero_grad();
      ref->zero_grad();
      scaler.scale(small_loss(ours, s)).backward();
      const auto scale = scaler.scale_tensor().clone();
      (small_loss(theirs, s) * scale).backward();
      scaler.clip_grad_norm_(*opt, 0.05);
      torch_recipe_clip(theirs, scale, 0.05);
      for (auto* ps : {&ours, &theirs}) {
        torch::NoGradGuard no_grad;
        (*ps)[0].grad().mul_(0.5 + s);                           // an edit in place
        (*ps)[1].mutable_grad() = (*ps)[1].grad() * 2.0 - 0.01;  // a replacement
      }
      scaler.step(*opt);
      ref->step();
      scaler.update();
    }
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(close(ours[i], theirs[i], 1e-6)) << i;
    }
  }
}

// clip_and_step against the two-call clip and LibTorch's recipe over several
// steps with an overflow, at a small and at the top scale (2^127, where
// scale / coef overflows float32: the fused step takes two factors), for
// fp32 and bf16 parameters (grads): the scales and skips equal, the params
// within float rounding (the two-call clip rounds the grads to their dtype
// after each factor, the fused step does not).
TEST(GradScaler, ClipAndStepMatchesTheTwoCallClipAndTorchsRecipe) {
  for (const std::string kind : {"asgd", "sgd"}) {
    for (const double init : {1024.0, std::ldexp(1.0, 127)}) {
      for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
        SCOPED_TRACE(kind + ", scale " + std::to_string(init) +
                     (dtype == torch::kFloat ? ", fp32" : ", bf16"));
        auto one = small_params(dtype), two = small_params(dtype), theirs = small_params(dtype);
        auto opt1 = small_optimizer(kind, one), opt2 = small_optimizer(kind, two),
             ref = small_optimizer(kind, theirs);
        const auto options = GradScalerOptions().init_scale(init).growth_interval(2);
        GradScaler s1(options), s2(options);
        // At the top scale the grads (and the bound) are made small enough
        // that scaled they stay finite; the coefficient then is ~5e-3, and
        // scale / coef would overflow float32.
        // (bf16: a bound that moves the parameters by more than bf16's
        // resolution.)
        const double mult = init > 1e30 ? 1e-2 : 1.0;
        const double bound = dtype == torch::kFloat ? 0.05 * mult : (mult < 1 ? 0.5 : 2.0);
        int64_t skipped = 0, clipped = 0;
        for (int s = 0; s < 6; ++s) {
          for (auto* o : {opt1.get(), opt2.get(), ref.get()}) o->zero_grad();
          s1.scale(small_loss(one, s) * mult).backward();
          s2.scale(small_loss(two, s) * mult).backward();
          const auto scale = s1.scale_tensor().clone();
          ASSERT_TRUE(torch::equal(scale, s2.scale_tensor()));
          (small_loss(theirs, s) * mult * scale).backward();
          if (s == 2) {
            for (auto* ps : {&one, &two, &theirs}) {
              (*ps)[0].grad()[1][2] = std::numeric_limits<float>::infinity();
            }
          }
          const auto n1 = s1.clip_and_step(*opt1, bound).total_norm;
          const auto n2 = s2.clip_grad_norm_(*opt2, bound);
          s2.step(*opt2);
          if (!torch_recipe_clip(theirs, scale, bound)) {
            ref->step();
          } else {
            ++skipped;
          }
          EXPECT_TRUE(same_bits(n1, n2)) << "step " << s;
          if (n1.isfinite().item<bool>() && n1.item<double>() > bound) ++clipped;
          s1.update();
          s2.update();
        }
        EXPECT_EQ(s1.get_scale(), s2.get_scale());
        EXPECT_EQ(s1.num_skipped_steps(), skipped);
        EXPECT_EQ(s2.num_skipped_steps(), skipped);
        EXPECT_GE(skipped, 1);
        EXPECT_GE(clipped, 2);                      // clipping active
        EXPECT_GE(s1.get_scale(), init / 64);       // (near) the scale asked for
        const double rtol = dtype == torch::kFloat ? 1e-6 : 1e-2;
        for (size_t i = 0; i < one.size(); ++i) {
          EXPECT_TRUE(close(two[i], theirs[i], rtol)) << "two calls, param " << i;
          EXPECT_TRUE(close(one[i], theirs[i], rtol)) << "one call, param " << i;
          if (kind == "sgd") EXPECT_TRUE(torch::equal(one[i], two[i])) << i;  // the same pass
        }
        const auto p0 = small_params(dtype);  // it trains
        EXPECT_FALSE(torch::equal(one[0], p0[0]) && torch::equal(one[1], p0[1]));
      }
    }
  }
}

// clip_and_step after unscale_() (or after a two-call clip): the grads are
// measured as they are and never unscaled twice, as torch's recipe (unscale_,
// clip, clip again, step).
TEST(GradScaler, ClipAndStepAfterUnscaleNeverUnscalesTwice) {
  for (const std::string kind : {"asgd", "sgd"}) {
    for (const bool first_clip : {false, true}) {
      SCOPED_TRACE(kind + (first_clip ? ", after a clip" : ", after unscale_"));
      auto ours = small_params(), theirs = small_params();
      auto opt = small_optimizer(kind, ours), ref = small_optimizer(kind, theirs);
      GradScaler scaler(GradScalerOptions().init_scale(1024));
      scaler.scale(small_loss(ours, 1)).backward();
      const auto scale = scaler.scale_tensor().clone();
      (small_loss(theirs, 1) * scale).backward();
      if (first_clip) {
        scaler.clip_grad_norm_(*opt, 0.5);
        torch_recipe_clip(theirs, scale, 0.5);
      } else {
        scaler.unscale_(*opt);
        torch_recipe_clip(theirs, scale, std::numeric_limits<double>::infinity());
      }
      scaler.clip_and_step(*opt, 0.05);
      torch::nn::utils::clip_grad_norm_(theirs, 0.05);
      ref->step();
      for (size_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(close(ours[i], theirs[i], 1e-6)) << i;
      }
      EXPECT_THROW_MSG(scaler.clip_and_step(*opt, 0.05), "already been called");
    }
  }
}

// error_if_nonfinite with a non-finite norm leaves what torch's recipe
// leaves: the grads unscaled (not clipped), the record kUnscaled with the inf
// check (so step() skips and update() backs off), then the error; the same
// from clip_and_step, which does not step.
TEST(GradScaler, ErrorIfNonfiniteLeavesTorchsRecipesState) {
  for (const bool one_call : {false, true}) {
    for (const std::string kind : {"asgd", "sgd"}) {
      SCOPED_TRACE(kind + (one_call ? ", one call" : ", two calls"));
      auto ours = small_params();
      auto opt = small_optimizer(kind, ours);
      GradScaler scaler(GradScalerOptions().init_scale(1024));
      scaler.scale(small_loss(ours, 1)).backward();
      ours[0].grad()[0][0] = std::numeric_limits<float>::infinity();
      std::vector<torch::Tensor> want;
      for (const auto& p : ours) {
        want.push_back(p.grad() * scaler.scale_tensor().to(torch::kDouble).reciprocal().to(
                                      torch::kFloat));
      }
      const auto p0 = ours[1].detach().clone();
      if (one_call) {
        EXPECT_THROW_MSG(scaler.clip_and_step(*opt, 0.05, 2.0, true), "non-finite");
      } else {
        EXPECT_THROW_MSG(scaler.clip_grad_norm_(*opt, 0.05, 2.0, true), "non-finite");
      }
      for (size_t i = 0; i < ours.size(); ++i) {
        EXPECT_TRUE(torch::equal(ours[i].grad(), want[i])) << i;
      }
      EXPECT_TRUE(torch::equal(ours[1], p0));  // not stepped
      EXPECT_TRUE(record_is_unscaled(scaler, *opt));
      EXPECT_FALSE(scaler.step(*opt).defined());  // skipped: the inf check stands
      EXPECT_TRUE(torch::equal(ours[1], p0));
      scaler.update();
      EXPECT_EQ(scaler.get_scale(), 512.0);
      EXPECT_EQ(scaler.num_skipped_steps(), 1);
    }
  }
}

// A plain optimizer whose step throws inside clip_and_step: its grads stay
// unscaled and clipped, the record kUnscaled, so scaler.step() retries
// without clipping twice (torch's recipe clipping once). A fused step that
// throws wrote nothing and leaves the record as it was: clip_and_step again
// goes through, as torch's recipe.
TEST(GradScaler, ClipAndStepWhoseStepThrowsIsRetried) {
  for (const std::string kind : {"asgd", "sgd"}) {
    SCOPED_TRACE(kind);
    auto ours = small_params(), theirs = small_params();
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (kind == "sgd") {
      opt = std::make_unique<ThrowingSGD>(ours, torch::optim::SGDOptions(0.05).momentum(0.9));
    } else {
      opt = std::make_unique<ThrowingASGD>(ours, torchext::optim::ASGDOptions(0.05).t0(2));
    }
    auto ref = small_optimizer(kind, theirs);
    GradScaler scaler(GradScalerOptions().init_scale(1024));
    scaler.scale(small_loss(ours, 2)).backward();
    const auto scale = scaler.scale_tensor().clone();
    (small_loss(theirs, 2) * scale).backward();
    const auto scaled = ours[0].grad().clone();
    EXPECT_THROW_MSG(scaler.clip_and_step(*opt, 0.05), "injected");
    if (kind == "sgd") {
      EXPECT_TRUE(record_is_unscaled(scaler, *opt));
      scaler.step(*opt);
    } else {
      EXPECT_TRUE(torch::equal(ours[0].grad(), scaled));  // nothing written
      scaler.clip_and_step(*opt, 0.05);
    }
    scaler.update();
    EXPECT_FALSE(torch_recipe_clip(theirs, scale, 0.05));
    ref->step();
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(close(ours[i], theirs[i], 1e-6)) << i;
    }
  }
}

// One clip over two optimizers on one scaler (torch's recipe: unscale_ each,
// one clip_grad_norm_ over all their parameters), one of them unscaled
// already: one total norm, each optimizer's grads written, each record
// kUnscaled; a bad gradient in the second refuses before the first is
// written.
TEST(GradScaler, JointClipOverTwoOptimizersIsTorchsRecipe) {
  auto ours = small_params(), theirs = small_params();
  torchext::optim::ASGD a({ours[0]}, torchext::optim::ASGDOptions(0.05).t0(2));
  torch::optim::SGD b({ours[1]}, torch::optim::SGDOptions(0.05));
  torchext::optim::ASGD ra({theirs[0]}, torchext::optim::ASGDOptions(0.05).t0(2));
  torch::optim::SGD rb({theirs[1]}, torch::optim::SGDOptions(0.05));
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  scaler.scale(small_loss(ours, 3)).backward();
  const auto scale = scaler.scale_tensor().clone();
  (small_loss(theirs, 3) * scale).backward();
  const auto ga = ours[0].grad().clone();
  auto bad = ours[1].grad();
  ours[1].mutable_grad() = bad.to(torch::kInt);
  EXPECT_THROW_MSG(scaler.clip_grad_norm_({&a, &b}, 0.05), "dtype");
  EXPECT_TRUE(torch::equal(ours[0].grad(), ga));  // nothing written
  ours[1].mutable_grad() = bad;
  EXPECT_THROW_MSG(scaler.clip_grad_norm_({&a, &a}, 0.05), "listed twice");
  scaler.unscale_(b);
  const auto total = scaler.clip_grad_norm_({&a, &b}, 0.05);
  EXPECT_FALSE(torch_recipe_clip(theirs, scale, 0.05));
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_TRUE(close(ours[i].grad(), theirs[i].grad(), 1e-6)) << i;
  }
  EXPECT_TRUE(record_is_unscaled(scaler, a));
  EXPECT_TRUE(record_is_unscaled(scaler, b));
  scaler.step(a);
  scaler.step(b);
  scaler.update();
  ra.step();
  rb.step();
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(close(ours[i], theirs[i], 1e-6)) << i;
  EXPECT_GT(total.item<double>(), 0.05);  // clipping was active
}

// clip_and_step returns what the optimizer's step returned (undefined when
// skipped), and with a disabled scaler is the drop-in clip then step().
TEST(GradScaler, ClipAndStepReturnsWhatTheStepReturned) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const bool enabled : {true, false}) {
    SCOPED_TRACE(enabled ? "enabled" : "disabled");
    auto w = torch::ones({2}).requires_grad_();
    ReturningSGD opt({w}, torch::optim::SGDOptions(0.1));
    GradScaler scaler(GradScalerOptions().init_scale(4).enabled(enabled));
    std::vector<double> got;
    for (float x : {1.0f, inf, 1.0f}) {
      if (!enabled && x == inf) continue;
      opt.zero_grad();
      scaler.scale((w * x).sum()).backward();
      const auto r = scaler.clip_and_step(opt, 0.5);
      got.push_back(r.result.defined() ? r.result.item<double>() : -1.0);
      scaler.update();
    }
    EXPECT_EQ(got, enabled ? (std::vector<double>{1.0, -1.0, 2.0})
                           : (std::vector<double>{1.0, 2.0}));
  }
}

// Misuse and bad input: the clip refuses bad gradients before it writes or
// records anything, so the iteration goes on (update() then still finds no
// inf check recorded); a non-finite norm refused by error_if_nonfinite is
// refused as by torch's recipe, after its unscale_ (the inf check stands).
TEST(GradScalerBadInput, ClipRefusesAndRecordsNothing) {
  auto p = torch::ones({3}).requires_grad_();
  auto q = torch::ones({2}).requires_grad_();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p});
  groups.emplace_back(std::vector<torch::Tensor>{q});
  torchext::optim::ASGD opt(groups);
  GradScaler scaler(GradScalerOptions().init_scale(8));
  EXPECT_THROW_MSG(scaler.clip_grad_norm_(opt, 1.0), "scale(loss or outputs)");
  EXPECT_THROW_MSG(scaler.clip_and_step(opt, 1.0), "scale(loss or outputs)");
  scaler.scale((p.sum() + q.sum()) * 2).backward();
  const auto gp = p.grad().clone();
  // A bad gradient in the later group (all or nothing over groups).
  const std::vector<std::pair<torch::Tensor, const char*>> bad = {
      {torch::ones({2}, torch::kInt), "dtype"},
      {torch::ones({2}).to_sparse(), "sparse"},
      {torch::ones({2}, torch::kHalf), "FP16"},
  };
  for (const auto& [grad, msg] : bad) {
    SCOPED_TRACE(msg);
    q.mutable_grad() = grad;
    EXPECT_THROW_MSG(scaler.clip_grad_norm_(opt, 1.0), msg);
    EXPECT_THROW_MSG(scaler.clip_and_step(opt, 1.0), msg);
    EXPECT_TRUE(torch::equal(p.grad(), gp));
    EXPECT_TRUE(opt.state().empty());
    EXPECT_THROW_MSG(scaler.update(), "no inf checks were recorded");
  }
  q.mutable_grad() = torch::full({2}, 16.0);
  p.grad()[0] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW_MSG(scaler.clip_grad_norm_(opt, 1.0, 2.0, true), "non-finite");
  EXPECT_THROW_MSG(scaler.unscale_(opt), "already been called");  // its unscale stands
  // A second clip measures the grads as they are (unscaled, NaN), as torch's recipe.
  EXPECT_TRUE(scaler.clip_grad_norm_(opt, 1.0).isnan().item<bool>());
  EXPECT_TRUE(scaler.step(opt).defined() == false);
  EXPECT_THROW_MSG(scaler.clip_grad_norm_(opt, 1.0), "after step");
  EXPECT_THROW_MSG(scaler.clip_and_step(opt, 1.0), "already been called");
  scaler.update();
  EXPECT_EQ(scaler.num_skipped_steps(), 1);
  EXPECT_TRUE(opt.state().empty());  // the overflowed step was never taken
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

// fp16 gradients, Python's rule: refused by unscale_(), clip_grad_norm_(),
// clip_and_step() and
// the step of an optimizer torch would unscale first (ASGD without
// capturable), unless allow_fp16; stepped by one that skips on the device.
TEST(GradScaler, Fp16GradientsFollowPythonsRule) {
  for (const bool capturable : {false, true}) {
    for (const bool allow : {false, true}) {
      SCOPED_TRACE(std::string(capturable ? "capturable" : "plain") + (allow ? ", allow" : ""));
      auto w = torch::ones({4}, torch::kHalf).requires_grad_();
      torchext::optim::ASGD opt({w}, torchext::optim::ASGDOptions(0.1).capturable(capturable));
      GradScaler scaler(GradScalerOptions().init_scale(8).allow_fp16(allow));
      scaler.scale(w.to(torch::kFloat).pow(2).sum()).backward();
      if (!allow) {
        EXPECT_THROW_MSG(scaler.clip_grad_norm_(opt, 1.0), "Attempting to unscale FP16");
        EXPECT_THROW_MSG(scaler.clip_and_step(opt, 1.0), "Attempting to unscale FP16");
        EXPECT_THROW_MSG(scaler.unscale_(opt), "Attempting to unscale FP16");
      }
      if (allow || capturable) {
        scaler.step(opt);
        EXPECT_TRUE((w < 1).all().item<bool>());
      } else {
        EXPECT_THROW_MSG(scaler.step(opt), "Attempting to unscale FP16");
        EXPECT_TRUE((w == 1).all().item<bool>());
      }
    }
  }
}

// An optimizer with no gradient: a no-op step for one that skips on the
// device (torch's fused optimizers' answer), an error for any other (torch's
// plain ones': no inf checks were recorded).
TEST(GradScaler, AnOptimizerWithoutGradientsStepsAsTorch) {
  auto used = torch::ones({2}).requires_grad_();
  for (const bool capturable : {false, true}) {
    SCOPED_TRACE(capturable ? "capturable" : "plain");
    auto unused = torch::ones({2}).requires_grad_();
    torchext::optim::ASGD opt({unused}, torchext::optim::ASGDOptions(0.1).capturable(capturable));
    torch::optim::SGD main({used}, torch::optim::SGDOptions(0.1));
    GradScaler scaler(GradScalerOptions().init_scale(4));
    scaler.scale(used.pow(2).sum()).backward();
    if (capturable) {
      scaler.step(opt);
      EXPECT_TRUE(torch::equal(unused, torch::ones({2})));
    } else {
      EXPECT_THROW_MSG(scaler.step(opt), "no inf checks were recorded");
    }
    scaler.step(main);
    scaler.update();
    used.mutable_grad() = torch::Tensor();
  }
}

// The drop-in torchext::nn::utils::clip_grad_norm_ against LibTorch's own:
// the same signature and return, the same norm and clipped gradients within
// fp32 rounding (the norms are summed in another order), and all or nothing
// on gradients the op refuses, over devices too.
TEST(ClipGradNorm, DropInMatchesLibTorchs) {
  for (const double order : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(order);
    torch::manual_seed(3);
    std::vector<torch::Tensor> ours, theirs;
    for (const auto& shape : std::vector<std::vector<int64_t>>{{7}, {30, 50}, {5, 4}}) {
      ours.push_back(torch::randn(shape).requires_grad_());
      ours.back().mutable_grad() = 3 * torch::randn(shape);
      theirs.push_back(ours.back().detach().clone().requires_grad_());
      theirs.back().mutable_grad() = ours.back().grad().clone();
    }
    const double got = torchext::nn::utils::clip_grad_norm_(ours, 1.0, order);
    const double want = torch::nn::utils::clip_grad_norm_(theirs, 1.0, order);
    ASSERT_GT(want, 1.0);  // clipping active
    EXPECT_NEAR(got, want, 1e-6 * want);
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_TRUE(close(ours[i].grad(), theirs[i].grad(), 1e-6)) << i;
    }
  }
  auto w = torch::ones({2}).requires_grad_();
  EXPECT_EQ(torchext::nn::utils::clip_grad_norm_(w, 1.0), 0.0);  // no gradient
  w.mutable_grad() = torch::full({2}, 3.0f);
  EXPECT_NEAR(torchext::nn::utils::clip_grad_norm_({w}, 1.0, 1.0), 6.0, 1e-6);
  EXPECT_TRUE(close(w.grad(), torch::full({2}, 0.5f), 1e-6));
  w.grad()[0] = std::numeric_limits<float>::infinity();
  const auto g = w.grad().clone();
  EXPECT_THROW_MSG(torchext::nn::utils::clip_grad_norm_(w, 1.0, 2.0, true), "non-finite");
  EXPECT_TRUE(torch::equal(w.grad(), g));
  // A bad gradient on another device (meta: validated, never read).
  w.mutable_grad() = torch::full({2}, 3.0f);
  auto m = torch::ones({2}, torch::kMeta).requires_grad_();
  m.mutable_grad() = torch::ones({2}, torch::TensorOptions().dtype(torch::kInt).device(torch::kMeta));
  EXPECT_THROW_MSG(torchext::nn::utils::clip_grad_norm_({w, m}, 1.0), "dtype");
  EXPECT_TRUE(torch::equal(w.grad(), torch::full({2}, 3.0f)));
}

// (GPU only: its own ctest, grad_scaler_cuda, so that its skip hides no
// other test.) Two devices whose found_inf is summed: a step that skips on the device
// gets it clamped to 1 (torch's fused kernels skip only when found_inf == 1),
// as Python's scaler does. GPU only (CPU and CUDA parameters).
TEST(GradScalerCuda, FoundInfOfTwoDevicesIsClampedForADeviceSkip) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "")
           .hasKernelForDispatchKey(c10::DispatchKey::CUDA)) {
    GTEST_SKIP() << "torchext was built without CUDA kernels (TORCHEXT_CUDA=OFF)";
  }
  auto a = torch::ones({3}).requires_grad_();
  auto b = torch::ones({3}, torch::kCUDA).requires_grad_();
  struct Seen : torchext::optim::ASGD {
    using ASGD::ASGD;
    torch::Tensor found;
    torch::Tensor step_with_amp(const torch::Tensor& g, const torch::Tensor& f,
                                const torch::Tensor& c) override {
      found = f.clone();
      return ASGD::step_with_amp(g, f, c);
    }
  } opt({a, b}, torchext::optim::ASGDOptions(0.1).capturable(true));
  GradScaler scaler(GradScalerOptions().init_scale(4));
  scaler.scale((a.sum() + b.sum().cpu()) * std::numeric_limits<float>::infinity()).backward();
  scaler.step(opt);  // both devices overflow: 1 + 1, clamped
  ASSERT_TRUE(opt.found.defined());
  EXPECT_EQ(opt.found.item<float>(), 1.0f);
  EXPECT_TRUE(torch::equal(a, torch::ones({3})));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);
}

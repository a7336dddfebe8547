// Round trips: a TorchScript training step scripted in Python and run in C++,
// an AOTInductor package of the functional ASGD step, and a checkpoint saved
// by one process and resumed by another.
#include "common.h"

#include <torchext/torchext.h>
#include <torchext/version.h>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <ATen/Version.h>
#include <torch/script.h>

#include <sys/stat.h>

using namespace torchext_test;

TEST(Library, OpsAreRegistered) {
  EXPECT_TRUE(torchext::ops_registered());
  EXPECT_STREQ(torchext::version(), TORCHEXT_VERSION);  // version.h, from version.txt
  std::ifstream in(TORCHEXT_SOURCE_DIR "/version.txt");
  std::string from_file;
  in >> from_file;
  EXPECT_EQ(from_file, torchext::version());
}

// The scaler's state-dict version has one home (state_dict_version.h): what
// the library exports for Python and what the C++ GradScaler writes.
TEST(Library, ScalerStateDictVersionIsOneNumber) {
  EXPECT_EQ(torchext_scaler_state_dict_version(), torchext::amp::kStateDictVersion);
  torchext::amp::GradScaler scaler;
  const auto sd = scaler.state_dict();
  EXPECT_EQ(sd.at("_torchext_version").toInt(), torchext::amp::kStateDictVersion);
}

// ctest also runs this with ATEN_CPU_CAPABILITY=default (cpu_isa_default).
TEST(Library, CpuKernelsFollowATensIsa) {
  const std::string isa = torchext::cpu_isa(), aten = at::get_cpu_capability();
  if (aten == "DEFAULT") {
    EXPECT_EQ(isa, "DEFAULT");
  } else if (aten == "AVX2") {
    EXPECT_TRUE(isa == "AVX2" || isa == "DEFAULT") << isa;  // DEFAULT: AVX2 not built
  } else {
    EXPECT_TRUE(isa == aten || isa == "AVX2" || isa == "DEFAULT") << isa << " vs " << aten;
  }
  const char* forced = std::getenv("ATEN_CPU_CAPABILITY");
  if (forced != nullptr && std::string(forced) == "default") EXPECT_EQ(isa, "DEFAULT");
}

TEST(TorchScript, TrainingStepScriptedInPythonMatches) {
  const auto ref = load_ref("ts_ref.pt");
  torch::jit::Module module = torch::jit::load(ref_path("train_step.pt"));
  const auto xs = R(ref, "xs"), ys = R(ref, "ys"), losses = R(ref, "losses");
  for (int64_t s = 0; s < xs.size(0); ++s) {
    auto out = module.get_method("train_step")({xs[s], ys[s]}).toTuple();
    EXPECT_TRUE(close(out->elements()[0].toTensor(), losses[s])) << "loss at step " << s;
  }
  int compared = 0;
  auto check = [&](const std::string& name, const torch::Tensor& t) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(close(t, R(ref, "final/" + name)));
    ++compared;
  };
  for (const auto& p : module.named_parameters()) check(p.name, p.value);
  for (const auto& b : module.named_buffers()) check(b.name, b.value);
  EXPECT_EQ(compared, 15);  // 2 params, 8 state buffers, 4 scaler buffers, lr
  // The overflow at step 10 was skipped and backed the scale off.
  EXPECT_EQ(module.attr("step_weight").toTensor().item<float>(), xs.size(0) - 1);
}

TEST(AOTInductor, FunctionalASGDPackageMatches) {
  // make_reference.py fails outright when the package cannot be built.
  ASSERT_TRUE(file_exists(ref_path("asgd_step.pt2")))
      << "no AOTInductor package: run cpp_tests/make_reference.py without --no-aoti";
  const auto ref = load_ref("aoti_ref.pt");
  torch::inductor::AOTIModelPackageLoader loader(ref_path("asgd_step.pt2"));
  auto p = R(ref, "p0").clone(), ax = R(ref, "ax0").clone(), mu = R(ref, "mu0").clone(),
       eta = R(ref, "eta0").clone(), step = R(ref, "step0").clone();
  const auto grads = R(ref, "grads");
  for (int64_t s = 0; s < grads.size(0); ++s) {
    auto out = loader.run({p, grads[s].contiguous(), ax, mu, eta, step});
    ASSERT_EQ(out.size(), 5u);
    p = out[0], ax = out[1], mu = out[2], eta = out[3], step = out[4];
  }
  EXPECT_TRUE(close(p, R(ref, "p")));
  EXPECT_TRUE(close(ax, R(ref, "ax")));
  EXPECT_TRUE(close(mu, R(ref, "mu")));
  EXPECT_TRUE(close(eta, R(ref, "eta")));
  EXPECT_EQ(step.item<float>(), R(ref, "step").item<float>());
}

// ---- a checkpoint written by one process, resumed by another -------------
// ctest runs Checkpoint.Save, then Checkpoint.Resume in a second process.

namespace {

struct TrainRun {
  torch::nn::Sequential model{torch::nn::Linear(6, 5), torch::nn::Tanh(), torch::nn::Linear(5, 1)};
  std::unique_ptr<torchext::optim::ASGD> opt;
  torchext::amp::GradScaler scaler{
      torchext::amp::GradScalerOptions().init_scale(512).growth_interval(3).hysteresis(2)};

  explicit TrainRun(int64_t seed) {
    torch::manual_seed(seed);
    model = torch::nn::Sequential(torch::nn::Linear(6, 5), torch::nn::Tanh(),
                                  torch::nn::Linear(5, 1));
    auto params = model->parameters();
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>(params.begin(), params.begin() + 2));
    groups.emplace_back(std::vector<torch::Tensor>(params.begin() + 2, params.end()),
                        std::make_unique<torchext::optim::ASGDOptions>(
                            torchext::optim::ASGDOptions(0.02).t0(4).weight_decay(1e-3)));
    opt = std::make_unique<torchext::optim::ASGD>(groups, torchext::optim::ASGDOptions(0.05).t0(2));
  }
  void step(int64_t s) {
    torch::manual_seed(10'000 + s);  // the data depends on the step only
    auto x = torch::randn({8, 6});
    auto y = torch::randn({8, 1});
    if (s % 7 == 5) x[0][0] = std::numeric_limits<float>::infinity();
    opt->zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
  }
  std::vector<torch::Tensor> params() const {
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
    return out;
  }
};

std::string ckpt(const std::string& name) {
  const std::string dir = ref_path("checkpoint");
  ::mkdir(dir.c_str(), 0755);
  return dir + "/" + name;
}

constexpr int64_t kHalf = 12;

}  // namespace

TEST(Checkpoint, Save) {
  TrainRun run(5);
  for (int64_t s = 0; s < kHalf; ++s) run.step(s);
  torch::save(run.model, ckpt("model.pt"));
  torch::save(*run.opt, ckpt("optimizer.pt"));
  torch::save(run.scaler, ckpt("scaler.pt"));
  for (int64_t s = kHalf; s < 2 * kHalf; ++s) run.step(s);
  auto final_params = run.params();
  torch::save(final_params, ckpt("expected_params.pt"));
  std::vector<torch::Tensor> scaler_info = {
      torch::full({}, run.scaler.get_scale(), torch::kDouble),
      torch::full({}, run.scaler.num_skipped_steps(), torch::kLong)};
  torch::save(scaler_info, ckpt("expected_scaler.pt"));
}

TEST(Checkpoint, Resume) {
  if (!file_exists(ckpt("expected_params.pt"))) {
    GTEST_SKIP() << "run Checkpoint.Save first (ctest does, in another process)";
  }
  TrainRun run(77);  // other initial values: everything must come from the files
  torch::load(run.model, ckpt("model.pt"));
  torch::load(*run.opt, ckpt("optimizer.pt"));
  torch::load(run.scaler, ckpt("scaler.pt"));
  for (int64_t s = kHalf; s < 2 * kHalf; ++s) run.step(s);
  std::vector<torch::Tensor> expected, expected_scaler;
  torch::load(expected, ckpt("expected_params.pt"));
  torch::load(expected_scaler, ckpt("expected_scaler.pt"));
  const auto got = run.params();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i], expected[i])) << "param " << i;
  }
  EXPECT_EQ(run.scaler.get_scale(), expected_scaler[0].item<double>());
  EXPECT_EQ(run.scaler.num_skipped_steps(), expected_scaler[1].item<int64_t>());
  EXPECT_GT(run.scaler.num_skipped_steps(), 0);
}

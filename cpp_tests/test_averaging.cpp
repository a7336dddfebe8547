// The C++ averaged-weights API: AveragedParameters (RAII swap with ax) and
// ASGD::start_averaging, checked against float64 means of recorded iterates
// and bit-exact restores.
#include "common.h"

#include <torchext/torchext.h>

#include <vector>

namespace {

struct Net {
  int seeded = (torch::manual_seed(0), 0);  // before the members below are built
  torch::nn::Sequential model{torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 2)};
  torch::Tensor x = torch::randn({16, 4}), y = torch::randn({16, 2});
  void step(torchext::optim::ASGD& opt) {
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
};

std::vector<torch::Tensor> snapshot(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (const auto& t : ts) out.push_back(t.detach().clone());
  return out;
}

torch::Tensor ax_of(torchext::optim::ASGD& opt, const torch::Tensor& p) {
  return static_cast<torchext::optim::ASGDParamState&>(*opt.state().at(p.unsafeGetTensorImpl()))
      .ax();
}

}  // namespace

TEST(Averaging, GuardEvaluatesWithAveragesAndRestoresBitForBit) {
  Net s;
  torchext::optim::ASGD opt(s.model->parameters(),
                            torchext::optim::ASGDOptions(0.05).t0(0).lambd(1e-3));
  for (int i = 0; i < 5; ++i) s.step(opt);
  const auto params = s.model->parameters();
  const auto before = snapshot(params);
  std::vector<torch::Tensor> axs;
  std::vector<void*> ptrs;
  for (const auto& p : params) {
    axs.push_back(ax_of(opt, p).clone());
    ptrs.push_back(p.data_ptr());
  }
  // The averaged model's output, computed from copies of the averages.
  torch::nn::Sequential avg_copy{torch::nn::Linear(4, 8), torch::nn::Tanh(),
                                 torch::nn::Linear(8, 2)};
  {
    torch::NoGradGuard no_grad;
    auto cp = avg_copy->parameters();
    for (size_t i = 0; i < cp.size(); ++i) cp[i].copy_(axs[i]);
  }
  const auto want = avg_copy->forward(s.x).detach();
  {
    auto guard = opt.averaged_parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i], axs[i]));
      EXPECT_TRUE(torch::equal(ax_of(opt, params[i]), before[i]));
      EXPECT_EQ(params[i].data_ptr(), ptrs[i]);
    }
    EXPECT_TRUE(torch::equal(s.model->forward(s.x).detach(), want));
    EXPECT_THROW_MSG(opt.step(), "hold their averages");
    EXPECT_THROW_MSG({ auto nested = opt.averaged_parameters(); }, "nested");
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], axs[i]));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i], before[i]));
    EXPECT_TRUE(torch::equal(ax_of(opt, params[i]), axs[i]));
  }
  s.step(opt);  // allowed again
}

TEST(Averaging, StartAveragingGivesTheMeanOfTheNextIterates) {
  Net s;
  torchext::optim::ASGD opt(s.model->parameters(),
                            torchext::optim::ASGDOptions(0.05).t0(2).lambd(1e-3));
  for (int i = 0; i < 6; ++i) s.step(opt);
  opt.start_averaging();
  EXPECT_EQ(static_cast<torchext::optim::ASGDOptions&>(opt.param_groups()[0].options()).t0(), 5.0);
  const auto params = s.model->parameters();
  std::vector<torch::Tensor> sums;
  for (const auto& p : params) sums.push_back(torch::zeros_like(p, torch::kDouble));
  const int m = 7;
  for (int i = 0; i < m; ++i) {
    s.step(opt);
    for (size_t k = 0; k < params.size(); ++k) sums[k] += params[k].detach().to(torch::kDouble);
  }
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_TRUE(torchext_test::close(ax_of(opt, params[k]), sums[k] / m, 1e-6, 1e-7));
  }
}

// All or nothing across devices, as Python's averaged_parameters: a meta
// parameter (a second device on a CPU-only machine) whose 'ax' swap_ refuses
// (another dtype) comes after a CPU one that swap_ accepts; the guard throws
// and every parameter and 'ax' holds what it held before.
TEST(Averaging, RefusedSecondDeviceLeavesEveryParameterUnchanged) {
  auto cpu = torch::randn({3}).requires_grad_();
  auto meta = torch::empty({3}, torch::kMeta).requires_grad_();
  torchext::optim::ASGD opt({cpu, meta}, torchext::optim::ASGDOptions(0.25).t0(0));
  for (int i = 0; i < 3; ++i) {
    cpu.mutable_grad() = torch::randn({3});
    meta.mutable_grad() = torch::empty({3}, torch::kMeta);
    opt.step();
  }
  auto& meta_state =
      static_cast<torchext::optim::ASGDParamState&>(*opt.state().at(meta.unsafeGetTensorImpl()));
  const auto bad_ax = torch::empty({3}, torch::TensorOptions(torch::kMeta).dtype(torch::kDouble));
  meta_state.ax(bad_ax);
  const auto cpu_before = cpu.detach().clone();
  const auto cpu_ax_before = ax_of(opt, cpu).clone();
  ASSERT_FALSE(torch::equal(cpu_before, cpu_ax_before));  // a swap would show
  EXPECT_THROW_MSG({ auto guard = opt.averaged_parameters(); }, "dtype");
  EXPECT_TRUE(torch::equal(cpu, cpu_before));
  EXPECT_TRUE(torch::equal(ax_of(opt, cpu), cpu_ax_before));
  EXPECT_TRUE(ax_of(opt, meta).is_same(bad_ax));
  // The optimizer is not left marked as averaging: it steps again.
  cpu.mutable_grad() = torch::randn({3});
  meta.mutable_grad() = torch::empty({3}, torch::kMeta);
  meta_state.ax(torch::empty({3}, torch::kMeta));
  EXPECT_NO_THROW(opt.step());
}

// A save while a guard holds the averages in the parameters would store the
// training weights as ax: refused, as Python's state_dict() refuses it.
TEST(Averaging, SaveUnderTheGuardIsRefused) {
  auto w = torch::ones({3}).requires_grad_();
  torchext::optim::ASGD opt({w}, torchext::optim::ASGDOptions(0.1).t0(0));
  for (int i = 0; i < 3; ++i) {
    w.mutable_grad() = torch::full({3}, static_cast<float>(i + 1));
    opt.step();
  }
  {
    auto guard = opt.averaged_parameters();
    std::stringstream out;
    EXPECT_THROW_MSG(torch::save(opt, out), "AveragedParameters guard is alive");
    EXPECT_THROW_MSG(torchext::save_state_dict(opt, "/tmp/never_written.pt"),
                     "AveragedParameters guard is alive");
  }
  std::stringstream out;
  torch::save(opt, out);  // after the guard: fine
}

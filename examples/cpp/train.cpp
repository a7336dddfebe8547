// A small training program: a linear regression trained with
// torchext::optim::ASGD under torchext::amp::GradScaler, with two parameter
// groups, an injected overflow (the step is skipped on the device) and a
// checkpoint round trip. Exits non-zero if training did not work.
//
//   train_example [steps]
#include <torchext/torchext.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <limits>

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  torch::manual_seed(0);

  // Data: y = x @ w_true + b_true + noise.
  const auto x = torch::randn({256, 8});
  const auto w_true = torch::randn({8, 1});
  const auto y = x.mm(w_true) + 0.5 + 0.01 * torch::randn({256, 1});

  torch::nn::Linear model(8, 1);
  // Weights and bias in separate groups, with their own options.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{model->weight});
  groups.emplace_back(std::vector<torch::Tensor>{model->bias},
                      std::make_unique<torchext::optim::ASGDOptions>(
                          torchext::optim::ASGDOptions(0.05).t0(50)));
  torchext::optim::ASGD optimizer(groups, torchext::optim::ASGDOptions(0.05).lambd(1e-4).t0(50));
  torchext::amp::GradScaler scaler(
      torchext::amp::GradScalerOptions().init_scale(1024.0).growth_interval(20));

  auto loss_fn = [&] { return torch::mse_loss(model->forward(x), y); };
  const double first_loss = loss_fn().item<double>();
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    auto loss = loss_fn();
    if (step == steps / 2) {
      loss = loss * std::numeric_limits<float>::infinity();  // an overflow
    }
    scaler.scale(loss).backward();
    scaler.step(optimizer);  // skipped on the device when grads overflowed
    scaler.update();
  }
  const double last_loss = loss_fn().item<double>();

  // Checkpoint round trip through torch::save / torch::load.
  const std::string path = "train_example_optimizer.pt";
  torch::save(optimizer, path);
  torchext::optim::ASGD restored(groups, torchext::optim::ASGDOptions(0.05));
  torch::load(restored, path);
  std::remove(path.c_str());
  const auto& st = static_cast<torchext::optim::ASGDParamState&>(
      *restored.state().at(model->weight.unsafeGetTensorImpl()));

  std::printf("loss %.6f -> %.6f, scale %.1f, skipped steps %lld, restored step %.0f\n",
              first_loss, last_loss, scaler.get_scale(),
              static_cast<long long>(scaler.num_skipped_steps()), st.step().item<double>());
  const bool ok = last_loss < 0.1 * first_loss && scaler.num_skipped_steps() == 1 &&
                  st.step().item<double>() == steps - 1;
  std::puts(ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}

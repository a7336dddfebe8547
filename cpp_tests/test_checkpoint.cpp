// Python-format checkpoints (torchext::save_state_dict/load_state_dict):
// files written by Python's torch.save(x.state_dict()) in make_reference.py
// are loaded here and training continues; the result must equal the run that
// stayed in Python. What C++ saves is checked back in Python by
// resume_in_python.py (ctest runs it after these tests). Also the tensor lr.
#include "common.h"

#include <torchext/torchext.h>

#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>

using torchext::optim::ASGD;
using torchext::optim::ASGDOptions;
using torchext::optim::ASGDParamState;
using torch::optim::OptimizerParamGroup;
using namespace torchext_test;

namespace {

using Ref = std::map<std::string, torch::Tensor>;

std::string idx(const std::string& key, size_t i) { return key + std::to_string(i); }

// Tensors for Python: a dict that torch.load(path, weights_only=True) reads.
void save_tensors(const std::vector<torch::Tensor>& ts, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> d;
  for (size_t i = 0; i < ts.size(); ++i) d.insert(idx("param", i), ts[i].detach().clone());
  const auto bytes = torch::jit::pickle_save(d);
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The params from `key`{0,1,2}, in the two groups of make_reference.py's
// CKPT_GROUPS, but with other options: the loaded file must set them.
struct Problem {
  std::vector<torch::Tensor> params;
  std::unique_ptr<ASGD> opt;
  Problem(const Ref& ref, const std::string& key, ASGDOptions o0 = ASGDOptions(0.5),
          ASGDOptions o1 = ASGDOptions(0.25)) {
    for (size_t i = 0; i < 3; ++i) params.push_back(R(ref, idx(key, i)).clone().requires_grad_());
    std::vector<OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]},
                        std::make_unique<ASGDOptions>(o0));
    groups.emplace_back(std::vector<torch::Tensor>{params[2]}, std::make_unique<ASGDOptions>(o1));
    opt = std::make_unique<ASGD>(groups);
  }
  void run(const Ref& ref, int64_t start, int64_t stop, const std::function<void()>& after = {}) {
    for (int64_t s = start; s < stop; ++s) {
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = R(ref, idx("grads", i))[s].clone();
      }
      opt->step();
      if (after) after();
    }
  }
  const ASGDParamState& state(size_t i) const {
    return static_cast<const ASGDParamState&>(*opt->state().at(params[i].unsafeGetTensorImpl()));
  }
};

// Everything an optimizer holds, to compare before/after a rejected load.
std::vector<torch::Tensor> snapshot(const Problem& pb) {
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < pb.params.size(); ++i) {
    out.push_back(pb.params[i].detach().clone());
    auto it = pb.opt->state().find(pb.params[i].unsafeGetTensorImpl());
    if (it == pb.opt->state().end()) {
      out.push_back(torch::full({}, -1.0));  // "no state"
      continue;
    }
    const auto& st = static_cast<const ASGDParamState&>(*it->second);
    for (const auto& t : {st.step(), st.eta(), st.mu(), st.ax()}) out.push_back(t.clone());
  }
  for (const auto& g : pb.opt->param_groups()) {
    const auto& o = static_cast<const ASGDOptions&>(g.options());
    out.push_back(torch::tensor({o.lr(), o.lambd(), o.alpha(), o.t0(), o.weight_decay(),
                                 static_cast<double>(o.maximize())},
                                torch::kDouble));
  }
  return out;
}

void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "entry " << i;
}

// The full state of params after the steps, against Python's `prefix` run.
void expect_state(const Problem& pb, const Ref& ref, const std::string& prefix, bool exact) {
  for (size_t i = 0; i < pb.params.size(); ++i) {
    SCOPED_TRACE("param " + std::to_string(i));
    const auto& st = pb.state(i);
    const std::vector<std::pair<std::string, torch::Tensor>> got = {
        {"param", pb.params[i].detach()}, {"step", st.step()}, {"eta", st.eta()},
        {"mu", st.mu()}, {"ax", st.ax()}};
    for (const auto& [key, t] : got) {
      const auto& want = R(ref, prefix + idx(key, i));
      if (exact) {
        EXPECT_TRUE(torch::equal(t, want)) << key << ": " << t << " vs " << want;
      } else {
        EXPECT_TRUE(close(t, want)) << key;
      }
    }
  }
}

}  // namespace

// Python (torchext.optim.ASGD) -> C++ -> (resume_in_python.py) Python, two
// groups with different options, fp32 and fp64: bit for bit on CPU.
TEST(PythonCheckpoint, ContinuesTorchextRunBitForBit) {
  for (const std::string dtype : {"float32", "float64"}) {
    SCOPED_TRACE(dtype);
    const auto ref = load_ref("ckpt_ref_" + dtype + ".pt");
    Problem pb(ref, "py_param");
    torchext::load_state_dict(*pb.opt, ref_path("ckpt_py_" + dtype + ".pt"));
    const auto& o1 = static_cast<const ASGDOptions&>(pb.opt->param_groups()[1].options());
    EXPECT_EQ(o1.lr(), 0.01);
    EXPECT_EQ(o1.alpha(), 0.6);
    EXPECT_TRUE(o1.maximize());
    const int64_t start = R(ref, "py_steps").item<int64_t>();
    pb.run(ref, start, start + R(ref, "cpp_steps").item<int64_t>());
    expect_state(pb, ref, "mid_", /*exact=*/true);
    torchext::save_state_dict(*pb.opt, ref_path("ckpt_cpp_" + dtype + ".pt"));
    save_tensors(pb.params, ref_path("ckpt_cpp_params_" + dtype + ".pt"));
  }
}

// torch.optim.ASGD's checkpoint (with param_names), and the old format with
// float step/eta/mu: C++ continues torch's run (its for-loop path is another
// kernel: ~1e-6).
TEST(PythonCheckpoint, LoadsTorchOptimASGDCheckpoints) {
  const auto ref = load_ref("ckpt_torch_ref.pt");
  for (const std::string file : {"ckpt_torch.pt", "ckpt_torch_legacy.pt"}) {
    SCOPED_TRACE(file);
    Problem pb(ref, "py_param");
    torchext::load_state_dict(*pb.opt, ref_path(file));
    EXPECT_EQ(pb.state(0).step().scalar_type(), torch::kFloat);
    EXPECT_EQ(pb.state(0).step().dim(), 0);
    pb.run(ref, 6, 11);
    expect_state(pb, ref, "mid_", /*exact=*/false);
  }
}

TEST(PythonCheckpoint, ScalerAndOptimizerContinueWithOverflowsOnBothSides) {
  const auto ref = load_ref("ckpt_scaler_ref.pt");
  auto w = R(ref, "py_w").clone().requires_grad_();
  ASGD opt({w}, ASGDOptions(0.9));  // options come from the file
  torchext::amp::GradScaler scaler(torchext::amp::GradScalerOptions().init_scale(3.0));
  torchext::load_state_dict(opt, ref_path("ckpt_scaler_opt_py.pt"));
  torchext::load_state_dict(scaler, ref_path("ckpt_scaler_py.pt"));
  EXPECT_EQ(scaler.options().growth_interval(), 2);
  const int64_t skipped_before = scaler.num_skipped_steps();
  EXPECT_GT(skipped_before, 0);  // overflows in the Python part
  const auto xs = R(ref, "xs");
  for (int64_t s = 6; s < 11; ++s) {
    opt.zero_grad();
    auto loss = 0.5 * (w * xs[s]).pow(2).sum();
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  }
  EXPECT_GT(scaler.num_skipped_steps(), skipped_before);  // and in the C++ part
  EXPECT_TRUE(torch::equal(w.detach(), R(ref, "mid_w")));
  EXPECT_EQ(scaler.get_scale(), R(ref, "mid_scale").item<double>());
  EXPECT_EQ(scaler.get_growth_tracker(), R(ref, "mid_growth_tracker").item<int64_t>());
  EXPECT_EQ(scaler.num_skipped_steps(), R(ref, "mid_skipped").item<int64_t>());
  torchext::save_state_dict(scaler, ref_path("ckpt_scaler_cpp.pt"));
  torchext::save_state_dict(opt, ref_path("ckpt_scaler_opt_cpp.pt"));
  save_tensors({w}, ref_path("ckpt_scaler_w_cpp.pt"));
}

TEST(PythonCheckpointBadFile, NothingChanges) {
  const auto ref = load_ref("ckpt_ref_float32.pt");
  Problem pb(ref, "py_param");
  pb.run(ref, 0, 2);  // some state to keep
  const auto before = snapshot(pb);
  // A truncated copy of a good file.
  const std::string good = ref_path("ckpt_py_float32.pt"), cut = ref_path("ckpt_truncated.pt");
  {
    std::ifstream in(good, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(cut, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() / 2));
  }
  EXPECT_THROW_MSG(torchext::load_state_dict(*pb.opt, cut), "not a readable torch.save file");
  EXPECT_THROW_MSG(torchext::load_state_dict(*pb.opt, ref_path("no_such_file.pt")),
                   "cannot open");
  EXPECT_THROW_MSG(torchext::load_state_dict(*pb.opt, ref_path("ckpt_sgd.pt")),
                   "parameter groups");  // SGD: one group
  EXPECT_THROW_MSG(torchext::load_state_dict(*pb.opt, ref_path("ckpt_wrong_shape.pt")),
                   "['ax'] has shape [3, 4] but the parameter has shape [4, 3]");
  EXPECT_THROW_MSG(torchext::load_state_dict(*pb.opt, ref_path("ckpt_scaler_py.pt")),
                   "has no 'param_groups'");
  expect_same(snapshot(pb), before);
  // Another optimizer's state with matching groups: SGD's keys.
  auto w = torch::zeros({4, 3}).requires_grad_();
  ASGD one({w});
  w.mutable_grad() = torch::ones({4, 3});
  one.step();
  const auto& st = static_cast<const ASGDParamState&>(*one.state().at(w.unsafeGetTensorImpl()));
  const auto step_before = st.step().clone();
  EXPECT_THROW_MSG(torchext::load_state_dict(one, ref_path("ckpt_sgd.pt")), "has no 'lambd'");
  EXPECT_TRUE(torch::equal(st.step(), step_before));
  // The scaler: an optimizer file is not a scaler's.
  torchext::amp::GradScaler scaler;
  EXPECT_THROW_MSG(torchext::load_state_dict(scaler, good), "has no 'scale'");
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  std::remove(cut.c_str());
}

// A 0-d tensor lr changed in place after every step (no host sync): same
// numbers as Python's torchext.optim.ASGD with the same tensor schedule, and
// it round-trips through the Python-format checkpoint as a tensor.
TEST(TensorLr, FollowsAnInPlaceScheduleLikePython) {
  const auto ref = load_ref("tensor_lr_ref.pt");
  auto lr = torch::tensor(0.05f);
  Problem pb(ref, "init", ASGDOptions(lr).lambd(1e-3).t0(3.0).weight_decay(1e-2),
             ASGDOptions(lr).lambd(1e-2).alpha(0.6).t0(0.0).maximize(true));
  const int64_t steps = R(ref, "grads0").size(0);
  pb.run(ref, 0, steps, [&] { lr.mul_(0.9); });
  expect_state(pb, ref, "end_", /*exact=*/true);
  EXPECT_TRUE(torch::equal(lr, R(ref, "lr")));
  // Through a checkpoint: still a tensor lr with the current value.
  const std::string path = ref_path("ckpt_tensor_lr_cpp.pt");
  torchext::save_state_dict(*pb.opt, path);
  Problem other(ref, "init");
  torchext::load_state_dict(*other.opt, path);
  const auto& o = static_cast<const ASGDOptions&>(other.opt->param_groups()[0].options());
  ASSERT_TRUE(o.has_tensor_lr());
  EXPECT_TRUE(torch::equal(o.lr_tensor(), lr));
  // set_lr (what torch's C++ LR schedulers call) writes into the tensor.
  other.opt->param_groups()[0].options().set_lr(0.5);
  EXPECT_EQ(o.lr_tensor().item<float>(), 0.5f);
}

// Python-format checkpoints (torchext::save_state_dict/load_state_dict):
// files written by Python's torch.save(x.state_dict()) in make_reference.py
// are loaded here and training continues; the result must equal the run that
// stayed in Python. What C++ saves is checked back in Python by
// resume_in_python.py (ctest runs it after these tests). Also the tensor lr.
#include "common.h"

#include <torchext/torchext.h>

#include <torch/csrc/jit/serialization/pickle.h>

#include <cstdio>
#include <functional>
#include <sstream>
#include <tuple>

using torchext::optim::ASGD;
using torchext::optim::ASGDOptions;
using torchext::optim::ASGDParamState;
using torch::optim::OptimizerParamGroup;
using namespace torchext_test;

namespace {

using Ref = std::map<std::string, torch::Tensor>;

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

// Everything an optimizer holds (params, every state tensor with its dtype
// and device, every option of every group), to compare before/after a
// rejected load.
std::vector<torch::Tensor> snapshot(const ASGD& opt, const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    out.push_back(p.detach().clone());
    auto it = opt.state().find(p.unsafeGetTensorImpl());
    if (it == opt.state().end()) {
      out.push_back(torch::full({}, -1.0));  // "no state"
      continue;
    }
    const auto& st = static_cast<const ASGDParamState&>(*it->second);
    for (const auto& t : {st.step(), st.eta(), st.mu(), st.ax()}) out.push_back(t.clone());
  }
  for (const auto& g : opt.param_groups()) {
    const auto& o = static_cast<const ASGDOptions&>(g.options());
    out.push_back(torch::tensor({o.lr(), o.lambd(), o.alpha(), o.t0(), o.weight_decay(),
                                 static_cast<double>(o.maximize()),
                                 static_cast<double>(o.capturable()),
                                 o.fused().has_value() ? static_cast<double>(*o.fused()) : -1.0,
                                 o.average_dtype().has_value()
                                     ? static_cast<double>(*o.average_dtype()) : -1.0,
                                 static_cast<double>(o.stochastic_rounding()),
                                 static_cast<double>(g.params().size())},
                                torch::kDouble));
    out.push_back(torch::tensor(o.rounding_seed(), torch::kLong));
    out.push_back(torch::tensor(o.t0_per_param(), torch::kDouble));
    out.push_back(o.has_tensor_lr() ? o.lr_tensor().clone() : torch::full({}, -1.0));
  }
  return out;
}
std::vector<torch::Tensor> snapshot(const Problem& pb) { return snapshot(*pb.opt, pb.params); }

// Same values, dtypes and devices.
void expect_same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].scalar_type() == b[i].scalar_type() && a[i].device() == b[i].device() &&
                torch::equal(a[i], b[i]))
        << "entry " << i << ": " << a[i] << " vs " << b[i];
  }
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
                   "must have a 'state' dict");
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

// ---- t0_per_param: start_averaging with params at different step counts ----

namespace {

// make_reference.py's t0pp_steps: param 1 has no grad at no_grad_steps;
// averaging restarts after average_at steps.
void t0pp_run(Problem& pb, const Ref& ref, int64_t start, int64_t stop) {
  const auto no_grad = R(ref, "no_grad_steps");
  const int64_t average_at = R(ref, "average_at").item<int64_t>();
  for (int64_t s = start; s < stop; ++s) {
    for (size_t i = 0; i < pb.params.size(); ++i) {
      const bool none = i == 1 && (no_grad == s).any().item<bool>();
      pb.params[i].mutable_grad() = none ? torch::Tensor() : R(ref, idx("grads", i))[s].clone();
    }
    pb.opt->step();
    if (s + 1 == average_at) pb.opt->start_averaging();
  }
}

const ASGDOptions& group_options(const ASGD& opt, size_t g) {
  return static_cast<const ASGDOptions&>(opt.param_groups()[g].options());
}

}  // namespace

// A Python checkpoint whose group holds t0_per_param continues in C++
// exactly as in Python (each param averaged from its own t0), and C++ saves
// it back (resume_in_python.py finishes the run in Python).
TEST(PythonCheckpoint, T0PerParamContinuesBitForBit) {
  const auto ref = load_ref("ckpt_t0pp_ref.pt");
  Problem pb(ref, "py_param");
  torchext::load_state_dict(*pb.opt, ref_path("ckpt_t0pp_py.pt"));
  const auto want = R(ref, "t0_per_param0");
  EXPECT_TRUE(torch::equal(torch::tensor(group_options(*pb.opt, 0).t0_per_param(),
                                         torch::kDouble), want));
  EXPECT_TRUE(group_options(*pb.opt, 1).t0_per_param().empty());
  const int64_t start = R(ref, "py_steps").item<int64_t>();
  t0pp_run(pb, ref, start, start + R(ref, "cpp_steps").item<int64_t>());
  expect_state(pb, ref, "mid_", /*exact=*/true);
  torchext::save_state_dict(*pb.opt, ref_path("ckpt_t0pp_cpp.pt"));
  save_tensors(pb.params, ref_path("ckpt_t0pp_cpp_params.pt"));
}

// The whole run in C++: its start_averaging writes what Python's wrote
// (t0, t0_per_param), the steps follow them, and a LibTorch archive carries
// them (torch::save/load mid-run changes nothing).
TEST(T0PerParam, CppStartAveragingAndArchivesFollowPython) {
  const auto ref = load_ref("ckpt_t0pp_ref.pt");
  Problem pb(ref, "init", ASGDOptions(0.03).lambd(1e-3).alpha(0.75).t0(3.0).weight_decay(1e-2),
             ASGDOptions(0.01).lambd(1e-2).alpha(0.6).t0(0.0).maximize(true));
  const int64_t py = R(ref, "py_steps").item<int64_t>();
  t0pp_run(pb, ref, 0, py);
  EXPECT_TRUE(torch::equal(torch::tensor(group_options(*pb.opt, 0).t0_per_param(),
                                         torch::kDouble), R(ref, "t0_per_param0")));
  EXPECT_TRUE(group_options(*pb.opt, 1).t0_per_param().empty());
  const auto t0 = R(ref, "t0");
  EXPECT_EQ(group_options(*pb.opt, 0).t0(), t0[0].item<double>());
  EXPECT_EQ(group_options(*pb.opt, 1).t0(), t0[1].item<double>());
  for (size_t i = 0; i < pb.params.size(); ++i) {
    EXPECT_TRUE(torch::equal(pb.params[i], R(ref, idx("py_param", i)))) << i;
  }
  // Through a LibTorch archive, into an optimizer with other options.
  std::stringstream stream;
  torch::save(*pb.opt, stream);
  Problem other(ref, "init");
  for (size_t i = 0; i < pb.params.size(); ++i) {
    torch::NoGradGuard ng;
    other.params[i].copy_(pb.params[i]);
  }
  torch::load(*other.opt, stream);
  EXPECT_EQ(group_options(*other.opt, 0).t0_per_param(), group_options(*pb.opt, 0).t0_per_param());
  const int64_t mid = py + R(ref, "cpp_steps").item<int64_t>();
  t0pp_run(pb, ref, py, mid);
  t0pp_run(other, ref, py, mid);
  expect_state(pb, ref, "mid_", /*exact=*/true);
  expect_state(other, ref, "mid_", /*exact=*/true);
}

TEST(T0PerParam, WrongLengthIsRefusedWhereverItComesFrom) {
  auto p = torch::ones({2}).requires_grad_();
  auto q = torch::ones({3}).requires_grad_();
  std::vector<OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{p, q},
                      std::make_unique<ASGDOptions>(ASGDOptions(0.1).t0_per_param({1.0})));
  EXPECT_THROW_MSG(ASGD{groups}, "t0_per_param has 1 values but the group has 2 params");
  EXPECT_THROW_MSG(ASGD({p}, ASGDOptions(0.1).t0_per_param({std::nan("")})), "t0_per_param[0]");
  ASGD opt({p, q}, ASGDOptions(0.1).t0_per_param({1.0, 2.0}));
  p.mutable_grad() = torch::ones({2});
  q.mutable_grad() = torch::ones({3});
  opt.step();
  const auto before = snapshot(opt, {p, q});
  static_cast<ASGDOptions&>(opt.param_groups()[0].options()).t0_per_param({1.0, 2.0, 3.0});
  EXPECT_THROW_MSG(opt.step(), "t0_per_param has 3 values");
  static_cast<ASGDOptions&>(opt.param_groups()[0].options()).t0_per_param({1.0, 2.0});
  expect_same(snapshot(opt, {p, q}), before);
}

// ---- corrupted checkpoints: tests/checkpoint_corruptions.py's table --------

namespace {

struct CorruptCase {
  std::string kind, tag, name;
  std::vector<std::string> names;
};

std::vector<CorruptCase> corrupt_cases() {
  std::ifstream in(ref_path("corrupt/index.txt"));
  TORCH_CHECK(in.good(), "missing corrupt/index.txt (run cpp_tests/make_reference.py)");
  std::vector<CorruptCase> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::string> fields;
    std::stringstream ss(line);
    std::string f;
    while (std::getline(ss, f, '\t')) fields.push_back(f);
    if (fields.size() == 3) fields.emplace_back();  // allowed: no names
    TORCH_CHECK(fields.size() == 4, "bad index line: ", line);
    CorruptCase c{fields[0], fields[1], fields[2], {}};
    std::stringstream ns(fields[3]);
    while (std::getline(ns, f, '|')) c.names.push_back(f);
    out.push_back(c);
  }
  return out;
}

// tests/checkpoint_corruptions.py's SHAPES and GROUPS.
struct CorruptProblem {
  std::vector<torch::Tensor> params;
  std::unique_ptr<ASGD> opt;
  explicit CorruptProblem(int64_t seed) {
    torch::manual_seed(seed);
    for (auto shape : {std::vector<int64_t>{4, 3}, {3}, {2, 2}}) {
      params.push_back(torch::randn(shape).requires_grad_());
    }
    std::vector<OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<torch::Tensor>{params[0], params[1]},
                        std::make_unique<ASGDOptions>(
                            ASGDOptions(0.03).lambd(1e-3).alpha(0.75).t0(3).weight_decay(1e-2)));
    groups.emplace_back(std::vector<torch::Tensor>{params[2]},
                        std::make_unique<ASGDOptions>(
                            ASGDOptions(0.01).lambd(1e-2).alpha(0.6).t0(0).maximize(true)));
    opt = std::make_unique<ASGD>(groups);
  }
  void steps(int64_t n, int64_t seed) {
    torch::manual_seed(seed);
    for (int64_t s = 0; s < n; ++s) {
      for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
      opt->step();
    }
  }
};

// Everything a scaler holds.
std::vector<double> scaler_snapshot(const torchext::amp::GradScaler& s) {
  const auto& o = s.options();
  return {s.get_scale(),
          static_cast<double>(s.get_growth_tracker()),
          s.hysteresis_tracker().defined() ? s.hysteresis_tracker().item<double>() : -1.0,
          static_cast<double>(s.num_skipped_steps()),
          o.init_scale(), o.growth_factor(), o.backoff_factor(),
          static_cast<double>(o.growth_interval()), static_cast<double>(o.hysteresis()),
          o.min_scale().value_or(-1.0), o.max_scale().value_or(-1.0)};
}

// Runs `load`; true when it threw c10::Error naming every string of `names`
// (a missing name is reported as a failure).
bool refused(const std::function<void()>& load, const CorruptCase& c) {
  try {
    load();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    for (const auto& n : c.names) {
      EXPECT_NE(msg.find(n), std::string::npos)
          << c.kind << " " << c.name << ": '" << n << "' not in the error: " << msg;
    }
    return true;
  }
  return false;
}

}  // namespace

// Each corrupted Python-format ASGD checkpoint is refused by
// torchext::load_state_dict naming the entry, and nothing changes: every
// tensor and option, and the next steps equal those of an untouched twin.
TEST(CorruptCheckpoints, PythonFormatASGDRefusedWhole) {
  CorruptProblem pb(3), twin(3);
  for (auto* x : {&pb, &twin}) {
    torchext::load_state_dict(*x->opt, ref_path("corrupt/asgd_good.pt"));
    x->steps(1, 7);
  }
  const auto before = snapshot(*pb.opt, pb.params);
  int total = 0, ok = 0;
  for (const auto& c : corrupt_cases()) {
    if (c.kind != "asgd" || c.tag != "bad") continue;
    SCOPED_TRACE(c.name);
    ++total;
    const bool r = refused(
        [&] { torchext::load_state_dict(*pb.opt, ref_path("corrupt/asgd_" + c.name + ".pt")); },
        c);
    EXPECT_TRUE(r) << "not refused: " << c.name;
    const auto after = snapshot(*pb.opt, pb.params);
    bool same = after.size() == before.size();
    for (size_t i = 0; same && i < after.size(); ++i) {
      same = after[i].scalar_type() == before[i].scalar_type() && torch::equal(after[i], before[i]);
    }
    EXPECT_TRUE(same) << "changed by " << c.name;
    ok += r && same;
    if (!same) {  // start the next case from the good state again
      torchext::load_state_dict(*pb.opt, ref_path("corrupt/asgd_good.pt"));
      pb.steps(1, 7);
    }
  }
  std::cout << "[ corrupt  ] Python-format ASGD checkpoints refused whole: " << ok << " of "
            << total << std::endl;
  EXPECT_GE(total, 100);
  pb.steps(2, 9);
  twin.steps(2, 9);
  expect_same(snapshot(*pb.opt, pb.params), snapshot(*twin.opt, twin.params));
  for (const auto& c : corrupt_cases()) {  // extra unknown keys etc. load
    if (c.kind != "asgd" || c.tag != "allowed") continue;
    SCOPED_TRACE(c.name);
    EXPECT_NO_THROW(torchext::load_state_dict(*pb.opt,
                                              ref_path("corrupt/asgd_" + c.name + ".pt")));
  }
  EXPECT_EQ(group_options(*pb.opt, 0).t0_per_param(), (std::vector<double>{2.0, 1.0}));
}

TEST(CorruptCheckpoints, PythonFormatGradScalerRefusedWhole) {
  for (const bool started : {false, true}) {
    SCOPED_TRACE(started ? "after scale()" : "before scale()");
    torchext::amp::GradScaler scaler, twin;
    auto w = torch::ones({3}).requires_grad_();
    torch::optim::SGD opt({w}, 0.1);
    auto iteration = [&](torchext::amp::GradScaler& s, float x) {
      opt.zero_grad();
      s.scale((w * x).sum()).backward();
      s.step(opt);
      s.update();
    };
    for (auto* s : {&scaler, &twin}) {
      torchext::load_state_dict(*s, ref_path("corrupt/scaler_good.pt"));
      if (started) iteration(*s, 1.0f);
    }
    const auto before = scaler_snapshot(scaler);
    EXPECT_EQ(before, scaler_snapshot(twin));
    int total = 0, ok = 0;
    for (const auto& c : corrupt_cases()) {
      if (c.kind != "scaler" || c.tag != "bad") continue;
      SCOPED_TRACE(c.name);
      ++total;
      const bool r = refused(
          [&] {
            torchext::load_state_dict(scaler, ref_path("corrupt/scaler_" + c.name + ".pt"));
          },
          c);
      EXPECT_TRUE(r) << "not refused: " << c.name;
      const bool same = scaler_snapshot(scaler) == before;
      EXPECT_TRUE(same) << "changed by " << c.name;
      ok += r && same;
      if (!same) torchext::load_state_dict(scaler, ref_path("corrupt/scaler_good.pt"));
    }
    std::cout << "[ corrupt  ] Python-format GradScaler checkpoints refused whole: " << ok
              << " of " << total << std::endl;
    EXPECT_GE(total, 50);
    for (const float x : {1.0f, std::numeric_limits<float>::infinity(), 1.0f}) {
      iteration(scaler, x);
      iteration(twin, x);
    }
    EXPECT_EQ(scaler_snapshot(scaler), scaler_snapshot(twin));
    for (const auto& c : corrupt_cases()) {
      if (c.kind != "scaler" || c.tag != "allowed") continue;
      SCOPED_TRACE(c.name);
      EXPECT_NO_THROW(torchext::load_state_dict(scaler,
                                                ref_path("corrupt/scaler_" + c.name + ".pt")));
    }
  }
}

// LibTorch archives (torch::save/torch::load): the corruptions that format
// can hold, written here from C++ (options and state set past the setters'
// checks), each refused whole by torch::load.
TEST(CorruptCheckpoints, LibTorchArchivesRefusedWhole) {
  using Corrupt = std::function<void(ASGD&, const std::vector<torch::Tensor>&)>;
  auto state = [](ASGD& opt, const torch::Tensor& p) -> ASGDParamState& {
    return static_cast<ASGDParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
  };
  auto options = [](ASGD& opt, size_t g) -> ASGDOptions& {
    return static_cast<ASGDOptions&>(opt.param_groups()[g].options());
  };
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const std::vector<std::tuple<std::string, std::string, Corrupt>> cases = {
      {"lr negative", "learning rate", [&](ASGD& o, auto&) { options(o, 1).lr(-0.1); }},
      {"lr nan", "learning rate", [&](ASGD& o, auto&) { options(o, 1).lr(nan); }},
      {"lr tensor nan", "learning rate",
       [&](ASGD& o, auto&) { options(o, 1).lr(torch::tensor(static_cast<float>(nan))); }},
      {"lr tensor int", "lr", [&](ASGD& o, auto&) { options(o, 1).lr(torch::tensor(1)); }},
      {"lambd negative", "lambd", [&](ASGD& o, auto&) { options(o, 1).lambd(-1); }},
      {"alpha nan", "alpha", [&](ASGD& o, auto&) { options(o, 1).alpha(nan); }},
      {"weight_decay negative", "weight_decay",
       [&](ASGD& o, auto&) { options(o, 1).weight_decay(-1); }},
      {"t0 nan", "t0", [&](ASGD& o, auto&) { options(o, 1).t0(nan); }},
      // issue 25: inf in any of these makes the next step NaN
      {"lr inf", "learning rate", [&](ASGD& o, auto&) { options(o, 0).lr(inf); }},
      {"lr tensor inf", "learning rate",
       [&](ASGD& o, auto&) { options(o, 1).lr(torch::tensor(static_cast<float>(inf))); }},
      {"lambd inf", "lambd", [&](ASGD& o, auto&) { options(o, 0).lambd(inf); }},
      {"alpha inf", "alpha", [&](ASGD& o, auto&) { options(o, 1).alpha(inf); }},
      {"weight_decay inf", "weight_decay", [&](ASGD& o, auto&) { options(o, 1).weight_decay(inf); }},
      {"t0_per_param too short", "t0_per_param",
       [&](ASGD& o, auto&) { options(o, 0).t0_per_param({1.0}); }},
      {"t0_per_param nan", "t0_per_param",
       [&](ASGD& o, auto&) { options(o, 0).t0_per_param({1.0, nan}); }},
      {"stochastic_rounding with fused=false", "stochastic_rounding",
       [&](ASGD& o, auto&) { options(o, 1).stochastic_rounding(true).fused(false); }},
      {"ax wrong shape", "'ax'", [&](ASGD& o, auto& ps) { state(o, ps[2]).ax(torch::zeros({4})); }},
      {"ax int", "'ax'",
       [&](ASGD& o, auto& ps) { state(o, ps[2]).ax(torch::zeros({2, 2}, torch::kLong)); }},
      {"ax complex", "'ax'",
       [&](ASGD& o, auto& ps) { state(o, ps[2]).ax(torch::zeros({2, 2}, torch::kComplexFloat)); }},
      {"step nan", "'step'", [&](ASGD& o, auto& ps) { state(o, ps[2]).step(torch::tensor(nan)); }},
      {"step negative", "'step'",
       [&](ASGD& o, auto& ps) { state(o, ps[2]).step(torch::tensor(-1.0f)); }},
      {"step two elements", "'step'",
       [&](ASGD& o, auto& ps) { state(o, ps[2]).step(torch::ones({2})); }},
      {"step bool", "'step'", [&](ASGD& o, auto& ps) { state(o, ps[2]).step(torch::tensor(true)); }},
      {"eta inf", "'eta'", [&](ASGD& o, auto& ps) { state(o, ps[2]).eta(torch::tensor(inf)); }},
      {"eta complex", "'eta'",
       [&](ASGD& o, auto& ps) { state(o, ps[2]).eta(torch::ones({}, torch::kComplexFloat)); }},
      {"mu nan", "'mu'", [&](ASGD& o, auto& ps) { state(o, ps[0]).mu(torch::tensor(nan)); }},
  };
  CorruptProblem pb(3), twin(3);
  pb.steps(2, 5);
  twin.steps(2, 5);
  const auto before = snapshot(*pb.opt, pb.params);
  int ok = 0;
  for (const auto& [name, names, corrupt] : cases) {
    SCOPED_TRACE(name);
    CorruptProblem src(3);
    src.steps(2, 5);
    corrupt(*src.opt, src.params);
    std::stringstream stream;
    torch::save(*src.opt, stream);
    const bool r = refused([&] { torch::load(*pb.opt, stream); },
                           CorruptCase{"archive", "bad", name, {names}});
    EXPECT_TRUE(r) << "not refused: " << name;
    const auto after = snapshot(*pb.opt, pb.params);
    bool same = true;
    for (size_t i = 0; same && i < after.size(); ++i) same = torch::equal(after[i], before[i]);
    EXPECT_TRUE(same) << "changed by " << name;
    ok += r && same;
  }
  // Structure: another number of groups, a group of another size.
  {
    auto x = torch::zeros({4, 3}).requires_grad_();
    ASGD one({x});
    x.mutable_grad() = torch::ones({4, 3});
    one.step();
    std::stringstream stream;
    torch::save(one, stream);
    EXPECT_THROW_MSG(torch::load(*pb.opt, stream), "parameter groups");
  }
  std::cout << "[ corrupt  ] LibTorch ASGD archives refused whole: " << ok << " of "
            << cases.size() << std::endl;
  pb.steps(2, 9);
  twin.steps(2, 9);
  expect_same(snapshot(*pb.opt, pb.params), snapshot(*twin.opt, twin.params));

  // GradScaler archives: each key of GradScaler::save with a bad value.
  using torchext::amp::GradScaler;
  using torchext::amp::GradScalerOptions;
  const auto f = [](double v) { return torch::full({}, v, torch::kFloat); };
  const auto i32 = [](int64_t v) { return torch::full({}, v, torch::kInt); };
  const std::vector<std::tuple<std::string, std::string, c10::IValue>> scaler_cases = {
      {"scale", "scale", f(0.0)},          {"scale", "scale", f(-4.0)},
      {"scale", "scale", f(nan)},          {"scale", "scale", f(inf)},
      {"scale", "scale", torch::ones({2})}, {"scale", "scale", c10::IValue(2.0)},
      {"_growth_tracker", "_growth_tracker", i32(-1)},
      {"_hysteresis_tracker", "_hysteresis_tracker", i32(-1)},
      {"_hysteresis_tracker", "_hysteresis_tracker", i32(5)},
      {"_skipped_steps", "_skipped_steps", torch::full({}, -1, torch::kLong)},
      {"growth_factor", "growth_factor", c10::IValue(1.0)},
      {"growth_factor", "growth_factor", c10::IValue(nan)},
      {"growth_factor", "growth_factor", c10::IValue(int64_t{2})},
      {"backoff_factor", "backoff_factor", c10::IValue(1.0)},
      {"backoff_factor", "backoff_factor", c10::IValue(0.0)},
      {"growth_interval", "growth_interval", c10::IValue(int64_t{0})},
      {"growth_interval", "growth_interval", c10::IValue(2.5)},
      {"hysteresis", "hysteresis", c10::IValue(int64_t{0})},
      {"min_scale", "min_scale", c10::IValue(-1.0)},
      {"max_scale", "max_scale", c10::IValue(0.5)},  // below min_scale 1
      {"max_scale", "max_scale", c10::IValue(nan)},
      // issue 25: nothing non-finite but max_scale = inf
      {"growth_factor", "growth_factor", c10::IValue(inf)},
      {"backoff_factor", "backoff_factor", c10::IValue(nan)},
      {"backoff_factor", "backoff_factor", c10::IValue(-inf)},
      {"min_scale", "min_scale", c10::IValue(inf)},
      {"min_scale", "min_scale", c10::IValue(nan)},
      {"scale", "scale", f(-inf)},
  };
  GradScaler good(GradScalerOptions().init_scale(64).growth_interval(3).hysteresis(2)
                      .min_scale(1.0));
  good.scale(torch::ones({}));
  std::stringstream good_stream;
  torch::save(good, good_stream);
  const std::string good_bytes = good_stream.str();
  GradScaler scaler;
  {
    std::istringstream in(good_bytes);
    torch::load(scaler, in);
  }
  const auto scaler_before = scaler_snapshot(scaler);
  int scaler_ok = 0;
  for (const auto& [key, names, value] : scaler_cases) {
    SCOPED_TRACE(key);
    // The good archive with one key replaced.
    torch::serialize::InputArchive in;
    std::istringstream src(good_bytes);
    in.load_from(src);
    torch::serialize::OutputArchive out;
    for (const auto& k : in.keys()) {
      if (k == "training") continue;  // the archive module's own attribute
      c10::IValue v;
      in.read(k, v);
      out.write(k, k == key ? value : v);
    }
    std::stringstream bad;
    out.save_to(bad);
    const bool r = refused([&] { torch::load(scaler, bad); },
                           CorruptCase{"archive", "bad", key, {names}});
    EXPECT_TRUE(r) << "not refused: " << key << " = " << value;
    const bool same = scaler_snapshot(scaler) == scaler_before;
    EXPECT_TRUE(same) << "changed by " << key << " = " << value;
    scaler_ok += r && same;
  }
  std::cout << "[ corrupt  ] LibTorch GradScaler archives refused whole: " << scaler_ok << " of "
            << scaler_cases.size() << std::endl;
}

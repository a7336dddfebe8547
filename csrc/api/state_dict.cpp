// Checkpoints in Python's format (torchext::save_state_dict/load_state_dict):
// the dicts Python's optimizer.state_dict() / scaler.state_dict() hold,
// written and read with torch::jit::pickle_save/pickle_load, which use
// torch.save's zip format.
#include <torchext/torchext.h>

#include "asgd_state.h"

#include <c10/util/Exception.h>
#include <c10/util/irange.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <fstream>
#include <iterator>
#include <limits>
#include <unordered_map>

namespace torchext {
namespace {

using optim::ASGD;
using optim::ASGDOptions;
using optim::ASGDParamState;
using GenericDict = c10::impl::GenericDict;

GenericDict str_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// torch::jit::pickle_save's container, but plain Python dicts and lists:
// pickle_save tags them with their TorchScript type (a call to
// torch.jit._pickle.restore_type_tag), which torch.load(weights_only=True)
// refuses. So lists hold IValues (an int list would be tagged too).
void write_file(const c10::IValue& value, const std::string& path, const char* what) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler(
      [&](const char* buf, size_t size) { pickled.insert(pickled.end(), buf, buf + size); },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
      /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TORCH_CHECK(out.good(), what, ": cannot open '", path, "' for writing");
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  TORCH_CHECK(out.good(), what, ": writing '", path, "' failed");
}

GenericDict read_dict(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.good(), what, ": cannot open '", path, "'");
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  c10::IValue value;
  try {
    value = torch::jit::pickle_load(bytes);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, what, ": '", path, "' is not a readable torch.save file (truncated or ",
                "corrupt?): ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, what, ": '", path, "' is not a readable torch.save file (truncated or ",
                "corrupt?): ", e.what());
  }
  TORCH_CHECK_VALUE(value.isGenericDict(), what, ": '", path, "' does not hold a dict (",
                    value.tagKind(), ")");
  return value.toGenericDict();
}

const c10::IValue* find(const GenericDict& d, const std::string& key) {
  auto it = d.find(c10::IValue(key));
  return it == d.end() ? nullptr : &it->value();
}

const c10::IValue& get(const GenericDict& d, const std::string& key, const std::string& where) {
  const auto* v = find(d, key);
  TORCH_CHECK_VALUE(v != nullptr, where, " has no '", key, "'");
  return *v;
}

// A Python int or float (or a 1-element tensor), as a double.
double number(const c10::IValue& v, const std::string& where) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  TORCH_CHECK_VALUE(v.isTensor() && v.toTensor().numel() == 1, where,
                    " must be a number, got ", v.tagKind());
  return v.toTensor().item<double>();
}

bool flag(const GenericDict& d, const std::string& key, const std::string& where, bool dflt) {
  const auto* v = find(d, key);
  if (v == nullptr || v->isNone()) return dflt;
  TORCH_CHECK_VALUE(v->isBool(), where, "['", key, "'] must be a bool, got ", v->tagKind());
  return v->toBool();
}

at::Tensor cpu_copy(const at::Tensor& t) { return t.detach().to(at::kCPU, false, true); }

// ---- ASGD ------------------------------------------------------------------

// Options of a saved group: Python's keys (torch.optim.ASGD or torchext).
ASGDOptions group_options(const GenericDict& g, const std::string& where,
                          const torch::optim::OptimizerParamGroup& current) {
  ASGDOptions o;
  const auto& lr = get(g, "lr", where);
  if (lr.isTensor()) {
    const auto& t = lr.toTensor();
    TORCH_CHECK_VALUE(t.numel() == 1 && at::isFloatingType(t.scalar_type()), where,
                      "['lr'] must be a number or a 1-element floating tensor, got shape ",
                      t.sizes(), " ", t.scalar_type());
    const auto device = current.params().empty() ? c10::Device(at::kCPU)
                                                 : current.params()[0].device();
    o.lr(t.detach().to(device, t.scalar_type(), false, /*copy=*/true).reshape({}));
  } else {
    o.lr(number(lr, where + "['lr']"));
  }
  o.lambd(number(get(g, "lambd", where), where + "['lambd']"));
  o.alpha(number(get(g, "alpha", where), where + "['alpha']"));
  o.t0(number(get(g, "t0", where), where + "['t0']"));
  o.weight_decay(number(get(g, "weight_decay", where), where + "['weight_decay']"));
  o.maximize(flag(g, "maximize", where, false));
  o.capturable(flag(g, "capturable", where, false));
  const auto* fused = find(g, "fused");
  if (fused != nullptr && !fused->isNone()) o.fused(flag(g, "fused", where, false));
  try {
    o.validate();
  } catch (c10::Error& e) {
    e.add_context(c10::str("in ", where));
    throw;
  }
  return o;
}

// One entry of Python's state: step/eta/mu are tensors or, in old
// checkpoints, Python numbers.
std::unique_ptr<ASGDParamState> param_state(const c10::IValue& v, const std::string& where,
                                            const at::Tensor& p) {
  TORCH_CHECK_VALUE(v.isGenericDict(), where, " must be a dict, got ", v.tagKind());
  const auto d = v.toGenericDict();
  auto tensor = [&](const char* key) {
    const auto& x = get(d, key, where);
    if (x.isTensor()) return x.toTensor();
    return at::full({}, number(x, c10::str(where, "['", key, "']")),
                    optim::scalar_state_dtype());
  };
  const auto& ax = get(d, "ax", where);
  TORCH_CHECK_VALUE(ax.isTensor(), where, "['ax'] must be a tensor, got ", ax.tagKind());
  auto st = std::make_unique<ASGDParamState>();
  st->ax(ax.toTensor());
  st->step(tensor("step"));
  st->eta(tensor("eta"));
  st->mu(tensor("mu"));
  optim::adopt_loaded_state(*st, p, where);
  return st;
}

}  // namespace

void save_state_dict(const ASGD& optimizer, const std::string& path) {
  GenericDict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t next_id = 0;
  for (const auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const ASGDOptions&>(group.options());
    auto g = str_dict();
    g.insert("lr", o.has_tensor_lr() ? c10::IValue(cpu_copy(o.lr_tensor())) : c10::IValue(o.lr()));
    g.insert("lambd", o.lambd());
    g.insert("alpha", o.alpha());
    g.insert("t0", o.t0());
    g.insert("weight_decay", o.weight_decay());
    g.insert("foreach", c10::IValue());
    g.insert("maximize", o.maximize());
    g.insert("differentiable", false);
    g.insert("capturable", o.capturable());
    g.insert("fused", o.fused().has_value() ? c10::IValue(*o.fused()) : c10::IValue());
    c10::impl::GenericList ids(c10::AnyType::get());
    for (const auto& p : group.params()) {
      const int64_t id = next_id++;
      ids.push_back(id);
      auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it == optimizer.state().end()) continue;
      const auto& st = static_cast<const ASGDParamState&>(*it->second);
      auto s = str_dict();
      s.insert("step", cpu_copy(st.step()));
      s.insert("eta", cpu_copy(st.eta()));
      s.insert("mu", cpu_copy(st.mu()));
      s.insert("ax", cpu_copy(st.ax()));
      state.insert(id, s);
    }
    g.insert("params", ids);
    groups.push_back(g);
  }
  auto root = str_dict();
  root.insert("state", state);
  root.insert("param_groups", groups);
  write_file(root, path, "torchext::save_state_dict(ASGD)");
}

void load_state_dict(ASGD& optimizer, const std::string& path) {
  const char* what = "torchext::load_state_dict(ASGD)";
  const auto root = read_dict(path, what);
  const std::string file = c10::str(what, ": '", path, "'");
  const auto& groups_v = get(root, "param_groups", file);
  const auto& state_v = get(root, "state", file);
  TORCH_CHECK_VALUE(groups_v.isList() && state_v.isGenericDict(), file,
                    ": 'param_groups' must be a list and 'state' a dict");
  const auto saved_groups = groups_v.toList();
  auto& groups = optimizer.param_groups();
  TORCH_CHECK_VALUE(saved_groups.size() == groups.size(), file, " has ", saved_groups.size(),
                    " parameter groups but the optimizer has ", groups.size());
  // Check and convert everything first; assign only at the end.
  std::vector<ASGDOptions> options;
  std::unordered_map<int64_t, at::Tensor> id_to_param;
  for (const auto gi : c10::irange(saved_groups.size())) {
    const std::string where = c10::str(file, " param_groups[", gi, "]");
    const c10::IValue sg_v = saved_groups.get(gi);
    TORCH_CHECK_VALUE(sg_v.isGenericDict(), where, " must be a dict");
    const auto sg = sg_v.toGenericDict();
    const auto& ids_v = get(sg, "params", where);
    TORCH_CHECK_VALUE(ids_v.isList(), where, "['params'] must be a list");
    const auto ids = ids_v.toList();
    const auto& params = groups[gi].params();
    TORCH_CHECK_VALUE(ids.size() == params.size(), where, " has ", ids.size(),
                      " parameters but the optimizer's group has ", params.size());
    options.push_back(group_options(sg, where, groups[gi]));
    for (const auto k : c10::irange(ids.size())) {
      const c10::IValue id = ids.get(k);
      TORCH_CHECK_VALUE(id.isInt(), where, "['params'][", k, "] must be an int");
      id_to_param[id.toInt()] = params[k];
    }
  }
  std::vector<std::pair<void*, std::unique_ptr<ASGDParamState>>> states;
  for (const auto& kv : state_v.toGenericDict()) {
    if (!kv.key().isInt()) continue;  // Python keeps unknown keys aside too
    auto it = id_to_param.find(kv.key().toInt());
    if (it == id_to_param.end()) continue;
    const std::string where = c10::str(file, " state[", kv.key().toInt(), "]");
    states.emplace_back(it->second.unsafeGetTensorImpl(),
                        param_state(kv.value(), where, it->second));
  }
  auto& state = optimizer.state();
  state.clear();  // as Python: the loaded state replaces the old one
  for (auto& [key, st] : states) state[key] = std::move(st);
  for (const auto gi : c10::irange(groups.size())) {
    groups[gi].set_options(std::make_unique<ASGDOptions>(options[gi]));
  }
}

void save_state_dict(const amp::GradScaler& scaler, const std::string& path) {
  write_file(scaler.state_dict(), path, "torchext::save_state_dict(GradScaler)");
}

void load_state_dict(amp::GradScaler& scaler, const std::string& path) {
  scaler.load_state_dict(read_dict(path, "torchext::load_state_dict(GradScaler)"));
}

// ---- GradScaler ------------------------------------------------------------

namespace amp {

// Version of the torchext keys (torchext/amp/grad_scaler.py's STATE_DICT_VERSION).
constexpr int64_t kStateDictVersion = 1;

c10::impl::GenericDict GradScaler::state_dict() const {
  auto d = str_dict();
  if (!options_.enabled()) return d;  // empty, as torch
  d.insert("scale", get_scale());
  d.insert("growth_factor", options_.growth_factor());
  d.insert("backoff_factor", options_.backoff_factor());
  d.insert("growth_interval", options_.growth_interval());
  d.insert("_growth_tracker", get_growth_tracker());
  d.insert("_torchext_version", kStateDictVersion);
  d.insert("hysteresis", options_.hysteresis());
  d.insert("_hysteresis_tracker", hysteresis_tracker_.defined()
                                      ? hysteresis_tracker_.item<int64_t>()
                                      : options_.hysteresis());
  d.insert("min_scale", options_.min_scale().value_or(0.0));
  d.insert("max_scale", options_.max_scale().value_or(std::numeric_limits<double>::infinity()));
  d.insert("skipped_steps", num_skipped_steps());
  return d;
}

void GradScaler::load_state_dict(const c10::impl::GenericDict& sd) {
  if (!options_.enabled()) return;
  const std::string where = "GradScaler.load_state_dict: the state_dict";
  TORCH_CHECK(sd.size() != 0,
              "GradScaler.load_state_dict: the source state dict is empty, possibly because it "
              "was saved from a disabled instance of GradScaler.");
  const auto num = [&](const char* key) { return number(get(sd, key, where), key); };
  const auto integer = [&](const char* key) {
    const double v = num(key);
    TORCH_CHECK_VALUE(v == static_cast<double>(static_cast<int64_t>(v)), where, "['", key,
                      "'] must be an integer, got ", v);
    return static_cast<int64_t>(v);
  };
  const auto* version_v = find(sd, "_torchext_version");
  const int64_t version = version_v == nullptr ? 0 : static_cast<int64_t>(number(*version_v, "_torchext_version"));
  TORCH_CHECK_VALUE(version <= kStateDictVersion, "GradScaler.load_state_dict: state_dict version ",
                    version, " is newer than this torchext understands (", kStateDictVersion,
                    "); upgrade torchext.");
  GradScalerOptions o = options_;
  const double scale = num("scale");
  o.growth_factor(num("growth_factor"));
  o.backoff_factor(num("backoff_factor"));
  o.growth_interval(integer("growth_interval"));
  const int64_t growth = integer("_growth_tracker");
  int64_t hyst_tracker = options_.hysteresis(), skipped = 0;
  if (version >= 1) {
    o.hysteresis(integer("hysteresis"));
    hyst_tracker = integer("_hysteresis_tracker");
    const double lo = num("min_scale"), hi = num("max_scale");
    o.min_scale(lo == 0.0 ? std::nullopt : std::optional<double>(lo));
    o.max_scale(hi == std::numeric_limits<double>::infinity() ? std::nullopt
                                                               : std::optional<double>(hi));
    skipped = integer("skipped_steps");
  }
  GradScaler check(GradScalerOptions(o).init_scale(scale));  // validates every option
  options_ = o;
  if (!scale_.defined()) {  // no state yet: create it on the CPU, movable by scale()
    ensure_state(at::kCPU);
    state_movable_ = true;
  }
  scale_.fill_(scale);
  growth_tracker_.fill_(growth);
  hysteresis_tracker_.fill_(hyst_tracker);
  skipped_steps_.fill_(skipped);
  per_optimizer_.clear();
}

}  // namespace amp
}  // namespace torchext

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
#include <torch/csrc/jit/serialization/unpickler.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <unordered_map>

namespace torchext {
namespace {

using optim::ASGD;
using optim::ASGDOptions;
using optim::ASGDParamState;
using GenericDict = c10::impl::GenericDict;

GenericDict str_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// Note [Python pickles rewritten for the TorchScript unpickler]
// read_dict reads Python's torch.save files with the TorchScript unpickler,
// which refuses two things an optimizer's state dict from Python may hold:
// - A torch dtype. Python's ASGD groups hold `average_dtype` as the string
//   "float32" or None (torchext/optim/_checkpoint.py FLOAT32_AVERAGE:
//   torch's distributed checkpoints refuse a torch.dtype in param_groups),
//   which save_state_dict writes too, but a group may still hold
//   torch.float32 (Python accepts it, and its first version wrote it).
//   Python pickles a dtype as the global torch.<name>: GLOBAL ('c')
//   "torch\n<name>\n", which the unpickler refuses ("unknown torch global").
//   It becomes the string "torch.<name>" (BINUNICODE); a genuine string
//   "torch.float32" reads as the dtype too.
// - An int outside int32 written in fewer than 8 bytes (a `rounding_seed`
//   such as 2**40): Python writes LONG1 with as few bytes as hold the value,
//   the unpickler takes only 8 ("Expected length to be 8"). It becomes LONG1
//   with 8 bytes, sign-extended. (An int beyond int64 is refused here.)
// The rewrite walks the pickle opcode by opcode, so nothing inside a string
// or another opcode's argument is touched. torch.save writes protocol 2: no
// frames, no offsets, so each rewrite is local, and a memo entry (BINPUT
// after the value, BINGET for the next use) holds the new value as it held
// the old. An opcode the walk does not know (protocol 4's FRAME, say) ends
// it: the rest is copied as is, for the unpickler to judge. The pickle holds
// no tensor data (those are separate records), only keys and small values.
constexpr const char* kDtypeNames[] = {
    "float32", "float64", "float16", "bfloat16", "complex64", "complex128", "uint8",
    "int8", "int16", "int32", "int64", "bool"};

void append_binunicode(std::vector<char>& out, const std::string& s) {
  out.push_back('X');  // BINUNICODE: a 4-byte little-endian length, then the bytes
  const auto n = static_cast<uint32_t>(s.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out.insert(out.end(), s.begin(), s.end());
}

// The bytes that follow opcode data[i] (its argument), or nullopt for an
// opcode the walk does not know or one cut short.
std::optional<size_t> pickle_arg_size(const char* data, size_t size, size_t i) {
  const size_t at = i + 1;  // the argument's first byte
  auto length = [&](size_t n) -> std::optional<size_t> {  // an n-byte little-endian length
    if (size - at < n) return std::nullopt;
    uint64_t v = 0;
    for (size_t k = n; k-- > 0;) v = (v << 8) | static_cast<uint8_t>(data[at + k]);
    return n + v;
  };
  auto lines = [&](int count) -> std::optional<size_t> {  // newline-terminated
    size_t end = at;
    for (int k = 0; k < count; ++k) {
      const void* nl = std::memchr(data + end, '\n', size - end);
      if (nl == nullptr) return std::nullopt;
      end = static_cast<size_t>(static_cast<const char*>(nl) - data) + 1;
    }
    return end - at;
  };
  std::optional<size_t> n;
  switch (static_cast<uint8_t>(data[i])) {
    case '(': case '.': case '0': case '1': case '2': case 'N': case 'Q': case 'R': case 'a':
    case 'b': case 'd': case '}': case 'e': case 'l': case ']': case 'o': case 's': case 't':
    case ')': case 'u': case 0x81: case 0x85: case 0x86: case 0x87: case 0x88: case 0x89:
      n = 0;  // MARK STOP POP POP_MARK DUP NONE BINPERSID REDUCE APPEND BUILD DICT
      break;  // EMPTY_DICT APPENDS LIST EMPTY_LIST OBJ SETITEM TUPLE EMPTY_TUPLE
              // SETITEMS NEWOBJ TUPLE1-3 NEWTRUE NEWFALSE
    case 'K': case 'h': case 'q': case 0x80: n = 1; break;  // BININT1 BINGET BINPUT PROTO
    case 'M': n = 2; break;                                  // BININT2
    case 'J': case 'j': case 'r': n = 4; break;              // BININT LONG_BINGET LONG_BINPUT
    case 'G': n = 8; break;                                  // BINFLOAT
    case 'U': case 'C': case 0x8a: n = length(1); break;     // SHORT_BINSTRING/BYTES LONG1
    case 'T': case 'X': case 'B': case 0x8b: n = length(4); break;  // BINSTRING/UNICODE/BYTES LONG4
    case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g': case 'p':
      n = lines(1);  // FLOAT INT LONG PERSID STRING UNICODE GET PUT
      break;
    case 'c': case 'i': n = lines(2); break;  // GLOBAL INST
    default: return std::nullopt;
  }
  if (!n.has_value() || size - at < *n) return std::nullopt;
  return n;
}

// read_dict: the pickle with Note [Python pickles rewritten for the
// TorchScript unpickler]'s rewrites.
std::vector<char> rewrite_for_unpickler(const char* data, size_t size) {
  std::vector<char> out;
  out.reserve(size + 64);
  size_t i = 0;
  while (i < size) {
    const auto n = pickle_arg_size(data, size, i);
    if (!n.has_value()) break;
    const char* arg = data + i + 1;
    const auto op = static_cast<uint8_t>(data[i]);
    bool rewritten = false;
    if (op == 'c' && *n > 6 && std::memcmp(arg, "torch\n", 6) == 0) {  // GLOBAL torch.<name>
      const std::string name(arg + 6, *n - 7);
      for (const char* dtype : kDtypeNames) {
        if (name == dtype) {
          append_binunicode(out, "torch." + name);
          rewritten = true;
          break;
        }
      }
    } else if (op == 0x8a) {  // LONG1, to 8 bytes (unchanged when it has 8)
      const size_t len = *n - 1;
      TORCH_CHECK_VALUE(len <= 8, "it holds an int beyond int64 (", len, " bytes)");
      const bool negative = len > 0 && (static_cast<uint8_t>(arg[len]) & 0x80) != 0;
      out.push_back(static_cast<char>(op));
      out.push_back(8);
      out.insert(out.end(), arg + 1, arg + 1 + len);
      out.insert(out.end(), 8 - len, negative ? static_cast<char>(0xff) : 0);
      rewritten = true;
    }
    if (!rewritten) out.insert(out.end(), data + i, data + i + 1 + *n);
    i += 1 + *n;
  }
  out.insert(out.end(), data + i, data + size);  // an unknown opcode on: as is
  return out;
}

// torch::jit::pickle_load (readArchiveAndTensors on the "data" archive), with
// the pickle rewritten first (Note [Python pickles rewritten for the
// TorchScript unpickler]).
c10::IValue load_pickle(std::istream& in) {
  caffe2::serialize::PyTorchStreamReader reader(&in);  // reads the records it is asked for
  auto [pickle_ptr, pickle_size] = reader.getRecord("data.pkl");
  const auto pickled =
      rewrite_for_unpickler(static_cast<const char*>(pickle_ptr.get()), pickle_size);
  size_t pos = 0;
  auto read = [&](char* buffer, size_t len) -> size_t {
    len = std::min(pickled.size() - pos, len);
    std::memcpy(buffer, pickled.data() + pos, len);
    pos += len;
    return len;
  };
  auto read_record = [&](const std::string& name) {
    return std::get<0>(reader.getRecord("data/" + name));
  };
  torch::jit::Unpickler unpickler(read, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr,
                                  read_record, /*device=*/std::nullopt);
  unpickler.set_version(reader.version());
  return unpickler.parse_ivalue();
}

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
  c10::IValue value;
  try {
    value = load_pickle(in);
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

// A Python int or float (not a bool), or a 1-element real strided tensor, as
// a double: Python's _number (torchext/optim/_checkpoint.py).
double number(const c10::IValue& v, const std::string& where) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    TORCH_CHECK_VALUE(t.numel() == 1 && !at::isComplexType(t.scalar_type()) &&
                          t.scalar_type() != at::kBool && t.layout() == at::kStrided,
                      where, " must be a number, got a ", t.scalar_type(), " ", t.layout(),
                      " tensor of shape ", t.sizes());
    return t.item<double>();
  }
  TORCH_CHECK_VALUE(false, where, " must be a number, got ", v.tagKind());
}

// A flag: a bool (absent: dflt); with allow_none (foreach, fused), None too.
std::optional<bool> flag(const GenericDict& d, const std::string& key, const std::string& where,
                         std::optional<bool> dflt, bool allow_none) {
  const auto* v = find(d, key);
  if (v == nullptr) return dflt;
  if (allow_none && v->isNone()) return std::nullopt;
  TORCH_CHECK_VALUE(v->isBool(), where, "['", key, "'] must be a bool", allow_none ? " or None" : "",
                    ", got ", v->tagKind());
  return v->toBool();
}

at::Tensor cpu_copy(const at::Tensor& t) { return t.detach().to(at::kCPU, false, true); }

// ---- ASGD ------------------------------------------------------------------

// One option through the asgd_ op's rules (ASGDOptions::validate), alone, so
// that a refusal names the key.
void check_option(const std::string& where, const char* key,
                  const std::function<void(ASGDOptions&)>& set) {
  ASGDOptions probe;  // the defaults pass
  set(probe);
  try {
    probe.validate();
  } catch (c10::Error& e) {
    e.add_context(c10::str("in ", where, "['", key, "']"));
    throw;
  }
}

// Options of a saved group: Python's keys (torch.optim.ASGD or torchext),
// with the rules of Python's _check_group (torchext/optim/_checkpoint.py).
// `defaults`: the optimizer's, for keys a file from before them lacks.
ASGDOptions group_options(const GenericDict& g, const std::string& where,
                          const torch::optim::OptimizerParamGroup& current,
                          const ASGDOptions& defaults) {
  for (const char* key : {"lr", "lambd", "alpha", "t0", "weight_decay"}) get(g, key, where);
  ASGDOptions o;
  const auto& lr = get(g, "lr", where);
  if (lr.isTensor()) {
    const auto& t = lr.toTensor();
    TORCH_CHECK_VALUE(t.numel() == 1 && at::isFloatingType(t.scalar_type()) &&
                          t.layout() == at::kStrided,
                      where, "['lr'] must be a number or a 1-element floating tensor, got shape ",
                      t.sizes(), " ", t.scalar_type(), " ", t.layout());
    const auto device = current.params().empty() ? c10::Device(at::kCPU)
                                                 : current.params()[0].device();
    auto value = t.detach().to(device, t.scalar_type(), false, /*copy=*/true).reshape({});
    check_option(where, "lr", [&](ASGDOptions& x) { x.lr(value); });
    o.lr(value);
  } else {
    const double v = number(lr, where + "['lr']");
    check_option(where, "lr", [&](ASGDOptions& x) { x.lr(v); });
    o.lr(v);
  }
  const double lambd = number(get(g, "lambd", where), where + "['lambd']");
  check_option(where, "lambd", [&](ASGDOptions& x) { x.lambd(lambd); });
  const double alpha = number(get(g, "alpha", where), where + "['alpha']");
  check_option(where, "alpha", [&](ASGDOptions& x) { x.alpha(alpha); });
  const double t0 = number(get(g, "t0", where), where + "['t0']");
  check_option(where, "t0", [&](ASGDOptions& x) { x.t0(t0); });
  const double wd = number(get(g, "weight_decay", where), where + "['weight_decay']");
  check_option(where, "weight_decay", [&](ASGDOptions& x) { x.weight_decay(wd); });
  o.lambd(lambd).alpha(alpha).t0(t0).weight_decay(wd);
  o.maximize(*flag(g, "maximize", where, false, false));
  o.capturable(*flag(g, "capturable", where, false, false));
  const bool differentiable = *flag(g, "differentiable", where, false, false);
  flag(g, "foreach", where, std::nullopt, true);  // checked, not used in C++
  o.fused(flag(g, "fused", where, std::nullopt, true));
  TORCH_CHECK_VALUE(!(o.fused().value_or(false) && differentiable), where,
                    ": 'fused' and 'differentiable' cannot both be True");
  const auto* t0s = find(g, "t0_per_param");
  if (t0s != nullptr && !t0s->isNone()) {
    const std::string w = where + "['t0_per_param']";
    TORCH_CHECK_VALUE(t0s->isList(), w, " must be a list of one number per param, got ",
                      t0s->tagKind());
    std::vector<double> values;
    for (const c10::IValue v : t0s->toList()) {
      values.push_back(number(v, c10::str(w, "[", values.size(), "]")));
    }
    check_option(where, "t0_per_param", [&](ASGDOptions& x) { x.t0_per_param(values); });
    o.t0_per_param(values);
  }
  // Python's normalize_average_dtype: "float32" or torch.float32 (read as
  // the string "torch.float32", Note [Python pickles rewritten for the
  // TorchScript unpickler]), or None; absent (torch's checkpoint, an older torchext
  // one): the default, float32, as Python's __setstate__.
  const auto* avg = find(g, "average_dtype");
  if (avg == nullptr) {
    o.average_dtype(at::kFloat);
  } else if (avg->isNone()) {
    o.average_dtype(std::nullopt);
  } else {
    TORCH_CHECK_VALUE(avg->isString() && (avg->toStringRef() == "float32" ||
                                          avg->toStringRef() == "torch.float32"),
                      where, "['average_dtype']: average_dtype must be torch.float32 (a float32 "
                      "average for float16/bfloat16 parameters) or None (the parameter's "
                      "dtype), got ",
                      avg->isString() ? c10::str("'", avg->toStringRef(), "'")
                                      : std::string(avg->tagKind()));
    o.average_dtype(at::kFloat);
  }
  // Python's check_rounding: a bool and an int64; absent (torch's checkpoint,
  // an older torchext one): the optimizer's defaults, as Python's
  // __setstate__ keeps the constructor's.
  const bool sr = *flag(g, "stochastic_rounding", where, defaults.stochastic_rounding(), false);
  const auto* seed = find(g, "rounding_seed");
  TORCH_CHECK_VALUE(seed == nullptr || seed->isInt(), where,
                    "['rounding_seed'] must be an int (int64), got ",
                    seed == nullptr ? std::string() : seed->tagKind());
  TORCH_CHECK_VALUE(!(sr && differentiable), where,
                    "['stochastic_rounding']: stochastic_rounding=True needs the fused op, but "
                    "differentiable=True takes torch's unfused path, which rounds to nearest");
  check_option(where, "stochastic_rounding",
               [&](ASGDOptions& x) { x.stochastic_rounding(sr).fused(o.fused()); });
  o.stochastic_rounding(sr);
  o.rounding_seed(seed == nullptr ? defaults.rounding_seed() : seed->toInt());
  return o;
}

// One entry of Python's state: step/eta/mu are tensors or, in old
// checkpoints, Python numbers. The rules of Python's _check_entry.
std::unique_ptr<ASGDParamState> param_state(const c10::IValue& v, const std::string& where,
                                            const at::Tensor& p, const ASGDOptions& o) {
  TORCH_CHECK_VALUE(v.isGenericDict(), where, " must be a dict, got ", v.tagKind());
  const auto d = v.toGenericDict();
  for (const char* key : {"step", "eta", "mu", "ax"}) {
    TORCH_CHECK_VALUE(find(d, key) != nullptr, where, " lacks '", key,
                      "' (an ASGD state has step, eta, mu and ax)");
  }
  const auto& ax = get(d, "ax", where);
  TORCH_CHECK_VALUE(ax.isTensor(), where, "['ax'] must be a tensor, got ", ax.tagKind());
  auto scalar = [&](const char* key) {
    const auto& x = get(d, key, where);
    if (x.isTensor()) return x.toTensor();
    return at::full({}, number(x, c10::str(where, "['", key, "']")),
                    optim::scalar_state_dtype());
  };
  auto st = std::make_unique<ASGDParamState>();
  st->ax(ax.toTensor());
  st->step(scalar("step"));
  st->eta(scalar("eta"));
  st->mu(scalar("mu"));
  optim::adopt_loaded_state(*st, p, o, where);
  return st;
}

}  // namespace

void save_state_dict(const ASGD& optimizer, const std::string& path) {
  optimizer.check_not_averaged("torchext::save_state_dict");
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
    // "float32" or None, as Python's groups hold it (Note [Python pickles
    // rewritten for the TorchScript unpickler]).
    g.insert("average_dtype", o.average_dtype().has_value() ? c10::IValue("float32")
                                                            : c10::IValue());
    g.insert("stochastic_rounding", o.stochastic_rounding());
    g.insert("rounding_seed", o.rounding_seed());
    if (!o.t0_per_param().empty()) {  // Python's key (start_averaging)
      c10::impl::GenericList t0s(c10::AnyType::get());
      for (const double t : o.t0_per_param()) t0s.push_back(t);
      g.insert("t0_per_param", t0s);
    }
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
  // The rules of Python's validate_state_dict (torchext/optim/_checkpoint.py),
  // all checked before anything changes.
  const char* what = "torchext::load_state_dict(ASGD)";
  const auto root = read_dict(path, what);
  const std::string file = c10::str(what, ": '", path, "'");
  const auto* groups_v = find(root, "param_groups");
  const auto* state_v = find(root, "state");
  TORCH_CHECK_VALUE(state_v != nullptr && state_v->isGenericDict(), file,
                    " must have a 'state' dict");
  TORCH_CHECK_VALUE(groups_v != nullptr && groups_v->isList(), file,
                    " must have a 'param_groups' list");
  const auto saved_groups = groups_v->toList();
  auto& groups = optimizer.param_groups();
  TORCH_CHECK_VALUE(saved_groups.size() == groups.size(), file, " has ", saved_groups.size(),
                    " parameter groups but the optimizer has ", groups.size());
  // Check and convert everything first; assign only at the end.
  std::vector<ASGDOptions> options;
  std::unordered_map<int64_t, at::Tensor> id_to_param;
  std::unordered_map<int64_t, size_t> id_to_group;
  for (const auto gi : c10::irange(saved_groups.size())) {
    const std::string where = c10::str(file, " param_groups[", gi, "]");
    const c10::IValue sg_v = saved_groups.get(gi);
    TORCH_CHECK_VALUE(sg_v.isGenericDict(), where, " must be a dict with a 'params' list, got ",
                      sg_v.tagKind());
    const auto sg = sg_v.toGenericDict();
    const auto* ids_v = find(sg, "params");
    TORCH_CHECK_VALUE(ids_v != nullptr && ids_v->isList(), where,
                      " must be a dict with a 'params' list");
    const auto ids = ids_v->toList();
    const auto& params = groups[gi].params();
    TORCH_CHECK_VALUE(ids.size() == params.size(), where, "['params'] has ", ids.size(),
                      " ids but the optimizer's group has ", params.size(), " params");
    for (const auto k : c10::irange(ids.size())) {
      const c10::IValue id = ids.get(k);
      TORCH_CHECK_VALUE(id.isInt(), where, "['params'][", k, "] must be an int, got ",
                        id.tagKind());
      TORCH_CHECK_VALUE(id_to_param.emplace(id.toInt(), params[k]).second, where,
                        "['params'][", k, "]: id ", id.toInt(), " appears twice");
      id_to_group.emplace(id.toInt(), gi);
    }
    options.push_back(group_options(sg, where, groups[gi],
                                    static_cast<const ASGDOptions&>(optimizer.defaults())));
    optim::check_t0_per_param_size(options.back(), params.size(), where);
  }
  std::vector<std::pair<void*, std::unique_ptr<ASGDParamState>>> states;
  for (const auto& kv : state_v->toGenericDict()) {
    if (!kv.key().isInt()) continue;  // Python keeps unknown keys aside too
    auto it = id_to_param.find(kv.key().toInt());
    if (it == id_to_param.end()) continue;
    const std::string where = c10::str(file, " state[", kv.key().toInt(), "]");
    states.emplace_back(it->second.unsafeGetTensorImpl(),
                        param_state(kv.value(), where, it->second,
                                    options[id_to_group.at(kv.key().toInt())]));
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
  // The rules of Python's parse_state_dict (torchext/amp/_checkpoint.py),
  // all checked before anything changes.
  if (!options_.enabled()) return;
  const std::string where = "GradScaler.load_state_dict: the state_dict";
  TORCH_CHECK(sd.size() != 0,
              "GradScaler.load_state_dict: the source state dict is empty, possibly because it "
              "was saved from a disabled instance of GradScaler.");
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval",
                          "_growth_tracker"}) {
    get(sd, key, where);
  }
  const auto* version_v = find(sd, "_torchext_version");
  int64_t version = 0;
  if (version_v != nullptr) {
    TORCH_CHECK_VALUE(version_v->isInt() && version_v->toInt() >= 0, where,
                      "['_torchext_version'] must be an int >= 0, got ", version_v->tagKind(),
                      version_v->isInt() ? c10::str(" ", version_v->toInt()) : std::string());
    version = version_v->toInt();
  }
  TORCH_CHECK_VALUE(version <= kStateDictVersion, where, "['_torchext_version'] is ", version,
                    ", newer than this torchext understands (", kStateDictVersion,
                    "); upgrade torchext.");
  const auto num = [&](const char* key) {
    const double v = number(get(sd, key, where), c10::str(where, "['", key, "']"));
    TORCH_CHECK_VALUE(!std::isnan(v), where, "['", key, "'] must be a number, got nan");
    return v;
  };
  const auto integer = [&](const char* key, int64_t lo) {
    const double v = num(key);
    TORCH_CHECK_VALUE(std::isfinite(v) && v == std::trunc(v) && v >= static_cast<double>(lo),
                      where, "['", key, "'] must be an integer >= ", lo, ", got ", v);
    return static_cast<int64_t>(v);
  };
  GradScalerOptions o = options_;
  const double scale = num("scale");
  o.growth_factor(num("growth_factor"));
  o.backoff_factor(num("backoff_factor"));
  o.growth_interval(integer("growth_interval", 1));
  const int64_t growth = integer("_growth_tracker", 0);
  int64_t hyst_tracker = options_.hysteresis(), skipped = 0;
  if (version >= 1) {
    for (const char* key : {"hysteresis", "_hysteresis_tracker", "min_scale", "max_scale",
                            "skipped_steps"}) {
      TORCH_CHECK_VALUE(find(sd, key) != nullptr, where, " (torchext version ", version,
                        ") is missing '", key, "'");
    }
    o.hysteresis(integer("hysteresis", 1));
    hyst_tracker = integer("_hysteresis_tracker", 0);
    const double lo = num("min_scale"), hi = num("max_scale");
    o.min_scale(lo == 0.0 ? std::nullopt : std::optional<double>(lo));
    o.max_scale(hi == std::numeric_limits<double>::infinity() ? std::nullopt
                                                               : std::optional<double>(hi));
    skipped = integer("skipped_steps", 0);
    TORCH_CHECK_VALUE(hyst_tracker <= o.hysteresis(), where, "['_hysteresis_tracker'] (",
                      hyst_tracker, ") must be <= hysteresis (", o.hysteresis(), ")");
  }
  try {
    GradScaler check(GradScalerOptions(o).init_scale(scale));  // the constructor's rules
  } catch (c10::Error& e) {
    e.add_context(c10::str("in ", where));
    throw;
  }
  options_ = o;
  if (!scale_.defined()) {  // no state yet: create it on the CPU, movable by scale()
    ensure_state(at::kCPU);
    state_movable_ = true;
  }
  scale_.fill_(scale);
  growth_tracker_.fill_(growth);
  hysteresis_tracker_.fill_(hyst_tracker);
  skipped_steps_.fill_(skipped);
}

}  // namespace amp
}  // namespace torchext

// The whole torchext C++ API:
//   torchext::optim::ASGD / ASGDOptions   (torchext/optim/asgd.h)
//   torchext::amp::GradScaler / Options   (torchext/amp/grad_scaler.h)
//   torchext::nn::utils::clip_grad_norm_  (torchext/nn/clip_grad.h)
// Linking the torchext library registers the torch.ops.torchext.* custom
// ops, so TorchScript modules and AOTInductor packages that call them load.
#pragma once

#include <torchext/amp/grad_scaler.h>
#include <torchext/nn/clip_grad.h>
#include <torchext/optim/asgd.h>
#include <torchext/optim/averaging.h>

#include <string>

namespace torchext {

// Checkpoints in Python's format. save_state_dict writes what Python's
// torch.save(x.state_dict(), path) writes (read it with torch.load(path,
// weights_only=True) and load it into torchext.optim.ASGD / torch.optim.ASGD,
// or torchext.amp.GradScaler / torch.amp.GradScaler); load_state_dict reads
// such a file (from either class, old float step/eta/mu included), matching
// parameters by position as Python does; a group's t0_per_param (Python's
// start_averaging) is written and followed. load_state_dict applies Python's
// rules to the whole file before anything changes (structure, group count
// and sizes, unique int parameter ids, every hyperparameter with the
// constructor's rules, every state entry's keys, shape, dtype, layout and
// device against its parameter, finite non-negative step/eta/mu; the
// scaler's finite scale > 0 and its options with the constructor's rules,
// the format version) and throws c10::Error naming the entry
// ("param_groups[1]['lr']", "state[2]['ax']"), also for a truncated or
// corrupt file, leaving the object exactly as it was. Unknown extra keys are
// allowed, as in Python. State tensors are written on the CPU and loaded
// onto each parameter's device.
TORCHEXT_API void save_state_dict(const optim::ASGD& optimizer, const std::string& path);
TORCHEXT_API void load_state_dict(optim::ASGD& optimizer, const std::string& path);
TORCHEXT_API void save_state_dict(const amp::GradScaler& scaler, const std::string& path);
TORCHEXT_API void load_state_dict(amp::GradScaler& scaler, const std::string& path);

// The library's version, e.g. "0.1.0" (version.txt).
TORCHEXT_API const char* version();

// The CPU instruction set torchext's CPU kernels run with: "DEFAULT", "AVX2"
// or "AVX512", the best one built that ATen also picked
// (at::get_cpu_capability(), so ATEN_CPU_CAPABILITY=default forces DEFAULT).
TORCHEXT_API const char* cpu_isa();

// True once the library is loaded (its ops are then registered). Every
// translation unit that includes this header references it, so a program
// linked with -Wl,--as-needed still keeps the library (and its ops) even when
// it only uses them through torch::jit::load or AOTInductor.
TORCHEXT_API bool ops_registered();

namespace detail {
[[maybe_unused]] static const bool kTorchextLinked = ::torchext::ops_registered();
}  // namespace detail

}  // namespace torchext

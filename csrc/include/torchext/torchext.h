// The whole torchext C++ API:
//   torchext::optim::ASGD / ASGDOptions   (torchext/optim/asgd.h)
//   torchext::amp::GradScaler / Options   (torchext/amp/grad_scaler.h)
// Linking the torchext library registers the torch.ops.torchext.* custom
// ops, so TorchScript modules and AOTInductor packages that call them load.
#pragma once

#include <torchext/amp/grad_scaler.h>
#include <torchext/optim/asgd.h>
#include <torchext/optim/averaging.h>

#include <string>

namespace torchext {

// The library's version, e.g. "0.1.0".
TORCHEXT_API const char* version();

// True once the library is loaded (its ops are then registered). Every
// translation unit that includes this header references it, so a program
// linked with -Wl,--as-needed still keeps the library (and its ops) even when
// it only uses them through torch::jit::load or AOTInductor.
TORCHEXT_API bool ops_registered();

namespace detail {
[[maybe_unused]] static const bool kTorchextLinked = ::torchext::ops_registered();
}  // namespace detail

}  // namespace torchext

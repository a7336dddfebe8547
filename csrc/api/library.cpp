// The library-level functions torchext.h declares for the C++ API (the
// checkpoint functions are in state_dict.cpp, cpu_isa() with the CPU
// kernels' ISA choice in ops/cpu/isa_select.cpp).
#include <torchext/torchext.h>
#include <torchext/version.h>

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchext {

const char* version() { return TORCHEXT_VERSION; }

bool ops_registered() {
  return c10::Dispatcher::singleton().findSchema({"torchext::asgd_", ""}).has_value();
}

}  // namespace torchext

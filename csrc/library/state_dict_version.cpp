// Exports the checkpoint format version for Python (see
// torchext/amp/state_dict_version.h). Part of the ops library, so it is
// there also when the C++ API is left out (TORCHEXT_CPP_API=0).
#include <torchext/amp/state_dict_version.h>

extern "C" __attribute__((visibility("default"))) int64_t torchext_scaler_state_dict_version() {
  return torchext::amp::kStateDictVersion;
}

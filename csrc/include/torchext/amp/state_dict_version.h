// The version of torchext's keys in GradScaler.state_dict() (hysteresis,
// min/max scale, skip count), the one home of the number for both
// languages: the C++ GradScaler (csrc/api/state_dict.cpp) uses it, and
// Python reads it from the loaded library (torchext_scaler_state_dict_version
// below, through ctypes in torchext/amp/_checkpoint.py). A checkpoint of a
// newer version is refused by both.
#pragma once

#include <cstdint>

namespace torchext {
namespace amp {

inline constexpr int64_t kStateDictVersion = 1;

}  // namespace amp
}  // namespace torchext

// Exported by the library (csrc/library/state_dict_version.cpp), for Python.
extern "C" int64_t torchext_scaler_state_dict_version();

// ASGD state rules shared by the C++ API's step and its two checkpoint
// formats (torch::load in asgd.cpp, Python's in state_dict.cpp).
#pragma once

#include <torchext/optim/asgd.h>

#include <string>

namespace torchext {
namespace optim {

// As torch.optim: step/eta/mu are float64 when the default dtype is
// float64, else float32.
at::ScalarType scalar_state_dtype();

// Checks a state read from a checkpoint against its parameter (all four
// entries there, ax of the parameter's shape and kind, step/eta/mu one real
// number each) and moves it onto the parameter's device: ax in the
// parameter's dtype, step/eta/mu 0-d, float32/float64 as saved (else the
// scalar state dtype). Throws c10::Error naming `where`; `st` is only
// changed once every check passed.
void adopt_loaded_state(ASGDParamState& st, const at::Tensor& param, const std::string& where);

}  // namespace optim
}  // namespace torchext

// ASGD state rules shared by the C++ API's step and its two checkpoint
// formats (torch::load in asgd.cpp, Python's in state_dict.cpp). Python's
// are in torchext/optim/_checkpoint.py (checkpoints) and asgd.py
// (_create_state); tests/checkpoint_corruptions.py is the table both sides
// are tested on, cpp_tests/make_reference.py's unfused_reference compares
// the state creation and the unfused step.
#pragma once

#include <torchext/optim/asgd.h>

#include <memory>
#include <string>

namespace torchext {
namespace optim {

// As torch.optim: step/eta/mu are float64 when the default dtype is
// float64, else float32.
at::ScalarType scalar_state_dtype();

// The state of a parameter stepped for the first time (Python's
// ASGD._create_state, torch.optim.ASGD's): step 0, eta = lr (a tensor lr
// copied), mu 1 in the scalar state dtype on the parameter's device, and
// ax = zeros_like(param) (memory format kept) in o.average_dtype_for(param):
// float32 for float16/bfloat16 params unless o.average_dtype() is nullopt
// (Python's average_dtype_of).
std::unique_ptr<ASGDParamState> initial_state(const at::Tensor& param, const ASGDOptions& o);

// Checks a state read from a checkpoint against its parameter, Python's
// _check_entry/_check_values: all four entries there; ax dense, of the
// parameter's shape, floating (complex exactly when the parameter is) and not
// on meta unless the parameter is; step/eta/mu one real number each (not
// bool or complex), finite and >= 0 (read on the host). Throws c10::Error
// whose message starts with `where` and names the entry ("['ax']").
void check_loaded_state(const ASGDParamState& st, const at::Tensor& param,
                        const std::string& where);

// check_loaded_state, then moves the state onto the parameter's device: ax
// in o.average_dtype_for(param) whatever dtype was saved (Python's
// restore_scalar_state: a bf16 ax, torch's layout, widens to float32; a
// float32 one narrows where the group opted out), step/eta/mu 0-d,
// float32/float64 as saved (else the scalar state dtype). `o`: the loaded
// group's options. `st` is only changed once every check passed.
void adopt_loaded_state(ASGDParamState& st, const at::Tensor& param, const ASGDOptions& o,
                        const std::string& where);

// A group's t0_per_param is empty or holds one value per param.
void check_t0_per_param_size(const ASGDOptions& o, size_t num_params, const std::string& where);

}  // namespace optim
}  // namespace torchext

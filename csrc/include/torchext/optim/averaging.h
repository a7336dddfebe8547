// ASGD's averaged weights in C++: evaluate with them (an RAII guard that
// puts every stepped parameter's average `ax` in the parameter in place and
// restores both when it goes out of scope), and restart the average
// (NT-ASGD), as torchext.optim.ASGD does in Python. Where ax has the
// parameter's dtype the two are swapped (the torchext::swap_ op, no copy);
// where it is wider (the float32 average of float16/bfloat16 parameters,
// ASGDOptions::average_dtype) the parameter's training value waits in a
// scratch copy of its own dtype (2 B/element for bf16, for the guard's
// lifetime, allocated at construction), the parameter receives ax rounded
// once to its dtype, and ax is not touched.
//
//   {
//     auto averaged = optimizer.averaged_parameters();
//     evaluate(model);  // the parameters hold their averages here
//   }                   // training values and ax are back, bit for bit
#pragma once

#include <torchext/optim/asgd.h>

#include <vector>

namespace torchext {
namespace optim {

class TORCHEXT_API AveragedParameters {
 public:
  // Allocates the scratch copies, then swaps and copies; throws (changing
  // nothing) if the optimizer's parameters already hold their averages
  // (nested use), if a swap is refused or an allocation fails.
  explicit AveragedParameters(ASGD& optimizer);
  // Swaps back and restores the parameters with a wider ax from their
  // scratch copies (no allocation: it cannot fail). ASGD::step() throws
  // while a guard is alive.
  ~AveragedParameters();
  AveragedParameters(const AveragedParameters&) = delete;
  AveragedParameters& operator=(const AveragedParameters&) = delete;

 private:
  ASGD& optimizer_;
  std::vector<at::Tensor> params_, axs_;  // swapped (ax of the parameter's dtype)
  // Parameters with a wider ax (float32 for float16/bfloat16), and the
  // scratch copies of their training values.
  std::vector<at::Tensor> wide_params_, axs_wide_, saved_;
};

}  // namespace optim
}  // namespace torchext

// ASGD's averaged weights in C++: evaluate with them (an RAII guard that
// swaps every stepped parameter with its average `ax` in place, through the
// torchext::swap_ op, and swaps back when it goes out of scope), and restart
// the average (NT-ASGD), as torchext.optim.ASGD does in Python.
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
  // Swaps; throws (changing nothing) if the optimizer's parameters already
  // hold their averages (nested use).
  explicit AveragedParameters(ASGD& optimizer);
  // Swaps back. ASGD::step() throws while a guard is alive.
  ~AveragedParameters();
  AveragedParameters(const AveragedParameters&) = delete;
  AveragedParameters& operator=(const AveragedParameters&) = delete;

 private:
  ASGD& optimizer_;
  std::vector<at::Tensor> params_, axs_;
};

}  // namespace optim
}  // namespace torchext

// An asgd_ call's arguments as the kernels read them (ASGDArgs), decoded from
// the dispatcher's stack by name (asgd_args_from_stack), and pushed onto a
// stack in schema order by C++ callers (push_asgd_args). The names come from
// the table in asgd_schema.h.
#pragma once

#include "asgd_schema.h"
#include "../utils/cpu_scalars.h"
#include "../utils/tensor_refs.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include <optional>

namespace torchext {

struct ASGDArgs : ASGDHyperparams {
  TensorRefs params, grads, axs;
  // The schedule state: lists of one-element tensors, or (.packed) one 1-D
  // tensor each, element i for params[i].
  TensorRefs mus, etas, steps;
  at::Tensor packed_mus, packed_etas, packed_steps;  // defined for .packed
  // A 1-element floating tensor, on the CPU (read on the host: no sync) or
  // on the params' device (read there, so a changing lr neither syncs nor
  // recompiles).
  at::Tensor lr;
  std::optional<at::Tensor> grad_scale, found_inf;

  bool packed() const { return packed_steps.defined(); }
  // Entry i takes part in the step only when it has a gradient: a param
  // whose grad is undefined (only C++ callers can pass one) is left alone
  // (nothing of it is read or written, its ax may be undefined), as
  // torch.optim skips params without grads.
  bool active(size_t i) const { return grads[i].defined(); }
  // Where entry i's mu/eta/step live (float or double, see state_dtype()).
  void* mu_ptr(size_t i) const;
  void* eta_ptr(size_t i) const;
  void* step_ptr(size_t i) const;
  // lr on the host; only valid when lr lives on the CPU.
  double lr_on_host() const { return read_cpu_scalar(lr); }
};

// Decodes any asgd_ overload from the top of the dispatcher's stack, by
// argument name, without copying the tensor lists.
ASGDArgs asgd_args_from_stack(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
size_t asgd_num_args();

// Pushes one asgd_ call's arguments onto `stack` in schema order.
void push_asgd_args(torch::jit::Stack& stack, c10::IValue params, c10::IValue grads,
                    c10::IValue axs, c10::IValue mus, c10::IValue etas, c10::IValue steps,
                    const at::Tensor& lr, const ASGDHyperparams& hyper,
                    const std::optional<at::Tensor>& grad_scale,
                    const std::optional<at::Tensor>& found_inf);

}  // namespace torchext

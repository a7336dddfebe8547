// Registers one implementation of asgd_ for every overload (kASGDOverloads,
// asgd_schema.h) on one dispatch key, as a boxed kernel that decodes the
// dispatcher's stack itself (asgd_stack.h: no tensor list is copied). The
// CPU, CUDA and Meta kernels register through it.
#pragma once

#include "asgd_schema.h"
#include "asgd_stack.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

namespace torchext {

// Registers Impl for every overload of asgd_ on one dispatch key, as a boxed
// kernel (see TensorRefs).
template <void (*Impl)(const ASGDArgs&)>
void asgd_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Impl(asgd_args_from_stack(op, *stack));
  torch::jit::drop(*stack, asgd_num_args());
}

template <void (*Impl)(const ASGDArgs&)>
void register_asgd_kernels(torch::Library& m) {
  for (const char* name : kASGDOverloads) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&asgd_boxed<Impl>>());
  }
}

}  // namespace torchext

// The Autograd kernel of every torchext op. The ops are in-place updates
// (optimizer steps, loss-scale bookkeeping, the averaged-weights swap) that
// nothing differentiates through, so the kernel does what autograd owes a
// mutated tensor, bumping its version counter (so a tensor saved for
// backward and changed since fails loudly in backward), then redispatches
// below autograd.
//
// Why not torch's fallback for ops without an autograd kernel: it walks
// every tensor argument several times (requires_grad, hooks for a warning),
// which with thousands of parameters was the largest single per-tensor cost
// of an ASGD step after the argument conversion.
#include "../asgd_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

#include <vector>

namespace torchext {
namespace {

void bump(const at::Tensor& t) {
  if (t.defined()) t.unsafeGetTensorImpl()->bump_version();
}

void bump_written_then_redispatch(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                                  torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t first = stack->size() - args.size();
  // The call consumes its arguments: keep handles on what it writes (copying
  // an IValue list shares it, no per-tensor cost). asgd_ leaves the entries
  // of its lists whose grad is None alone: those are not bumped.
  std::vector<c10::IValue> written;
  c10::IValue grads;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* alias = args[i].alias_info();
    if (alias != nullptr && alias->isWrite()) written.push_back((*stack)[first + i]);
    if (args[i].name() == "grads") grads = (*stack)[first + i];
  }
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
  // Only after it succeeded: a refused call (bad input) changes nothing.
  const auto skipped = [&](size_t i) {
    if (!grads.isList()) return false;
    const c10::IValue& g = grads.toListRef()[i];
    return !g.isTensor() || !g.toTensor().defined();
  };
  for (const c10::IValue& v : written) {
    if (v.isTensor()) {
      bump(v.toTensor());
    } else if (v.isList()) {
      const auto& entries = v.toListRef();
      for (size_t i = 0; i < entries.size(); ++i) {
        if (entries[i].isTensor() && !skipped(i)) bump(entries[i].toTensor());
      }
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(torchext, Autograd, m) {
  for (const char* name : kASGDOverloads) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&bump_written_then_redispatch>());
  }
  for (const char* name : {"check_finite_", "unscale_", "update_scale_", "update_scale_.counted", "swap_",
                           "tensor_norms"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&bump_written_then_redispatch>());
  }
}

}  // namespace torchext

// The arguments of torchext::asgd_, named in one table: the schema and the
// overloads' handles.
//
// One table: TORCHEXT_ASGD_HYPERPARAMS below lists the op's scalar
// hyperparameters in schema order. The schema (schemas.cpp) is generated from
// it, the kernels decode the dispatcher's stack by name (asgd_args_from_stack,
// asgd_stack.h), C++ callers push arguments through push_asgd_args, and
// Python reads the names from the registered schema (torchext/optim/_op.py).
// Adding a hyperparameter means one line here, one field in the math, and a
// key of the same name in the optimizer's param groups / ASGDOptions.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

namespace torchext {

// X(name, C++ type, schema type): the keyword-only scalars of asgd_, between
// `lr` and `grad_scale`, in schema order.
#define TORCHEXT_ASGD_HYPERPARAMS(X) \
  X(lambd, double, "float")          \
  X(alpha, double, "float")          \
  X(t0, double, "float")             \
  X(weight_decay, double, "float")   \
  X(maximize, bool, "bool")

// The two overloads: the schedule state as lists of one-element tensors
// ("asgd_"), or packed, one 1-D tensor each with element i for params[i]
// ("asgd_.packed"). Everything else is the same.
enum class ASGDState { kLists, kPacked };
std::string asgd_schema(ASGDState state);
constexpr const char* kASGDOverloads[] = {"asgd_", "asgd_.packed"};

// The hyperparameters as a struct, fields named by the table.
struct ASGDHyperparams {
#define TORCHEXT_ASGD_FIELD(name, type, schema_type) type name{};
  TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_FIELD)
#undef TORCHEXT_ASGD_FIELD

  // From any object with the table's names as getters (ASGDOptions).
  template <typename Options>
  static ASGDHyperparams from(const Options& o) {
    ASGDHyperparams h;
#define TORCHEXT_ASGD_GET(name, type, schema_type) h.name = o.name();
    TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_GET)
#undef TORCHEXT_ASGD_GET
    return h;
  }
};

// The overload's handle, for C++ callers (the C++ API and the Python
// optimizer's group holder call the op through the dispatcher, boxed,
// exactly as Python does).
const c10::OperatorHandle& asgd_op(ASGDState state);

}  // namespace torchext

#include "asgd_schema.h"

namespace torchext {

std::string asgd_schema(ASGDState state) {
  const bool packed = state == ASGDState::kPacked;
  std::string s = packed ? "asgd_.packed(" : "asgd_(";
  s += "Tensor(a! -> *)[] params, Tensor[] grads, Tensor(b! -> *)[] axs, ";
  s += packed ? "Tensor(c!) mus, Tensor(d!) etas, Tensor(e!) steps"
              : "Tensor(c! -> *)[] mus, Tensor(d! -> *)[] etas, Tensor(e! -> *)[] steps";
  s += ", *, Tensor lr";
#define TORCHEXT_ASGD_SCHEMA_ARG(name, type, schema_type) s += ", " schema_type " " #name;
  TORCHEXT_ASGD_HYPERPARAMS(TORCHEXT_ASGD_SCHEMA_ARG)
#undef TORCHEXT_ASGD_SCHEMA_ARG
  s += ", Tensor? grad_scale=None, Tensor? found_inf=None) -> ()";
  return s;
}

const c10::OperatorHandle& asgd_op(ASGDState state) {
  static const auto lists =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "");
  static const auto packed =
      c10::Dispatcher::singleton().findSchemaOrThrow("torchext::asgd_", "packed");
  return state == ASGDState::kPacked ? packed : lists;
}

}  // namespace torchext

#include "update_scale_args.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

namespace torchext {

namespace {

using Binding = UpdateScaleBinding<UpdateScaleSettingList>;

c10::OperatorHandle update_scale_handle(const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow("torchext::update_scale_", overload);
}

template <typename Sig>
c10::TypedOperatorHandle<Sig> checked_update_scale_op(const char* overload) {
  check_update_scale_schema(overload);
  return update_scale_handle(overload).typed<Sig>();
}

}  // namespace

std::vector<std::string> update_scale_schema_settings(const c10::FunctionSchema& schema) {
  std::vector<std::string> out;
  for (const auto& a : schema.arguments()) {
    if (a.type()->kind() != c10::TypeKind::TensorType) {
      out.push_back(a.name() + ": " + a.type()->str());
    }
  }
  return out;
}

void check_update_scale_schema(const char* overload) {
  check_update_scale_settings_against(update_scale_handle(overload).schema(),
                                      kUpdateScaleSettings);
}

void call_update_scale(const UpdateScaleArgs& a) {
  const auto settings = Binding::arguments(a.settings);
  if (a.counted()) {
    static const auto op = checked_update_scale_op<Binding::Counted>("counted");
    std::apply(
        [&](const auto&... s) {
          op.call(a.scale, a.growth_tracker, a.hysteresis_tracker, a.found_inf,
                  a.last_step_skipped, a.skipped_steps, s...);
        },
        settings);
  } else {
    static const auto op = checked_update_scale_op<Binding::Plain>("");
    std::apply(
        [&](const auto&... s) {
          op.call(a.scale, a.growth_tracker, a.hysteresis_tracker, a.found_inf, s...);
        },
        settings);
  }
}

}  // namespace torchext

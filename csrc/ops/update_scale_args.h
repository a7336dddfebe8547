// An update_scale_ call's arguments as the kernels read them
// (UpdateScaleArgs: the state tensors and UpdateScaleSettings), the one home
// of its scalar settings' names, order and types (kUpdateScaleSettings), and
// how C++ callers call the op (call_update_scale). The schemas are plain
// strings in schemas.cpp; the kernels are typed (update_scale_registration.h)
// and take their settings in kUpdateScaleSettings' order, which the first
// call of each kernel and of call_update_scale checks against the registered
// schema's names and types (check_update_scale_schema).
//
// A new setting: the two schemas; a field of UpdateScaleSettings (and
// UpdateScaleSettings::from) and its entry in kUpdateScaleSettings, at its
// schema position; its rule in check_update_scale_settings (amp.cpp) and its
// use in math::update_scale (elementwise_math.h); GradScalerOptions; Python's
// GradScaler.update, which passes the settings positionally.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace torchext {

// update_scale_'s scalar settings (both overloads), by name. Plain values,
// so the CUDA kernel takes the struct itself as a kernel parameter: the
// schema's `float? min_scale / max_scale` None is the bound that does not
// clamp, the field's default (kNoMinScale, kNoMaxScale). growth_factor,
// backoff_factor and growth_interval have no default, as in the schema: a
// caller that leaves one out gets 0, which the validator refuses. Callers
// name each field (designated initializers: a field out of order does not
// compile):
//   UpdateScaleSettings{.growth_factor = 2.0, .backoff_factor = 0.5,
//                       .growth_interval = 2000, .hysteresis = 2}
struct UpdateScaleSettings {
  static constexpr double kNoMinScale = 0.0;
  static constexpr double kNoMaxScale = std::numeric_limits<double>::infinity();

  double growth_factor;
  double backoff_factor;
  int64_t growth_interval;
  int64_t hysteresis = 1;
  double min_scale = kNoMinScale;
  double max_scale = kNoMaxScale;

  // From any object with these names as getters, min/max_scale as
  // std::optional<double> (GradScalerOptions).
  template <typename Options>
  static UpdateScaleSettings from(const Options& o) {
    return {.growth_factor = o.growth_factor(),
            .backoff_factor = o.backoff_factor(),
            .growth_interval = o.growth_interval(),
            .hysteresis = o.hysteresis(),
            .min_scale = o.min_scale().value_or(kNoMinScale),
            .max_scale = o.max_scale().value_or(kNoMaxScale)};
  }
};

// One setting as the schema takes it: its name, the C++ type of its argument
// (the schema's float, int, float?: what the typed kernels take and
// call_update_scale passes) and its field. An optional argument's None is
// the field's default.
template <typename Arg, auto Field>
struct UpdateScaleSetting {
  using arg_type = Arg;
  using field_type =
      std::remove_cvref_t<decltype(std::declval<UpdateScaleSettings&>().*Field)>;
  static_assert(std::is_same_v<Arg, field_type> || std::is_same_v<Arg, std::optional<field_type>>,
                "a setting's argument is of its field's type, or an optional of it");

  const char* name;

  static void set(UpdateScaleSettings& s, const Arg& value) {
    if constexpr (std::is_same_v<Arg, field_type>) {
      s.*Field = value;
    } else {
      s.*Field = value.value_or(UpdateScaleSettings{}.*Field);
    }
  }
  static Arg get(const UpdateScaleSettings& s) { return s.*Field; }
};

// The name is the field's own: an entry cannot name one field and read another.
#define TORCHEXT_UPDATE_SCALE_SETTING(arg_type, field) \
  ::torchext::UpdateScaleSetting<arg_type, &::torchext::UpdateScaleSettings::field> { #field }

// The settings of both overloads, in schema order (they follow the tensors):
// the only place that order lives. The typed kernels' signatures, how they
// fill UpdateScaleSettings and what call_update_scale passes all follow it.
inline constexpr std::tuple kUpdateScaleSettings{
    TORCHEXT_UPDATE_SCALE_SETTING(double, growth_factor),
    TORCHEXT_UPDATE_SCALE_SETTING(double, backoff_factor),
    TORCHEXT_UPDATE_SCALE_SETTING(int64_t, growth_interval),
    TORCHEXT_UPDATE_SCALE_SETTING(int64_t, hysteresis),
    TORCHEXT_UPDATE_SCALE_SETTING(std::optional<double>, min_scale),
    TORCHEXT_UPDATE_SCALE_SETTING(std::optional<double>, max_scale),
};
using UpdateScaleSettingList = std::remove_cvref_t<decltype(kUpdateScaleSettings)>;

// A setting list as the op's arguments: the typed signatures of both
// overloads, UpdateScaleSettings from the arguments and back.
template <typename List>
struct UpdateScaleBinding;
template <typename... S>
struct UpdateScaleBinding<std::tuple<S...>> {
  using List = std::tuple<S...>;
  using Plain = void(const at::Tensor& scale, const at::Tensor& growth_tracker,
                     const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                     typename S::arg_type...);
  using Counted = void(const at::Tensor& scale, const at::Tensor& growth_tracker,
                       const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                       const at::Tensor& last_step_skipped, const at::Tensor& skipped_steps,
                       typename S::arg_type...);

  static UpdateScaleSettings settings(const typename S::arg_type&... values) {
    UpdateScaleSettings s{};
    (S::set(s, values), ...);
    return s;
  }
  static std::tuple<typename S::arg_type...> arguments(const UpdateScaleSettings& s) {
    return {S::get(s)...};
  }
  // "name: type" of each setting, the types as the schema spells them.
  static std::vector<std::string> described(const List& list) {
    return std::apply(
        [](const auto&... setting) {
          return std::vector<std::string>{
              (std::string(setting.name) + ": " +
               c10::getTypePtr<typename std::remove_cvref_t<decltype(setting)>::arg_type>()
                   ->str())...};
        },
        list);
  }
};

// The scalar arguments (every one but the tensors) of an update_scale_
// schema, "name: type", in schema order.
std::vector<std::string> update_scale_schema_settings(const c10::FunctionSchema& schema);

// Throws unless the schema's settings are `list`'s, by name and type, in
// order. `list` is kUpdateScaleSettings but in the tests.
template <typename List>
void check_update_scale_settings_against(const c10::FunctionSchema& schema, const List& list) {
  const auto theirs = update_scale_schema_settings(schema);
  const auto ours = UpdateScaleBinding<List>::described(list);
  TORCH_CHECK(theirs == ours, schema.operator_name(), ": the schema's settings (",
              c10::Join(", ", theirs), ") are not kUpdateScaleSettings' (", c10::Join(", ", ours),
              "), csrc/ops/update_scale_args.h");
}

// The check at first use: the registered schema of "torchext::update_scale_"
// (overload "" or "counted") against kUpdateScaleSettings.
void check_update_scale_schema(const char* overload);

inline const at::Tensor& undefined_tensor() {
  static const at::Tensor none;
  return none;
}

// One call's arguments: references to the caller's tensors (no refcount
// taken), so use it while they live. The tensors are 1-element, on the
// scale's device: scale float32, the trackers int32, found_inf float32
// (nonzero: an overflow), and for update_scale_.counted its skip record,
// last_step_skipped (bool) and skipped_steps (int64), which update_scale_
// leaves undefined.
struct UpdateScaleArgs {
  const at::Tensor& scale;
  const at::Tensor& growth_tracker;
  const at::Tensor& hysteresis_tracker;
  const at::Tensor& found_inf;
  const at::Tensor& last_step_skipped = undefined_tensor();
  const at::Tensor& skipped_steps = undefined_tensor();
  UpdateScaleSettings settings;

  bool counted() const { return last_step_skipped.defined() || skipped_steps.defined(); }
};

// How C++ callers (the C++ GradScaler, the composite kernel of .counted)
// call the op: through the dispatcher as Python's torch.ops.torchext
// .update_scale_ does, update_scale_.counted when a.counted(), the settings
// passed in kUpdateScaleSettings' order (the one place that hands them to
// the op; the handle is checked against the schema at first use).
void call_update_scale(const UpdateScaleArgs& a);

}  // namespace torchext

// update_scale_'s settings (csrc/ops/update_scale_args.h): kUpdateScaleSettings
// against the registered schemas (names and types, the check every kernel
// and call_update_scale run at first use), swapped lists refused, and the C++
// call (call_update_scale, settings by name) against Python's keyword call of
// both overloads (make_reference.py, update_scale_ref.pt), bit for bit.
// Compiled with the library's op sources (the library keeps them hidden).
#include "../csrc/ops/update_scale_args.h"
#include "common.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <string>
#include <tuple>

using torchext::UpdateScaleSetting;
using torchext::UpdateScaleSettings;
using namespace torchext_test;

namespace {

const c10::FunctionSchema& schema(const char* overload) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow("torchext::update_scale_", overload)
      .schema();
}

// kUpdateScaleSettings with entries i and j swapped.
template <size_t I, size_t J, size_t... K>
constexpr auto swapped(std::index_sequence<K...>) {
  constexpr auto& list = torchext::kUpdateScaleSettings;
  return std::tuple{std::get<K == I ? J : K == J ? I : K>(list)...};
}
template <size_t I, size_t J>
constexpr auto swapped() {
  return swapped<I, J>(
      std::make_index_sequence<std::tuple_size_v<torchext::UpdateScaleSettingList>>());
}

::testing::AssertionResult refused(const c10::FunctionSchema& s, const auto& list) {
  try {
    torchext::check_update_scale_settings_against(s, list);
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    if (msg.find("are not kUpdateScaleSettings'") != std::string::npos) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "refused with another message: " << msg;
  }
  return ::testing::AssertionFailure() << "not refused";
}

UpdateScaleSettings ref_settings(const std::map<std::string, torch::Tensor>& ref) {
  // By name, from the values Python passed by name.
  return {.growth_factor = R(ref, "growth_factor").item<double>(),
          .backoff_factor = R(ref, "backoff_factor").item<double>(),
          .growth_interval = R(ref, "growth_interval").item<int64_t>(),
          .hysteresis = R(ref, "hysteresis").item<int64_t>(),
          .min_scale = R(ref, "min_scale").item<double>(),
          .max_scale = R(ref, "max_scale").item<double>()};
}

::testing::AssertionResult same(const torch::Tensor& got, const torch::Tensor& want,
                                const char* what, int64_t step) {
  if (got.scalar_type() == want.scalar_type() && torch::equal(got, want)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << what << " at step " << step << ": got " << got
                                       << ", Python " << want;
}

}  // namespace

TEST(UpdateScaleArgs, SettingsAreTheSchemasByNameAndType) {
  // What each kernel and call_update_scale check at their first call.
  EXPECT_NO_THROW(torchext::check_update_scale_schema(""));
  EXPECT_NO_THROW(torchext::check_update_scale_schema("counted"));
  using Binding = torchext::UpdateScaleBinding<torchext::UpdateScaleSettingList>;
  for (const char* overload : {"", "counted"}) {
    EXPECT_EQ(torchext::update_scale_schema_settings(schema(overload)),
              Binding::described(torchext::kUpdateScaleSettings))
        << overload;
  }
  // The types as the schema spells them.
  EXPECT_EQ(Binding::described(torchext::kUpdateScaleSettings),
            (std::vector<std::string>{"growth_factor: float", "backoff_factor: float",
                                      "growth_interval: int", "hysteresis: int",
                                      "min_scale: float?", "max_scale: float?"}));
}

TEST(UpdateScaleArgs, ASwappedOrMistypedListIsRefused) {
  for (const char* overload : {"", "counted"}) {
    const auto& s = schema(overload);
    EXPECT_TRUE(refused(s, swapped<0, 1>())) << "growth_factor <-> backoff_factor";
    EXPECT_TRUE(refused(s, swapped<2, 3>())) << "growth_interval <-> hysteresis";
    EXPECT_TRUE(refused(s, swapped<4, 5>())) << "min_scale <-> max_scale";
    // The right names in the right order, growth_factor taken as a float?.
    const auto rest = std::apply([](const auto&, const auto&... tail) { return std::tuple{tail...}; },
                                 torchext::kUpdateScaleSettings);
    const UpdateScaleSetting<std::optional<double>, &UpdateScaleSettings::growth_factor>
        optional_growth{"growth_factor"};
    EXPECT_TRUE(refused(s, std::tuple_cat(std::tuple{optional_growth}, rest)))
        << "growth_factor as float?";
  }
}

TEST(UpdateScaleArgs, CppCallMatchesPythonsKeywordCall) {
  // Python named every setting (the schema binds them); C++ names them in
  // UpdateScaleSettings and call_update_scale passes them in
  // kUpdateScaleSettings' order. A swap of two of them anywhere on the C++
  // side changes the trajectory (or is refused): these settings all differ.
  const auto ref = load_ref("update_scale_ref.pt");
  const auto settings = ref_settings(ref);
  const auto found = R(ref, "op/found");
  auto scale = R(ref, "op/init_scale").clone();
  auto growth = torch::zeros({}, torch::kInt);
  auto hyst = torch::full({}, settings.hysteresis, torch::kInt);
  auto skipped = torch::zeros({}, torch::kBool);
  auto count = torch::zeros({}, torch::kLong);
  auto plain_scale = scale.clone(), plain_growth = growth.clone(), plain_hyst = hyst.clone();
  for (int64_t s = 0; s < found.size(0); ++s) {
    const auto f = found[s].clone();
    torchext::call_update_scale({.scale = scale,
                                 .growth_tracker = growth,
                                 .hysteresis_tracker = hyst,
                                 .found_inf = f,
                                 .last_step_skipped = skipped,
                                 .skipped_steps = count,
                                 .settings = settings});
    torchext::call_update_scale({.scale = plain_scale,
                                 .growth_tracker = plain_growth,
                                 .hysteresis_tracker = plain_hyst,
                                 .found_inf = f,
                                 .settings = settings});
    ASSERT_TRUE(same(scale, R(ref, "op/scale")[s], "scale", s));
    ASSERT_TRUE(same(growth, R(ref, "op/growth_tracker")[s], "growth_tracker", s));
    ASSERT_TRUE(same(hyst, R(ref, "op/hysteresis_tracker")[s], "hysteresis_tracker", s));
    ASSERT_TRUE(same(skipped, R(ref, "op/last_step_skipped")[s], "last_step_skipped", s));
    ASSERT_TRUE(same(count, R(ref, "op/skipped_steps")[s], "skipped_steps", s));
    ASSERT_TRUE(same(plain_scale, R(ref, "op/plain_scale")[s], "update_scale_'s scale", s));
    ASSERT_TRUE(same(plain_growth, R(ref, "op/plain_growth_tracker")[s],
                     "update_scale_'s growth_tracker", s));
    ASSERT_TRUE(same(plain_hyst, R(ref, "op/plain_hysteresis_tracker")[s],
                     "update_scale_'s hysteresis_tracker", s));
  }
  // The trajectory went through backoffs, clamps at both ends and growth.
  EXPECT_EQ(R(ref, "op/scale").min().item<float>(), settings.min_scale);
  EXPECT_EQ(R(ref, "op/scale").max().item<float>(), settings.max_scale);
}

TEST(UpdateScaleArgs, ValidatorRefusesAMissingSetting) {
  // A field left out of the designated initializers is 0: refused.
  const auto s = torch::ones({}), t = torch::zeros({}, torch::kInt), f = torch::zeros({});
  EXPECT_THROW(torchext::call_update_scale({.scale = s, .growth_tracker = t,
                                            .hysteresis_tracker = t, .found_inf = f,
                                            .settings = {.growth_factor = 2.0,
                                                         .backoff_factor = 0.5}}),
               c10::ValueError);
  // .counted with half of its skip record.
  const auto count = torch::zeros({}, torch::kLong);
  try {
    torchext::call_update_scale({.scale = s, .growth_tracker = t, .hysteresis_tracker = t,
                                 .found_inf = f, .skipped_steps = count,
                                 .settings = {.growth_factor = 2.0, .backoff_factor = 0.5,
                                              .growth_interval = 1}});
    ADD_FAILURE() << "not refused";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("last_step_skipped is undefined"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(count.item<int64_t>(), 0);
}

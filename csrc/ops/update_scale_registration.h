// Registers one implementation of update_scale_ on one dispatch key, as
// typed kernels that read their arguments as UpdateScaleArgs. The CPU, CUDA,
// Meta and composite kernels register through it.
#pragma once

#include "update_scale_args.h"

#include <torch/library.h>

namespace torchext {

// The typed kernels of both overloads. The dispatcher checks each signature
// against its schema's types at registration; the settings come in
// kUpdateScaleSettings' order, checked against the schema's names and types
// at each kernel's first call.
template <void (*Impl)(const UpdateScaleArgs&), typename List = UpdateScaleSettingList>
struct UpdateScaleKernels;
template <void (*Impl)(const UpdateScaleArgs&), typename... S>
struct UpdateScaleKernels<Impl, std::tuple<S...>> {
  using Binding = UpdateScaleBinding<std::tuple<S...>>;

  static void plain(const at::Tensor& scale, const at::Tensor& growth_tracker,
                    const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                    typename S::arg_type... settings) {
    static const bool checked = (check_update_scale_schema(""), true);
    (void)checked;
    run(scale, growth_tracker, hysteresis_tracker, found_inf, undefined_tensor(),
        undefined_tensor(), settings...);
  }
  static void counted(const at::Tensor& scale, const at::Tensor& growth_tracker,
                      const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                      const at::Tensor& last_step_skipped, const at::Tensor& skipped_steps,
                      typename S::arg_type... settings) {
    static const bool checked = (check_update_scale_schema("counted"), true);
    (void)checked;
    run(scale, growth_tracker, hysteresis_tracker, found_inf, last_step_skipped, skipped_steps,
        settings...);
  }

 private:
  static void run(const at::Tensor& scale, const at::Tensor& growth_tracker,
                  const at::Tensor& hysteresis_tracker, const at::Tensor& found_inf,
                  const at::Tensor& last_step_skipped, const at::Tensor& skipped_steps,
                  const typename S::arg_type&... settings) {
    Impl({.scale = scale,
          .growth_tracker = growth_tracker,
          .hysteresis_tracker = hysteresis_tracker,
          .found_inf = found_inf,
          .last_step_skipped = last_step_skipped,
          .skipped_steps = skipped_steps,
          .settings = Binding::settings(settings...)});
  }
};

// update_scale_ (Impl sees a.counted() false) and, unless the key leaves it
// to another kernel, update_scale_.counted (a.counted() true).
enum class UpdateScaleOverloads { kBoth, kPlainOnly, kCountedOnly };

template <void (*Impl)(const UpdateScaleArgs&)>
void register_update_scale_kernels(torch::Library& m,
                                   UpdateScaleOverloads which = UpdateScaleOverloads::kBoth) {
  using Kernels = UpdateScaleKernels<Impl>;
  if (which != UpdateScaleOverloads::kCountedOnly) {
    m.impl("update_scale_", TORCH_FN(Kernels::plain));
  }
  if (which != UpdateScaleOverloads::kPlainOnly) {
    m.impl("update_scale_.counted", TORCH_FN(Kernels::counted));
  }
}

}  // namespace torchext

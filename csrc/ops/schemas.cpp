// The one place where torchext's operator schemas live. Kernels register
// themselves per dispatch key in cpu/, cuda/ and meta/.
//
// Contract (see docs/architecture.md): every mutated list or tensor is
// annotated with (x!), nothing returned aliases an input (only
// tensor_norms returns a tensor, a new one); this is what torch.compile's auto-functionalization needs.
//
// A mutated *list* is written `Tensor(x! -> *)[]`. TorchScript's alias
// analysis records the write of a plain `Tensor(x!)[]` on the list value
// only, not on the tensors it holds; a list built at the call site
// (`asgd_([p], ...)`) is then a fresh value nothing reads afterwards, and
// dead-code elimination drops the whole call (the step silently does
// nothing). `-> *` says the list's elements may alias anything after the
// call, which makes the write one to the wildcard set that DCE must keep.
// (AliasAnalysisKind::CONSERVATIVE would also keep it, but TorchScript
// refuses it for a schema with alias annotations.) tests/compile/test_torchscript.py
// checks every op with a mutated list.
#include <torch/library.h>

TORCH_LIBRARY(torchext, m) {
  // Fused ASGD step over lists, in place. Matches torch.optim.ASGD; when
  // found_inf != 0 nothing at all is written (not even step/eta/mu); when
  // grad_scale is given, grads are unscaled on the fly (multiplied by the
  // float32 reciprocal, as GradScaler.unscale_ does); when clip_coef is given
  // (a float32 or float64 tensor: a gradient clip's coefficient), they are
  // then multiplied by it, rounded after each factor as torch's unscale_ and
  // clip leave the gradients (never folded into one factor, which the
  // largest loss scales overflow). lr is a
  // 1-element tensor: on the CPU it is read on the host (no sync), on the
  // params' device it is read there (a changing lr neither syncs nor
  // recompiles). C++ callers may put an undefined tensor in grads: that
  // entry is left alone, as torch.optim leaves params without grads (the
  // optimizer's C++ holder steps a whole group so). The kernels' typed
  // signature is asgd_kernel (asgd_registration.h), one for both overloads.
  m.def(
      "asgd_(Tensor(a! -> *)[] params, Tensor[] grads, Tensor(b! -> *)[] axs, "
      "Tensor(c! -> *)[] mus, Tensor(d! -> *)[] etas, Tensor(e! -> *)[] steps, *, "
      "Tensor lr, float lambd, float alpha, float t0, float weight_decay, bool maximize, "
      "Tensor? grad_scale=None, Tensor? found_inf=None, Tensor? clip_coef=None, "
      "int? rounding_seed=None, int[]? rounding_ids=None, int[]? rounding_offsets=None) -> ()");
  // With rounding_seed, fp16/bf16 params are rounded stochastically, not to
  // nearest (elementwise_math.h, "Stochastic rounding"): the random bits of
  // params[i]'s element j are keyed by the seed, rounding_ids[i] (its
  // identity in the optimizer; default i), the step being taken and
  // rounding_offsets[i] + j (its index in the unsharded tensor; default j).
  // Other dtypes ignore it.
  // The same with the schedule state packed: mus, etas and steps are each
  // one 1-D tensor whose element i belongs to params[i] (what
  // torchext.optim.ASGD keeps: its state entries are views of these). Per
  // tensor the op then reads and writes three array elements instead of
  // three 0-d tensors, the largest per-tensor cost left in a step of
  // thousands of small tensors.
  m.def(
      "asgd_.packed(Tensor(a! -> *)[] params, Tensor[] grads, Tensor(b! -> *)[] axs, "
      "Tensor(c!) mus, Tensor(d!) etas, Tensor(e!) steps, *, "
      "Tensor lr, float lambd, float alpha, float t0, float weight_decay, bool maximize, "
      "Tensor? grad_scale=None, Tensor? found_inf=None, Tensor? clip_coef=None, "
      "int? rounding_seed=None, int[]? rounding_ids=None, int[]? rounding_offsets=None) -> ()");
  // Read-only inf/NaN check: sets found_inf to 1 if any element is not finite.
  m.def("check_finite_(Tensor[] tensors, Tensor(a!) found_inf) -> ()");
  // tensors *= inv_scale, and found_inf = 1 if any input element is not
  // finite; one pass (torch's _amp_foreach_non_finite_check_and_unscale_).
  // With clip_coef (float32 or float64: a gradient clip's coefficient) each
  // element is then multiplied by it too, rounded to the tensor's dtype after
  // each factor: what torch's unscale_ followed by clip_grad_norm_ stores,
  // in the same pass.
  m.def(
      "unscale_(Tensor(a! -> *)[] tensors, Tensor(b!) found_inf, Tensor inv_scale, "
      "Tensor? clip_coef=None) -> ()");
  // Dynamic loss-scale update on the device: torch's _amp_update_scale_ plus
  // hysteresis and min/max clamps (math in elementwise_math.h).
  m.def(
      "update_scale_(Tensor(a!) scale, Tensor(b!) growth_tracker, "
      "Tensor(c!) hysteresis_tracker, Tensor found_inf, *, float growth_factor, "
      "float backoff_factor, int growth_interval, int hysteresis=1, "
      "float? min_scale=None, float? max_scale=None) -> ()");
  // The same update, and the skip record of GradScaler in the same call:
  // last_step_skipped = found_inf != 0 (0-d bool), skipped_steps +=
  // last_step_skipped (0-d int64), all on the scale's device. GradScaler.update
  // calls it once per iteration from Python, so its settings are positional:
  // torch.ops parses each keyword by name (~0.3 us each, positional ~0.05).
  m.def(
      "update_scale_.counted(Tensor(a!) scale, Tensor(b!) growth_tracker, "
      "Tensor(c!) hysteresis_tracker, Tensor found_inf, Tensor(d!) last_step_skipped, "
      "Tensor(e!) skipped_steps, float growth_factor, float backoff_factor, "
      "int growth_interval, int hysteresis=1, float? min_scale=None, "
      "float? max_scale=None) -> ()");
  // Per-tensor vector norms, as torch._foreach_norm: result[i] is the `ord`
  // norm of tensors[i] (any ord torch.linalg.vector_norm takes), in its
  // tensor's real dtype, held in the dtype torch.stack gives the list. With
  // inv_scale, the norms of tensors[i] * inv_scale (the unscaled gradients,
  // rounded as unscale_ stores them), and with found_inf, the inf/NaN check
  // of unscale_ in the same read (found_inf = 1 when an element of the
  // tensors is not finite). Nothing else is written. The kernel of
  // torchext.nn.utils.clip_grad_norm_ and GradScaler.clip_grad_norm_.
  m.def(
      "tensor_norms(Tensor[] tensors, float ord=2., Tensor? inv_scale=None, "
      "Tensor(a!)? found_inf=None) -> Tensor");
  // Averaged weights (ASGD.averaged_parameters): swaps the values of
  // tensors[i] and others[i] in place, element for element, for every i. The
  // tensors keep their storage (same data_ptr), so compiled code and captured
  // CUDA graphs that read them stay valid. Pairs must match in dtype, shape
  // and device; the lists may mix dtypes and layouts.
  m.def("swap_(Tensor(a! -> *)[] tensors, Tensor(b! -> *)[] others) -> ()");
}

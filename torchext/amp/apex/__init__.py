"""NVIDIA apex ``amp`` API on torch autocast and torchext's GradScaler.

Code written for apex::

    from apex import amp
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()

runs with only the import changed to ``from torchext import amp``, on CPU or
CUDA, without apex. How each piece maps (see docs/apex.md):

* ``O1``: each model's ``forward`` runs under ``torch.autocast`` (fp16 on
  CUDA, bf16 on CPU), instead of apex's monkey-patching of torch functions.
* ``O2``/``O3``: the model is cast to half (batchnorm kept fp32 in O2) and its
  inputs are cast on the way in; in O2 the optimizer holds fp32 master
  weights, its gradients are copied from the model after backward, and the
  masters are copied (rounded) back to the model after ``optimizer.step()``.
* Loss scaling: one :class:`torchext.amp.GradScaler` per loss
  (``num_losses``). ``scale_loss`` unscales and checks for inf/NaN on exit and
  updates that loss's scale on the device. An overflow makes the next
  ``optimizer.step()`` a no-op: optimizers with ``_step_supports_amp_scaling``
  (torchext's ASGD, torch's fused Adam/AdamW/SGD) skip on the device without a
  host sync; others are checked on the host once, as apex and torch do.

The package mirrors apex's own split: ``_amp_state`` (process-wide state),
``scaler`` (loss scalers), ``frontend`` (``initialize``, opt levels,
checkpoint state), ``handle`` (``scale_loss``, ``disable_casts``),
``_process_optimizer`` (optimizer class swap, master weights),
``_initialize`` (model checks, casts, forward patching) and ``wrap``
(cast decorators).
"""
from .frontend import initialize, load_state_dict, master_params, reset, state_dict
from .handle import disable_casts, scale_loss
from .wrap import (float_function, half_function, promote_function, register_float_function,
                   register_half_function, register_promote_function)

__all__ = [
    "initialize", "scale_loss", "master_params", "state_dict", "load_state_dict",
    "disable_casts", "register_half_function", "register_float_function",
    "register_promote_function", "half_function", "float_function", "promote_function",
    "reset",
]

"""Small adapters for training frameworks, one module per framework.

Each module imports its framework when it is imported itself; nothing in
torchext's core imports them. What each framework needs (most need none):

* PyTorch Lightning: nothing for the scaler (``plugins=[MixedPrecision(
  "16-mixed", device, scaler=torchext.amp.GradScaler())]``);
  :class:`torchext.integrations.lightning.MixedPrecision` also makes
  ``gradient_clip_val`` torchext's fused clip.
* HF accelerate and the HF Trainer: accelerate builds its own
  ``torch.amp.GradScaler`` and has no hook for another;
  :func:`torchext.integrations.accelerate.use_torchext_scaler` swaps it and
  routes ``accelerator.clip_grad_norm_`` to the fused clip.
* timm: :class:`torchext.integrations.timm.NativeScaler`, timm's
  ``NativeScaler`` on torchext's GradScaler, with the fused clip for
  ``clip_mode="norm"``.

Where each adapter fuses the clip, and where the framework's own clip runs:
docs/frameworks.md, "Gradient clipping".

``torchext.optim.ASGD`` needs no adapter anywhere: by default it is a plain
optimizer for every scaler but torchext's (``_step_supports_amp_scaling`` is
False unless ``capturable=True``), as ``torch.optim.ASGD`` is.
"""

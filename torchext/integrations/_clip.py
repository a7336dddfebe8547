"""When a framework's clip may become torchext's fused one (shared by the
adapters): the framework clips the gradients of ``parameters``, the fused
clip those of an optimizer; the two are the same clip only when they are
the same gradients."""
from __future__ import annotations

from typing import Iterable

import torch

from .._compile_compat import param_groups


def clips_the_same_grads(parameters: torch.Tensor | Iterable[torch.Tensor], optimizer) -> bool:
    """Whether the gradients of ``parameters`` are exactly the optimizer's
    (each once; parameters without a gradient do not count, as in the
    norm), and there is at least one."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    given = [p for p in parameters if p.grad is not None]
    owned = [p for g in param_groups(optimizer) for p in g["params"] if p.grad is not None]
    ids = {id(p) for p in given}
    return bool(given) and len(given) == len(ids) == len(owned) and ids == {id(p) for p in owned}

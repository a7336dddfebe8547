"""Drop-ins for ``torch.nn.utils``' gradient clipping on torchext's fused
multi-tensor norm (``torch.ops.torchext.tensor_norms``)."""
from .clip_grad import clip_grad_norm_, clip_grads_with_norm_, get_total_norm

__all__ = ["clip_grad_norm_", "clip_grads_with_norm_", "get_total_norm"]

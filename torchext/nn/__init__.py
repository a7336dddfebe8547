"""torchext.nn: drop-ins for ``torch.nn`` helpers (``torchext.nn.utils``)."""
from . import utils

__all__ = ["utils"]

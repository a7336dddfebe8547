import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import torchext  # noqa: E402,F401  (loads the ops)

requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and torchext.has_cuda_kernels()),
    reason="needs a CUDA GPU and torchext built with CUDA kernels")

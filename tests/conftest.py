import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import torchext  # noqa: E402,F401  (loads the ops)

requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and torchext.has_cuda_kernels()),
    reason="needs a CUDA GPU and torchext built with CUDA kernels")


def pytest_collection_modifyitems(session, config, items):
    # The framework integration tests (tests/integrations) run last: the
    # frameworks they train in change process-wide state.
    integrations = os.path.join(os.path.dirname(__file__), "integrations") + os.sep
    items.sort(key=lambda item: str(item.path).startswith(integrations))

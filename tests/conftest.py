"""pytest setup for the whole suite: the tested torchext (checkout or installed
wheel), the compiler handed to inductor in the no-compiler run, and the order
in which the folders run. Tests live by what they test: ops/, optim/, amp/,
nn/ (gradient clipping), compile/, checkpoints/, package/, integrations/."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import torchext  # noqa: E402,F401  (loads the ops)
import helpers  # noqa: E402

if os.environ.get("TORCHEXT_TEST_INSTALLED") == "1":
    # scripts/test_wheel.sh: the suite must test the installed wheel, never
    # the checkout's torchext/ next to these tests.
    assert helpers.INSTALLED, (
        f"TORCHEXT_TEST_INSTALLED=1 but torchext was imported from the checkout "
        f"({torchext.__file__}), not from an installed wheel")
if os.environ.get("TORCHEXT_TEST_INDUCTOR_CXX"):
    # The installed-wheel run hides every compiler (CXX=false, shims on PATH);
    # only torch.compile's inductor, which needs one to compile its own C++
    # code on CPU, is handed g++ by absolute path.
    import torch._inductor.config as _inductor_config
    _inductor_config.cpp.cxx = (None, os.environ["TORCHEXT_TEST_INDUCTOR_CXX"])


def pytest_report_header(config):
    where = "installed wheel" if helpers.INSTALLED else "source tree (in-place build)"
    return [f"torchext {torchext.__version__} under test: {os.path.dirname(torchext.__file__)} "
            f"({where})"]


requires_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and torchext.has_cuda_kernels()),
    reason="needs a CUDA GPU and torchext built with CUDA kernels")


def pytest_collection_modifyitems(session, config, items):
    # The framework integration tests (tests/integrations) run last: the
    # frameworks they train in change process-wide state.
    integrations = os.path.join(os.path.dirname(__file__), "integrations") + os.sep
    items.sort(key=lambda item: str(item.path).startswith(integrations))

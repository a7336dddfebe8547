"""The benchmark helpers now live in the package (torchext/bench/common.py,
used by `python -m torchext bench`); re-exported for scripts here."""
from torchext.bench.common import (  # noqa: F401
    bandwidth,
    copy_bandwidth,
    inplace_bandwidth,
    make_params,
    table,
    timeit,
)

"""``python -m torchext``: see torchext/cli/__init__.py."""
import sys

from torchext.cli import main

if __name__ == "__main__":
    sys.exit(main())

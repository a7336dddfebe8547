"""``python -m torchext``: see torchext/cli/__init__.py."""

from torchext.cli import main_exit

if __name__ == "__main__":
    main_exit()

"""``python -m persistkit`` and the ``persistkit`` script: the command line lives in
``persistkit/_cli/`` (one module per group of verbs); see ``persistkit --help``."""

from __future__ import annotations

import sys

from ._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())

"""``python -m stragglerkit.cli``: the ``stragglerkit`` command line."""

from __future__ import annotations

import sys

from stragglerkit.cli import main

__all__: list[str] = []

sys.exit(main())

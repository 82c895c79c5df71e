"""The ``needs`` mark of tests/_require.py: a test that needs what is missing is skipped, or fails
under ``CI=true``."""

from __future__ import annotations

import pytest
from _require import require_or_skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(what, missing, reason): skipped where `what` is missing, failed under CI=true"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs"):
        if mark.kwargs["missing"]:
            require_or_skip(mark.kwargs["what"], mark.kwargs["reason"])

"""Tests that share one launch (a process group, ``horovodrun``) check their own cases of it: the
launch runs the cases of the tests this session runs (``-k``, ``-m`` and node ids select them)."""

from __future__ import annotations

import pytest


def selected_tests(request: pytest.FixtureRequest) -> set[tuple[str, str]]:
    """(function name, parameter id or "") of each test of the requesting module that this session runs."""
    return {
        (item.originalname, item.callspec.id if hasattr(item, "callspec") else "")
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module
    }

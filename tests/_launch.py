"""Tests that share one launch (a process group, ``horovodrun``) check their own cases of it: the
launch runs the cases of the tests this session runs (``-k``, ``-m`` and node ids select them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from _dist import run_group, several

Case = tuple[int, tuple[str, str], Callable[..., Any], tuple[Any, ...]]
"""A case of a shared process group: (world size, (the test that checks it, that test's parameter
id or ""), its body ``fn(rank, world_size, *args)``, args)."""


def selected_tests(request: pytest.FixtureRequest) -> set[tuple[str, str]]:
    """(function name, parameter id or "") of each test of the requesting module that this session runs."""
    return {
        (item.originalname, item.callspec.id if hasattr(item, "callspec") else "")
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.module is request.module
    }


def launches(
    request: pytest.FixtureRequest, cases: dict[str, Case], timeout: float = 900.0
) -> Callable[[str], dict[int, Any]]:
    """For a module-scoped fixture: ``launches(request, cases)(case)`` is {rank: what the case's body
    returned}. The first case asked for at a world size launches one process group that runs, one
    after the other (tests/_dist.py, ``several``), every case at that size whose test this session
    runs; the others read what it returned."""
    selected = selected_tests(request)
    done: dict[int, dict[int, dict[str, Any]]] = {}

    def result(case: str) -> dict[int, Any]:
        n = cases[case][0]
        if n not in done:
            chosen = {
                name: (fn, args) for name, (size, test, fn, args) in cases.items() if size == n and test in selected
            }
            done[n] = run_group(n, several, chosen, timeout=timeout)
        return {rank: out[case] for rank, out in done[n].items()}

    return result

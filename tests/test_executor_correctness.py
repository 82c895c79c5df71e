"""Real multi-process gloo runs: every applicable algorithm, sizes, dtypes; bit-identical on all ranks.

Every world size runs all its cases in one process group (one launch, :func:`launches`), each case
a sweep over algorithms x sizes x dtypes under a session of its own (tests/correctness_body.py).
Each result is compared with a float64 reference within a rounding bound for the dtype
(2·n·eps·Σ|x_i|) and with torch.distributed.all_reduce's within twice that; every rank's result
must have the same bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _dist import run_group, several
from _launch import selected_tests
from correctness_body import SIZES, sweep

LARGE = (1 << 20) + 3
SMALL_SIZES = tuple(s for s in SIZES if s < (1 << 20))
HALVES = (torch.float32, torch.bfloat16)
CLOSED_FORM_SIZES = (0, 1, 7, 1000, LARGE)
LP_SLOWDOWNS = {5: {2: 8 / 7}, 8: {3: 1.5}, 7: {1: 1.25, 4: 2.5}}
RING_SLOWDOWNS = {5: {2: 8 / 7}, 8: {3: 8 / 7, 6: 1.25}}


def _closed_form(wait_mode: str) -> dict[str, Any]:
    return {
        "sizes": CLOSED_FORM_SIZES,
        "dtypes": HALVES,
        "tuning": {"closed_form_plans": True, "wait_mode": wait_mode},
    }


def _cases(n: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """The sweeps at world size ``n``: {case: (the test that checks it, the sweep's arguments)}."""
    return {
        "all_sizes": ("test_all_sizes", {}),
        "small_sizes": ("test_small_sizes", {"sizes": SMALL_SIZES}),
        "concurrent_waits": (
            "test_small_sizes_with_concurrent_waits",
            {"sizes": SMALL_SIZES, "tuning": {"wait_mode": "concurrent"}},
        ),
        "ordered_waits": (
            "test_large_size_with_ordered_waits",
            {"sizes": (LARGE,), "dtypes": (torch.float32,), "tuning": {"wait_mode": "ordered"}},
        ),
        "closed_form/ordered": ("test_plans_from_one_ranks_closed_form", _closed_form("ordered")),
        "closed_form/concurrent": ("test_plans_from_one_ranks_closed_form", _closed_form("concurrent")),
        "optcc_ramp": (
            "test_optcc_with_a_ramp",
            {
                "sizes": (LARGE, 1001),
                "dtypes": HALVES,
                "only": ("optcc",),
                "tuning": {"optcc_message_bytes": 16 * 1024},
            },
        ),
        "optcc_lp": (
            "test_optcc_with_lp_sizes",
            {
                "sizes": (0, 1, 7, 1001, LARGE),
                "dtypes": (torch.float32, torch.float16),
                "only": ("optcc",),
                "slowdowns": LP_SLOWDOWNS.get(n),
                "tuning": {"optcc_sizing": "lp"},  # the spawned ranks do not see monkeypatch
            },
        ),
        "balanced_ring": (
            "test_balanced_ring_near_full_rate",
            {
                "sizes": (LARGE, 1001),
                "dtypes": (torch.float32, torch.float16),
                "only": ("balanced_ring",),
                "slowdowns": RING_SLOWDOWNS.get(n),
            },
        ),
        "small_sizes_slow": ("test_small_sizes_slow", {"sizes": SMALL_SIZES}),
        "large_size": ("test_large_size", {"sizes": (LARGE,)}),
        "large_world": ("test_large_worlds", {"sizes": SMALL_SIZES}),
    }


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest) -> Callable[[int], dict[str, dict[int, Any]]]:
    """``launches(n)``: {case: {rank: its sweep}} for every case at world size ``n`` whose test is
    selected in this session, all run in one process group (launched once per world size)."""
    selected = {(test, int(params.split("-")[0])) for test, params in selected_tests(request) if params}
    done: dict[int, dict[str, dict[int, Any]]] = {}

    def at(n: int) -> dict[str, dict[int, Any]]:
        if n not in done:
            cases = {case: args for case, (test, args) in _cases(n).items() if (test, n) in selected}
            runs = {case: (functools.partial(sweep, **kwargs), ()) for case, kwargs in cases.items()}
            by_rank = run_group(n, several, runs, timeout=900.0)
            done[n] = {case: {rank: by_rank[rank][case] for rank in by_rank} for case in cases}
        return done[n]

    return at


def check_results(n: int, results: dict[int, dict]) -> None:
    base = results[0]
    assert base["algorithms"], f"no algorithm ran at world size {n}"
    for rank in range(1, n):
        for case, digest in base["digests"].items():
            assert results[rank]["digests"][case] == digest, f"n={n} {case}: rank {rank} differs from rank 0"
    for rank in range(n):
        bad = {case: r for case, r in results[rank]["worst"].items() if not r <= 1.0}
        assert not bad, f"n={n} rank {rank}: error above the dtype's bound (ratio > 1): {bad}"


@pytest.mark.parametrize("n", [2, 3, 4])
def test_all_sizes(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    check_results(n, launches(n)["all_sizes"])


@pytest.mark.parametrize("n", [5, 8])
def test_small_sizes(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    check_results(n, launches(n)["small_sizes"])


@pytest.mark.parametrize("n", [4, 5])
def test_small_sizes_with_concurrent_waits(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    """Buffers under 64 KiB normally use the ordered wait; force one waiter thread per channel."""
    check_results(n, launches(n)["concurrent_waits"])


@pytest.mark.parametrize("n", [3, 4])
def test_large_size_with_ordered_waits(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    """Large buffers normally use the concurrent waiters; force the global wait order."""
    check_results(n, launches(n)["ordered_waits"])


@pytest.mark.parametrize("n", [4, 7])
def test_plans_from_one_ranks_closed_form(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    """The runtime's path above 64 ranks (planner/rank_lowering.py: one rank's ops, wait order
    by key, fused averaging in closed form), forced at small n: every algorithm, exact and
    bit-identical, sums and averages, with both wait modes; every plan from the closed form."""
    for wait_mode in ("ordered", "concurrent"):
        results = launches(n)[f"closed_form/{wait_mode}"]
        check_results(n, results)
        plans = len(results[0]["digests"])  # one plan per case (sums and averages)
        assert all(r["closed_form"] == plans for r in results.values()), (wait_mode, plans, results[0]["closed_form"])


@pytest.mark.parametrize("n", [5, 8])
def test_optcc_with_a_ramp(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    """Small OptCC messages give deep pipelines, whose end segments are smaller than the rest."""
    from stragglerkit.planner.policy import optcc_segments
    from stragglerkit.schedules.optcc import optcc

    message_bytes = 16 * 1024
    segments = optcc_segments(4 * LARGE, n, message_bytes=message_bytes)
    plan = optcc(n, {1: 3.0}, segments=segments)
    sizes = set(plan.chunk_sizes)
    assert segments >= 30 and plan.params["ramp"] >= 10 and len(sizes) > 10, (segments, sizes)
    results = launches(n)["optcc_ramp"]
    check_results(n, results)
    assert all(case.startswith("optcc/") for case in results[0]["digests"])


@pytest.mark.parametrize(("n", "slowdowns"), [(n, LP_SLOWDOWNS[n]) for n in (5, 8, 7)])
def test_optcc_with_lp_sizes(
    n: int,
    slowdowns: dict[int, float],
    monkeypatch: pytest.MonkeyPatch,
    launches: Callable[[int], dict[str, dict[int, Any]]],
) -> None:
    """OptCC with the chunk sizes of the LP (schedules/chunk_sizing.py): unequal chunks, down to
    empty ones in the small buffers; fills at l < 2; sum and avg."""
    from stragglerkit.planner import policy
    from stragglerkit.schedules.registry import Situation, generate

    monkeypatch.setattr(policy, "OPTCC_SIZING", "lp")  # every case, also where auto keeps the closed form
    situation = policy.optcc_situation(Situation(world_size=n, slowdowns=slowdowns), 4 * LARGE)
    schedule = generate("optcc", situation)
    assert schedule.params["sizing"] == "lp" and len(set(schedule.chunk_weights())) > 1, schedule.params
    results = launches(n)["optcc_lp"]
    check_results(n, results)
    assert {case.split("/")[0] for case in results[0]["digests"]} == {"optcc"}


@pytest.mark.parametrize(("n", "slowdowns"), [(n, RING_SLOWDOWNS[n]) for n in (5, 8)])
def test_balanced_ring_near_full_rate(
    n: int, slowdowns: dict[int, float], launches: Callable[[int], dict[str, dict[int, Any]]]
) -> None:
    """The balanced ring as the runtime runs it for a NIC near full rate: unequal chunks in 2-5
    slices, a large odd size and a small one, sum and avg."""
    results = launches(n)["balanced_ring"]
    check_results(n, results)
    assert {case.split("/")[0] for case in results[0]["digests"]} == {"balanced_ring"}


@pytest.mark.slow
@pytest.mark.parametrize("n", [6, 7])
def test_small_sizes_slow(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    check_results(n, launches(n)["small_sizes_slow"])


@pytest.mark.slow
@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_large_size(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    check_results(n, launches(n)["large_size"])


@pytest.mark.slow
@pytest.mark.parametrize("n", [12, 16])
def test_large_worlds(n: int, launches: Callable[[int], dict[str, dict[int, Any]]]) -> None:
    check_results(n, launches(n)["large_world"])

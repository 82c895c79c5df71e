"""The balanced ring: shares, the checker on many shapes, and the simulated time against its bound."""

from __future__ import annotations

import math

import pytest

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules import check
from stragglerkit.schedules.balanced_ring import (
    MAX_SLICES,
    balanced_ring,
    balanced_shares,
    default_slices,
    phase_time,
)
from stragglerkit.schedules.optcc import optcc
from stragglerkit.schedules.registry import Situation, generate
from stragglerkit.schedules.ring import ring
from stragglerkit.sim.simulator import Network, simulate

SIZE, BANDWIDTH = 32 * 2**20, 125e6


def test_healthy_shares_are_equal_and_the_schedule_is_the_ring() -> None:
    for n in (2, 3, 5, 8):
        assert balanced_shares([1.0] * n) == pytest.approx([1 / n] * n)
        sched = balanced_ring(n)
        assert sched.params["slices"] == 1 and len(set(sched.chunk_weights())) == 1
        net = Network.uniform(n, 1e-5, BANDWIDTH)
        assert simulate(sched, SIZE, net).makespan == pytest.approx(simulate(ring(n), SIZE, net).makespan, rel=1e-9)


@pytest.mark.parametrize("n", [4, 5, 8, 16])
@pytest.mark.parametrize("slowdown", [1.05, 8 / 7, 1.25, 1.4])
def test_one_slow_rank_gets_the_closed_form_shares(n: int, slowdown: float) -> None:
    slow = n // 2
    shares = balanced_shares([slowdown if r == slow else 1.0 for r in range(n)])
    y = (3 - 2 * slowdown) / (3 + (n - 3) * slowdown)
    x = (1 - (n - 3) * y) / 3
    near = {(slow - 1) % n, slow, (slow + 1) % n}
    assert shares == pytest.approx([x if r in near else y for r in range(n)], abs=1e-9)
    assert sum(shares) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "slowdowns",
    [[1, 1, 1.3, 1, 1, 1, 1.2, 1], [1.1, 1.1, 1, 1, 1, 1], [2.0, 1, 1, 1, 1], [1, 1.5, 1.5, 1.5, 1, 1, 1, 1, 1]],
)
def test_shares_minimise_the_busiest_link(slowdowns: list[float]) -> None:
    """No other share vector tried (equal shares, and each share nudged both ways) does better."""
    shares = balanced_shares(slowdowns)
    best = phase_time(shares, slowdowns)
    n = len(slowdowns)
    assert best <= phase_time([1 / n] * n, slowdowns) + 1e-12
    for j in range(n):
        for d in (-0.01, 0.01):
            other = [s + (d if i == j else -d / (n - 1)) for i, s in enumerate(shares)]
            if min(other) >= 0:
                assert best <= phase_time(other, slowdowns) + 1e-12


CASES = [
    (2, {}),
    (2, {1: 1.5}),
    (3, {0: 1.2}),
    (4, {3: 8 / 7}),
    (5, {2: 1.25}),
    (7, {0: 1.1, 4: 1.3}),
    (8, {3: 8 / 7}),
    (8, {6: 1.2, 7: 1.2}),
    (12, {5: 3.0}),
    (16, {1: 1.05}),
]


@pytest.mark.parametrize(("n", "slowdowns"), CASES)
def test_passes_the_checker(n: int, slowdowns: dict[int, float]) -> None:
    """``check`` raises on any fault (a chunk not fully reduced, a race, unmatched messages)."""
    for slices in (None, 1, 2, 5):
        sched = balanced_ring(n, slowdowns, slices=slices)
        k = sched.params["slices"]
        report = check(sched)
        assert sched.num_chunks == n * k and report.num_messages == n * 2 * (n - 1) * k


@pytest.mark.parametrize("n", [*range(2, 17), 24, 31, 32, 63, 64])
def test_passes_the_checker_at_every_world_size(n: int) -> None:
    """The checker's world sizes (tests/test_checker.py), one rank at l = 8/7 and, from 4 ranks
    on, a second one at 1.3 two ranks further."""
    slowdowns = {n // 2: 8 / 7} if n < 4 else {n // 2: 8 / 7, (n // 2 + 2) % n: 1.3}
    sched = balanced_ring(n, slowdowns)
    report = check(sched)
    assert report.num_messages == n * 2 * (n - 1) * sched.params["slices"]


@pytest.mark.parametrize("n", [5, 8, 16])
@pytest.mark.parametrize("slowdown", [1.05, 8 / 7, 1.25])
def test_the_default_slices_reach_the_bound_and_beat_the_ring(n: int, slowdown: float) -> None:
    slow = {n // 2: slowdown}
    sched = balanced_ring(n, slow)
    net = Network.uniform(n, 0.0, BANDWIDTH, slow)
    seconds = simulate(sched, SIZE, net).makespan
    bound = 2 * sched.params["phase_time"] * SIZE / BANDWIDTH
    if sched.params["slices"] < MAX_SLICES:
        assert seconds == pytest.approx(bound, rel=2e-3)
    assert seconds < 0.99 * simulate(ring(n), SIZE, net).makespan
    assert seconds >= bound * (1 - 1e-4)  # integer chunk weights round the shares


def test_near_one_it_beats_optcc_and_at_two_optcc_wins() -> None:
    """p = 8 (docstring figures): at l = 8/7 4.9 % over the fault-free ring (OptCC at 9 segments:
    11.4 %); at l = 2 OptCC is faster, so the runtime must choose by the cost model."""
    n = 8
    fault_free = simulate(ring(n), SIZE, Network.uniform(n, 0.0, BANDWIDTH)).makespan
    for slowdown, balanced_wins in ((8 / 7, True), (2.0, False)):
        net = Network.uniform(n, 0.0, BANDWIDTH, {3: slowdown})
        balanced = simulate(balanced_ring(n, {3: slowdown}), SIZE, net).makespan
        pipeline = simulate(optcc(n, {3: slowdown}, 9), SIZE, net).makespan
        assert (balanced < pipeline) == balanced_wins
        if balanced_wins:
            assert balanced / fault_free == pytest.approx(1.0492, abs=5e-4)


def test_default_slices() -> None:
    assert default_slices([0.25] * 4) == 1
    assert default_slices([0.197, 0.082]) == 3
    assert default_slices([0.5, 0.0]) == MAX_SLICES
    assert default_slices([0.9, 0.001]) == MAX_SLICES


def test_registry_builds_it() -> None:
    sched = generate("balanced_ring", Situation(world_size=8, slowdowns={3: 8 / 7}))
    assert sched.algorithm == "balanced_ring" and sched.params["slices"] == 3


@pytest.mark.parametrize(
    ("call", "error", "pattern"),
    [
        (lambda: balanced_ring(1), NotApplicableError, "at least 2 ranks"),
        (lambda: balanced_ring(4, {4: 1.5}), NotApplicableError, "rank 4"),
        (lambda: balanced_ring(4, {1: 0.5}), ValueError, "l >= 1"),
        (lambda: balanced_ring(4, {1: math.inf}), ValueError, "finite"),
        (lambda: balanced_ring(4, {1: 1.5}, slices=0), ValueError, "slices"),
        (lambda: balanced_shares([1.0]), ValueError, "at least 2"),
    ],
)
def test_bad_input_is_rejected_clearly(call, error: type, pattern: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=pattern):
        call()

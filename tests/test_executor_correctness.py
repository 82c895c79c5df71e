"""Real multi-process gloo runs: every applicable algorithm, sizes, dtypes; bit-identical on all ranks.

One process group per world size loops over algorithms x sizes x dtypes inside (tests/correctness_body.py).
Each result is compared with a float64 reference within a rounding bound for the dtype
(2·n·eps·Σ|x_i|) and with torch.distributed.all_reduce's within twice that; every rank's result
must have the same bytes.
"""

from __future__ import annotations

import pytest
import torch
from _dist import run_group
from correctness_body import DTYPES, SIZES, sweep

SMALL_SIZES = tuple(s for s in SIZES if s < (1 << 20))


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
def test_all_sizes(n: int) -> None:
    check_results(n, run_group(n, sweep))


@pytest.mark.parametrize("n", [5, 8])
def test_small_sizes(n: int) -> None:
    check_results(n, run_group(n, sweep, SMALL_SIZES))


@pytest.mark.parametrize("n", [4, 5])
def test_small_sizes_with_concurrent_waits(n: int) -> None:
    """Buffers under 64 KiB normally use the ordered wait; force one waiter thread per channel."""
    check_results(n, run_group(n, sweep, SMALL_SIZES, DTYPES, (), None, {"wait_mode": "concurrent"}))


@pytest.mark.parametrize("n", [3, 4])
def test_large_size_with_ordered_waits(n: int) -> None:
    """Large buffers normally use the concurrent waiters; force the global wait order."""
    check_results(n, run_group(n, sweep, ((1 << 20) + 3,), (torch.float32,), (), None, {"wait_mode": "ordered"}))


@pytest.mark.parametrize("n", [4, 7])
def test_plans_from_one_ranks_closed_form(n: int) -> None:
    """The runtime's path above 64 ranks (planner/rank_lowering.py: one rank's ops, wait order
    by key, fused averaging in closed form), forced at small n: every algorithm, exact and
    bit-identical, sums and averages, with both wait modes."""
    sizes = (0, 1, 7, 1000, (1 << 20) + 3)
    for wait_mode in ("ordered", "concurrent"):
        tuning = {"closed_form_plans": True, "wait_mode": wait_mode}
        check_results(n, run_group(n, sweep, sizes, (torch.float32, torch.bfloat16), (), None, tuning))


@pytest.mark.parametrize("n", [5, 8])
def test_optcc_with_a_ramp(n: int) -> None:
    """Small OptCC messages give deep pipelines, whose end segments are smaller than the rest."""
    from stragglerkit.planner.policy import optcc_segments
    from stragglerkit.schedules.optcc import optcc

    message_bytes = 16 * 1024
    numel = (1 << 20) + 3
    segments = optcc_segments(4 * numel, n, message_bytes=message_bytes)
    plan = optcc(n, {1: 3.0}, segments=segments)
    sizes = set(plan.chunk_sizes)
    assert segments >= 30 and plan.params["ramp"] >= 10 and len(sizes) > 10, (segments, sizes)
    tuning = {"optcc_message_bytes": message_bytes}
    results = run_group(n, sweep, (numel, 1001), (torch.float32, torch.bfloat16), ("optcc",), None, tuning)
    check_results(n, results)
    assert all(case.startswith("optcc/") for case in results[0]["digests"])


@pytest.mark.parametrize(("n", "slowdowns"), [(5, {2: 8 / 7}), (8, {3: 1.5}), (7, {1: 1.25, 4: 2.5})])
def test_optcc_with_lp_sizes(n: int, slowdowns: dict[int, float], monkeypatch: pytest.MonkeyPatch) -> None:
    """OptCC with the chunk sizes of the LP (schedules/chunk_sizing.py): unequal chunks, down to
    empty ones in the small buffers; fills at l < 2; sum and avg."""
    from stragglerkit.planner import policy
    from stragglerkit.schedules.registry import Situation, generate

    monkeypatch.setattr(policy, "OPTCC_SIZING", "lp")  # every case, also where auto keeps the closed form
    numel = (1 << 20) + 3
    situation = policy.optcc_situation(Situation(world_size=n, slowdowns=slowdowns), 4 * numel)
    schedule = generate("optcc", situation)
    assert schedule.params["sizing"] == "lp" and len(set(schedule.chunk_weights())) > 1, schedule.params
    tuning = {"optcc_sizing": "lp"}  # the spawned ranks do not see monkeypatch
    sizes = (0, 1, 7, 1001, numel)
    results = run_group(n, sweep, sizes, (torch.float32, torch.float16), ("optcc",), slowdowns, tuning)
    check_results(n, results)
    assert {case.split("/")[0] for case in results[0]["digests"]} == {"optcc"}


@pytest.mark.parametrize(("n", "slowdowns"), [(5, {2: 8 / 7}), (8, {3: 8 / 7, 6: 1.25})])
def test_balanced_ring_near_full_rate(n: int, slowdowns: dict[int, float]) -> None:
    """The balanced ring as the runtime runs it for a NIC near full rate: unequal chunks in 2-5
    slices, a large odd size and a small one, sum and avg."""
    results = run_group(n, sweep, ((1 << 20) + 3, 1001), (torch.float32, torch.float16), ("balanced_ring",), slowdowns)
    check_results(n, results)
    assert {case.split("/")[0] for case in results[0]["digests"]} == {"balanced_ring"}


@pytest.mark.slow
@pytest.mark.parametrize("n", [6, 7])
def test_small_sizes_slow(n: int) -> None:
    check_results(n, run_group(n, sweep, SMALL_SIZES))


@pytest.mark.slow
@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_large_size(n: int) -> None:
    check_results(n, run_group(n, sweep, ((1 << 20) + 3,)))


@pytest.mark.slow
@pytest.mark.parametrize("n", [12, 16])
def test_large_worlds(n: int) -> None:
    check_results(n, run_group(n, sweep, SMALL_SIZES, timeout=400))

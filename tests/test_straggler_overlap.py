"""StragglAR's pre-phase really overlaps the straggler's delay (and so does direct's).

The straggler sleeps before its call; the punctual ranks' recorded timings must show their whole
pre-phase done during the delay, started without waiting for the straggler. Both algorithms run
in one 4-rank group, one after the other (tests/_launch.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fault_bodies
import pytest
from _launch import Case
from _launch import launches as launched

N, STRAGGLER, DELAY = 4, 1, 1.0
CASES: dict[str, Case] = {
    algorithm: (
        N,
        ("test_punctual_ranks_work_while_the_straggler_is_late", algorithm),
        fault_bodies.straggler_overlap,
        (algorithm, STRAGGLER, DELAY),
    )
    for algorithm in ("direct", "stragglar")
}


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest) -> Callable[[str], dict[int, Any]]:
    """``launches(algorithm)``: {rank: what ``straggler_overlap`` returned}, from one process group."""
    return launched(request, CASES, timeout=600.0)


@pytest.mark.parametrize("algorithm", ["direct", "stragglar"])
def test_punctual_ranks_work_while_the_straggler_is_late(
    algorithm: str, launches: Callable[[str], dict[int, Any]]
) -> None:
    from stragglerkit.schedules.registry import Situation, applicable

    n, straggler, delay = N, STRAGGLER, DELAY
    applies = applicable(Situation(world_size=n, straggler=straggler))
    assert algorithm in applies, f"{algorithm} must apply at n={n} with a straggler; only {applies} do"
    pre_phase = {"direct": "pre_allreduce", "stragglar": "reduce_scatter"}[algorithm]
    results = launches(algorithm)
    arrival = results[straggler]["arrival"]
    for rank in range(n):
        if rank == straggler:
            continue
        pre = [t for t in results[rank]["timings"] if t[0].startswith(pre_phase)]
        assert pre, f"rank {rank} has no {pre_phase} messages"
        assert all(peer != straggler for _, peer, *_ in pre)
        # the whole pre-phase finished during the straggler's delay ...
        assert max(end for *_, end in pre) < arrival, f"rank {rank}: pre-phase not done before the straggler came"
        # ... and it did not wait for the straggler to start
        assert min(start for *_, start, _ in pre) < arrival - delay * 0.5e9
    # after arrival, the straggler's part is short compared with the delay
    assert results[straggler]["finished"] - arrival < delay * 1e9

"""Peer faults on real gloo groups: a dead or stalled peer gives a clear error naming it, no hang.

A dead peer takes a process group of its own; the stalled peer's wait modes share one, each from
a clean slate (tests/_dist.py, ``several``)."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import fault_bodies
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from _launch import Case
from _launch import launches as launched

WAIT_MODES = ["ordered", "concurrent"]
"""The executor's two ways of observing completions (csrc/channel_waiters.h)."""


def _dies_entry(rank: int, n: int, store_path: str, wait_mode: str, queue: Any) -> None:
    store = dist.FileStore(store_path, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    try:
        queue.put((rank, fault_bodies.peer_dies(rank, n, wait_mode)))
    except BaseException:
        queue.put((rank, traceback.format_exc()))


@pytest.mark.parametrize("wait_mode", WAIT_MODES)
def test_dead_peer_raises_naming_it(wait_mode: str) -> None:
    n = 3
    ctx = mp.get_context("spawn")
    queue: multiprocessing.Queue[Any] = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_dies_entry, args=(r, n, path, wait_mode, queue), daemon=True) for r in range(n)]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=120) for _ in range(n - 1))
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    assert sorted(results) == [0, 1]
    for rank, out in results.items():
        assert not isinstance(out, str), (rank, out)  # a traceback
        error = out["error"]
        assert "CollectiveError" in out["kinds"] and "StragglerKitError" in out["kinds"], (rank, error)
        assert "algorithm ring" in error and f"on rank {rank}" in error
    for rank in (0, 1):
        assert "rank 2" in results[rank]["error"], results[rank]
        assert fault_bodies.blames_its_peer(results[rank], 2), results[rank]


STALLED: dict[str, Case] = {
    mode: (4, ("test_stalled_peer_times_out_naming_it", mode), fault_bodies.peer_stalls, (mode,)) for mode in WAIT_MODES
}
"""The stalled peer in each wait mode: one 4-rank group runs both (tests/_launch.py)."""


@pytest.fixture(scope="module")
def stalled(request: pytest.FixtureRequest) -> Callable[[str], dict[int, Any]]:
    """``stalled(wait_mode)``: {rank: ``peer_stalls``'s result} in that wait mode, from one 4-rank
    group that runs the wait modes of the tests selected in this session one after the other, each
    from a clean slate (tests/_dist.py, ``several``)."""
    return launched(request, STALLED, timeout=600.0)


@pytest.mark.parametrize("wait_mode", WAIT_MODES)
def test_stalled_peer_times_out_naming_it(wait_mode: str, stalled: Callable[[str], dict[int, Any]]) -> None:
    results = stalled(wait_mode)
    # ranks 1 and 3 talk to the stalled rank 2: each either times out itself, or is stopped first by
    # the other's abort note -- and then reports that root cause. Either way the error names rank 2.
    for rank in (1, 3):
        error = results[rank]["error"]
        assert "CollectiveError" in results[rank]["kinds"] and "algorithm ring" in error, error
        own_timeout = "timed out after 2" in error and "rank 2 (logical 2)" in error
        root_cause = "aborted because rank" in error and "(timeout involving rank 2)" in error
        assert own_timeout or root_cause, error
        assert fault_bodies.blames_its_peer(results[rank], 2), results[rank]
    assert any("timed out after 2" in results[rank]["error"] for rank in (1, 3)), results
    # rank 0 either timed out itself (waiting for rank 1 or 3, which wait for rank 2) or was told
    assert "CollectiveError" in results[0]["kinds"], results[0]
    assert "timed out" in results[0]["error"] or "(timeout involving rank" in results[0]["error"]
    # the stalled rank fails on arrival, without waiting for its own timeout: it was told, or finds
    # its connections closed (gloo closes a pair whose wait timed out)
    stalled = results[2]["error"]
    assert "CollectiveError" in results[2]["kinds"] and "algorithm ring" in stalled, stalled
    assert "aborted because rank" in stalled or "the connection is gone" in stalled, stalled
    assert results[2]["seconds"] < 5.0, results[2]  # its own timeout is 10 s
    assert results[0]["seconds"] < 10.0

"""Bad input and faults on real gloo groups: every rank gets a clear error, nobody hangs."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
from typing import Any

import fault_bodies
import torch.distributed as dist
import torch.multiprocessing as mp
from _dist import run_group


def test_bad_arguments_on_every_rank_then_recovery() -> None:
    results = run_group(3, fault_bodies.bad_arguments_everywhere)
    for out in results.values():
        assert out["non_contiguous"].startswith("ValueError") and "contiguous" in out["non_contiguous"]
        assert out["sparse"].startswith("ValueError") and "dense" in out["sparse"]
        assert out["dtype"].startswith("ValueError") and "int8" in out["dtype"]
        assert out["complex"].startswith("ValueError") and "complex64" in out["complex"]
        assert out["op"].startswith("ValueError") and "'max'" in out["op"]
        assert out["avg_int"].startswith("ValueError") and "floating" in out["avg_int"]
        assert out["algorithm"].startswith("ValueError") and "butterfly" in out["algorithm"]
        assert out["straggler"].startswith("ValueError") and "straggler" in out["straggler"]
        assert out["good"] == "ok" and out["good_value"], out


def test_one_rank_with_bad_arguments_stops_the_others() -> None:
    results = run_group(3, fault_bodies.one_rank_bad_arguments)
    assert results[1].startswith("ValueError") and "contiguous" in results[1]
    for rank in (0, 2):
        assert results[rank].startswith("StragglerKitError"), results[rank]
        assert "rank 1 failed (invalid arguments" in results[rank], results[rank]
        assert f"on rank {rank}" in results[rank]


def test_size_mismatch_is_caught_on_every_rank_before_data_moves() -> None:
    results = run_group(4, fault_bodies.size_mismatch)
    for rank, out in results.items():
        assert out["error"].startswith("StragglerKitError"), (rank, out)
        assert "algorithm ring" in out["error"]
    for rank, out in results.items():
        assert "mismatch" in out["error"], (rank, out)
    for rank in (1, 3):  # ring neighbours of rank 2: found it themselves or were told by rank 2
        assert "rank 2" in results[rank]["error"]
    detailed = [out["error"] for out in results.values() if "mismatch detected before any data moved" in out["error"]]
    assert detailed and all("1000 elements of Float" in e and "1001 elements" in e for e in detailed), detailed
    assert results[2]["unchanged"], "the mismatched rank's tensor was written"


def test_dtype_mismatch_is_caught_on_every_rank() -> None:
    results = run_group(3, fault_bodies.dtype_mismatch)
    for rank, out in results.items():
        assert out["error"].startswith("StragglerKitError") and "mismatch" in out["error"], (rank, out)
    assert "Double" in results[0]["error"] and "Float" in results[0]["error"]
    assert results[0]["unchanged"]


def _dies_entry(rank: int, n: int, store_path: str, queue: Any) -> None:
    store = dist.FileStore(store_path, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    try:
        queue.put((rank, fault_bodies.peer_dies(rank, n)))
    except BaseException:
        queue.put((rank, traceback.format_exc()))


def test_dead_peer_raises_naming_it() -> None:
    n = 3
    ctx = mp.get_context("spawn")
    queue: multiprocessing.Queue[Any] = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_dies_entry, args=(r, n, path, queue), daemon=True) for r in range(n)]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=120) for _ in range(n - 1))
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    assert sorted(results) == [0, 1]
    for rank, error in results.items():
        assert error.startswith("StragglerKitError"), (rank, error)
        assert "algorithm ring" in error and f"on rank {rank}" in error
    for rank in (0, 1):
        assert "rank 2" in results[rank], results[rank]


def test_stalled_peer_times_out_naming_it() -> None:
    results = run_group(4, fault_bodies.peer_stalls)
    for rank in (1, 3):
        error = results[rank]["error"]
        assert error.startswith("StragglerKitError") and "timed out after 2" in error, error
        assert "rank 2 (logical 2)" in error and "algorithm ring" in error
    # rank 0 either timed out itself (waiting for rank 1 or 3, which wait for rank 2) or was told
    assert results[0]["error"].startswith("StragglerKitError")
    assert "timed out" in results[0]["error"] or "(timeout involving rank" in results[0]["error"]
    # the stalled rank learns on arrival that the call was aborted, without waiting for its own timeout
    assert "aborted because rank" in results[2]["error"] and results[2]["seconds"] < 1.5, results[2]
    assert results[0]["seconds"] < 10.0

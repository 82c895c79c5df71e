"""Partial synchronisation on real ranks (stragglerkit.selective.coordinator): real processes, a real
gloo group, the rendezvous store as the control channel. Every synchronisation the coordinator
launched is checked against the members' models before it: the members end with exactly their
weighted average, bit-identical, and ranks outside the group keep training undisturbed."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from _dist import run_group

from stragglerkit.errors import ConfigError, PeerError
from stragglerkit.selective import PartialReduceController, SelectiveConfig, SelectiveReduceController
from stragglerkit.selective.coordinator import RankSync, SyncCoordinator, run_store

NUMEL = 1001


def _train(rank: int, world_size: int, method: str, duration: float, seed: int) -> dict[str, Any]:
    import stragglerkit

    stragglerkit.init(config=stragglerkit.Config().replace(sync={"partial": True}))
    store = run_store(f"test-{method}")
    model = torch.full((NUMEL,), float(rank)) + torch.arange(NUMEL) / NUMEL
    buffer = torch.empty_like(model)
    sync = RankSync(store, rank, world_size, buffer, timeout=60.0)
    coordinator = None
    if rank == 0:
        if method == "selective":
            config = SelectiveConfig(p=2, eta=0.3, theta=1.0, dt=0.01, model_bytes=4 * NUMEL)
            bandwidth = {r: 1e8 * (1 + r % 2) for r in range(world_size)}
            controller: Any = SelectiveReduceController(config, world_size, bandwidth)
        else:
            controller = PartialReduceController(world_size, world_size if method == "allreduce" else 2)
        coordinator = SyncCoordinator(store, controller, duration).start()
    rng = random.Random(seed * 100 + rank)
    iterations, seen = 0, []
    dist.barrier()
    while True:
        time.sleep(rng.uniform(0.005, 0.03))  # the compute of one iteration
        model.add_(0.001 * (rank + 1))  # a local update
        iterations += 1
        buffer.copy_(model)
        before = buffer.clone()
        done = sync.ready(iterations)
        if done is None:
            break
        seen.append((done.sync_id, before.tolist(), buffer.tolist(), iterations))  # plain lists cross processes
        model.copy_(buffer)
    sync.close(timeout=60)
    records = []
    if coordinator is not None:
        coordinator.join(timeout=60)
        assert coordinator.error is None, coordinator.error
        records = [(r.id, r.members, r.weights, r.full) for r in coordinator.records]
    return {"seen": seen, "records": records, "iterations": iterations}


@pytest.mark.parametrize("method", ["partial", "selective", "allreduce"])
def test_every_launched_group_averages_its_members_exactly(method: str) -> None:
    world_size = 5
    results = run_group(world_size, _train, method, 2.0, 7, timeout=180)
    records = results[0]["records"]
    assert len(records) >= 3, records
    by_sync: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    for rank, result in results.items():
        for sync_id, before, after, _ in result["seen"]:
            by_sync.setdefault(sync_id, {})[rank] = (torch.tensor(before), torch.tensor(after))
    for sync_id, members, weights, _full in records:
        if sync_id not in by_sync:  # launched at the very end: the run stopped first
            continue
        assert sorted(by_sync[sync_id]) == sorted(members), (sync_id, members)
        expected = sum(w * by_sync[sync_id][m][0].double() for m, w in zip(members, weights, strict=True))
        afters = [by_sync[sync_id][m][1] for m in members]
        assert all(torch.equal(afters[0], a) for a in afters), f"sync {sync_id}: members differ"
        torch.testing.assert_close(afters[0].double(), expected, rtol=1e-6, atol=1e-6)
        if method == "allreduce":
            assert sorted(members) == list(range(world_size))
        else:
            assert len(members) >= 2
        assert sum(weights) == pytest.approx(1.0)
    # every rank took part in at least one synchronisation
    assert all(result["seen"] for result in results.values())


def _silent_rank(rank: int, world_size: int) -> str:
    """Rank 2 never reports: the controller's worker timeout names it on every rank."""
    import stragglerkit

    stragglerkit.init(config=stragglerkit.Config().replace(sync={"partial": True}))
    store = run_store("test-timeout")
    buffer = torch.zeros(8)
    sync = RankSync(store, rank, world_size, buffer, timeout=60.0)
    if rank == 0:
        controller = PartialReduceController(world_size, world_size, worker_timeout=1.0)
        SyncCoordinator(store, controller, duration=30.0).start()
    if rank == 2:
        time.sleep(4.0)
        return "silent"
    try:
        sync.ready(1)
    except PeerError as err:
        return f"{err.peer}: {err}"
    return "no error"


def test_a_worker_that_never_reports_is_named_on_every_rank() -> None:
    results = run_group(3, _silent_rank, timeout=120)
    for rank in (0, 1):
        assert results[rank].startswith("2: "), results[rank]
        assert "worker 2" in results[rank] or "rank 2" in results[rank], results[rank]


def _not_allowed(rank: int, world_size: int) -> str:
    import stragglerkit

    stragglerkit.init()
    try:
        RankSync(run_store("test-not-allowed"), rank, world_size, torch.zeros(4))
    except ConfigError as err:
        return str(err)
    return "no error"


def test_partial_synchronisation_must_be_allowed_in_the_configuration() -> None:
    for message in run_group(2, _not_allowed, timeout=120).values():
        assert "sync={'partial': True}" in message and "changes what training computes" in message


def _decision(store: Any, index: int) -> dict[str, Any]:
    import datetime
    import json

    store.wait([f"decision/{index}"], datetime.timedelta(seconds=30))
    return dict(json.loads(store.get(f"decision/{index}").decode()))


def test_a_member_s_ready_report_before_its_group_s_done_ends_that_group_first() -> None:
    """The first member reports a finished group done; another member may train an iteration and
    report ready before that report arrives. The coordinator must take the ready report as the end
    of the member's group (not as a worker that is ready twice), and drop the late done report."""
    from stragglerkit.selective.coordinator import _append_event

    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    store = dist.PrefixStore("race", server)
    coordinator = SyncCoordinator(store, PartialReduceController(3, 2, worker_timeout=None), duration=4.0).start()
    _append_event(store, "ready 0 1 -1")
    _append_event(store, "ready 1 1 -1")
    first = _decision(store, 0)
    assert [s["members"] for s in first["syncs"]] == [[0, 1]]
    sync_id = first["syncs"][0]["id"]
    _append_event(store, f"ready 1 2 {sync_id}")  # member 1 is back before member 0's done report
    _append_event(store, f"done {sync_id}")
    _append_event(store, f"ready 0 2 {sync_id}")
    second = _decision(store, 1)
    assert [sorted(s["members"]) for s in second["syncs"]] == [[0, 1]]
    coordinator.join(timeout=30)
    assert coordinator.error is None, coordinator.error
    assert _decision(store, 2)["kind"] == "stop"
    assert coordinator.records[0].done_s is not None

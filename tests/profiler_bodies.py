"""Per-rank bodies of the profiler tests (imported by the spawned ranks): a few DDP steps through
stragglerkit's hook under torch.profiler, with a plan that every rank adopts through the stats
exchange, as a decision of rank 0's."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

WARMUP = 2
"""Steps 0 and 1 run the process group's own all_reduce."""
PROBE_EVERY = 3
"""Step 3, under the baseline plan, probes the largest bucket with stragglerkit's ring (3+ ranks)."""
EXCHANGE_EVERY = 2
"""Exchanges are issued at steps 2 and 4; the one at step 4 carries the test's decision."""
DECIDED_AT = 4
ADOPTED_AT = DECIDED_AT + 1
"""Every rank adopts the decision at the first bucket of this step."""
STEPS = 8


def _plan(kind: str, world_size: int, buckets: int) -> Any:
    from stragglerkit.detect.controller import Plan

    if kind == "stragglar":
        return Plan("allreduce", ("stragglar",) * buckets, world_size - 1, ())
    if kind == "optcc":
        return Plan("allreduce", ("optcc",) * buckets, None, ((1, 2.0),))
    return Plan(kind)  # every bucket runs ``kind`` (e.g. "ring")


def profiled_steps(rank: int, world_size: int, kind: str, out_dir: str, nvtx_forced: bool = False) -> dict[str, Any]:
    """Train a small model for :data:`STEPS` steps under torch.profiler (unless ``nvtx_forced``:
    then under no torch profiler, with ``report.nvtx`` on); write ``rank<r>.json`` (the chrome
    trace) to ``out_dir``; return the algorithms each step's buckets ran."""
    import stragglerkit
    from stragglerkit.detect.controller import Decision
    from stragglerkit.detect.settings import tuned

    config = stragglerkit.Config().replace(executor={"timeout": 60.0}, report={"nvtx": nvtx_forced or None})
    stragglerkit.init(config=config)
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 8)),
        bucket_cap_mb=0.03,
    )
    detection = {"warmup_steps": WARMUP, "probe_every": PROBE_EVERY, "exchange_every": EXCHANGE_EVERY}
    with tuned(quiet_probe_every=0, plan_probe_every=0):
        state = stragglerkit.DDPState(None, config.replace(detection=detection))
    model.register_comm_hook(state, stragglerkit.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loop = state.loop
    ran: list[list[str]] = []

    def steps() -> None:
        for step in range(STEPS):
            if step == DECIDED_AT and rank == 0:
                # white-box: rank 0's controller "decides" the plan; its digest of the last
                # exchange is joined first, so the decision rides on this step's exchange
                loop.exchange.join()
                buckets = len(loop.profiler.buckets(step - 1))
                plan = _plan(kind, world_size, buckets)
                events = [{"kind": "switch", "evidence": {"why": "the test's plan"}}]
                loop.exchange.decision_in_flight = Decision(10_000, ADOPTED_AT, plan, events, None, 100)
            g = torch.Generator().manual_seed(100 * step + rank)
            x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            ran.append([t.algorithm for t in sorted(loop.profiler.buckets(step), key=lambda t: t.bucket)])

    if nvtx_forced:
        steps()
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            steps()
        prof.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.json"))
    state.close()
    return {"ran": ran, "events": [e["kind"] for e in loop.controller.events], "pid": os.getpid()}


def direct_calls(rank: int, world_size: int, wait_mode: str, out_dir: str) -> dict[str, Any]:
    """``stragglerkit.all_reduce`` called directly under torch.profiler, blocking and ``async_op``,
    with the executor observing completions in ``wait_mode`` (``ordered`` or ``concurrent``);
    writes ``rank<r>.json``; returns whether each result was the sum."""
    import stragglerkit
    from stragglerkit.runtime.executor import force_wait_mode

    stragglerkit.init(config=stragglerkit.Config().replace(executor={"timeout": 60.0}))
    force_wait_mode(wait_mode)
    numel = 96 * 1024 + 7  # over the concurrent observer's minimum, not a multiple of the chunks
    expected = sum(torch.arange(numel, dtype=torch.float64) * (r + 1) for r in range(world_size))
    correct = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for algorithm in ("ring", "optcc"):
            for async_op in (False, True):
                tensor = torch.arange(numel, dtype=torch.float64) * (rank + 1)
                slowdowns = {1: 2.0} if algorithm == "optcc" else None
                work = stragglerkit.all_reduce(tensor, algorithm=algorithm, slowdowns=slowdowns, async_op=async_op)
                if work is not None:
                    work.wait()
                correct.append(bool(torch.equal(tensor, expected)))
    prof.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.json"))
    stragglerkit.destroy()
    return {"correct": correct}


def failed_call(rank: int, world_size: int) -> dict[str, Any]:
    """A ring call that fails on every rank (rank 2's bucket has another size: fault_bodies.py)."""
    import fault_bodies

    return {**fault_bodies.size_mismatch(rank, world_size), "pid": os.getpid()}

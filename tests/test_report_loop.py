"""The event log and the profiler traces that the closed loop really writes, into ``stragglerkit report``.

Three gloo ranks on loopback run the loop directly under torch.profiler, two buckets a step; the
last rank sleeps before each step's first bucket, and every rank adopts a forced ring plan at one
step (a ``switch``). Each rank writes its own log (``events.rank{rank}.jsonl``) and trace. The
report must read the logs without a problem, see the last rank arrive last by about its sleep and
show the switch; read the same from the traces' step ranges alone, on aligned clocks; and, given
both, draw the page from the logs with the traces' clock offsets noted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _dist import run_group

from stragglerkit.cli import main
from stragglerkit.report.inputs import load
from stragglerkit.report.run_data import last_ranks

WORLD = 3
STEPS = 24
LATE_S = 0.05
FORCED_AT = 10


def _loop_rank(rank: int, n: int, folder: str) -> int:
    from torch.profiler import ProfilerActivity, profile

    import stragglerkit
    from stragglerkit.detect.controller import Decision, Plan
    from stragglerkit.loop import StragglerLoop
    from stragglerkit.session import session_for

    log = str(Path(folder) / "events.rank{rank}.jsonl")
    config = stragglerkit.Config().replace(report={"event_log": log})
    stragglerkit.init(config=config)
    loop = StragglerLoop(session_for(None), config.replace(detection={"warmup_steps": 2, "exchange_every": 4}))
    buckets = [torch.ones(32 * 1024), torch.ones(8 * 1024)]
    switch: dict[str, Any] = {"kind": "switch", "evidence": {"why": "forced by the test"}}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for step in range(STEPS):
            if step == FORCED_AT:
                loop.adopt(Decision(10_000, step, Plan("allreduce", ("ring", "ring")), [switch]))
            if rank == n - 1:
                time.sleep(LATE_S)
            for index, bucket in enumerate(buckets):
                bucket.fill_(1.0)
                loop.all_reduce_bucket(bucket, index, index == len(buckets) - 1)
            loop.synchronize()
    loop.close()
    prof.export_chrome_trace(str(Path(folder) / "traces" / f"trace.rank{rank}.json"))
    return 0


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The logs in the folder, the ranks' torch.profiler traces of the same steps in ``traces/``."""
    folder = tmp_path_factory.mktemp("loop")
    (folder / "traces").mkdir()
    run_group(WORLD, _loop_rank, str(folder), timeout=300.0)
    return folder


def test_the_loop_s_own_logs_read_without_problems(run_dir: Path) -> None:
    loaded = load([str(run_dir / f"events.rank{rank}.jsonl") for rank in range(WORLD)])
    assert loaded.problems == [] and loaded.left_out == []
    run = loaded.run
    assert run is not None and run.world_size == WORLD and run.ranks_seen == [0, 1, 2]
    assert run.run_id and run.framework == "loop"
    assert ("switch", FORCED_AT) in [(d["kind"], d["step"]) for d in run.decisions]
    assert len(run.steps) >= STEPS - 8, "rank 0's windows cover the steps after the warm-up"
    late = [rank for step, rank in last_ranks(run)]
    assert late.count(WORLD - 1) >= 0.8 * len(late)
    known = [r.lateness_s[WORLD - 1] for r in run.steps if r.lateness_s and r.lateness_s[WORLD - 1] is not None]
    assert known and sorted(known)[len(known) // 2] == pytest.approx(LATE_S, abs=0.03)
    assert any(r.allreduce_s is not None for r in run.steps)


def test_the_loop_s_traces_give_the_same_steps(run_dir: Path) -> None:
    """The step ranges alone: every step, the last rank late by its sleep, on aligned clocks."""
    loaded = load([str(run_dir / "traces")])
    run = loaded.run
    assert loaded.problems == [] and run is not None and run.kind == "torch.profiler"
    assert [r.step for r in run.steps] == list(range(STEPS))
    late = [r.lateness_s[WORLD - 1] for r in run.steps if r.lateness_s and r.lateness_s[WORLD - 1] is not None]
    assert len(late) == STEPS and sorted(late)[STEPS // 2] == pytest.approx(LATE_S, abs=0.03)
    logs = load([str(run_dir / f"events.rank{rank}.jsonl") for rank in range(WORLD)]).run
    assert logs is not None
    by_step = {r.step: r for r in run.steps}
    baseline = {"allreduce": "process_group"}  # the loop's name for the process group's all_reduce
    for record in logs.steps:  # the loop's own figures (clock offsets from its ping-pong) agree with the traces'
        mine = by_step[record.step]
        ran = "+".join(baseline.get(a, a) for a in (record.algorithm or "").split("+"))
        assert set((mine.algorithm or "").split("+")) == set(ran.split("+")), record.step
        if record.lateness_s and mine.lateness_s and record.lateness_s[WORLD - 1] is not None:
            assert mine.lateness_s[WORLD - 1] == pytest.approx(record.lateness_s[WORLD - 1], abs=0.01)


def test_the_page_of_a_real_run(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    page = out.read_text()
    assert "trace clocks aligned on the ends of stragglerkit/all_reduce ranges" in page
    assert "No straggler or degraded NIC was detected" in page, "the forced switch is no detection"
    for figure in ("AllReduce time per step", "Arrival delay per rank", "Last rank to arrive"):
        assert f'<img alt="{figure}" src="data:image/png;base64,' in page

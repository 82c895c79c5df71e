"""The loop's event log: the ``run`` header on every rank, rank 0's ``window`` lines, the decisions.

The multi-rank tests run the closed loop directly on real gloo groups over loopback (2 and 3
ranks): the last rank sleeps before each step's first bucket, every rank adopts a forced ring plan
at one step (a ``switch`` decision), and the 2-rank run is checkpointed mid-way and resumed from
the pickle, which must append to the same file under the same header. The 2-rank runs share one
process group, one after the other (tests/_launch.py).
"""

from __future__ import annotations

import json
import pickle
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _launch import launches as launched

from stragglerkit.detect.controller import Decision, Plan
from stragglerkit.detect.settings import Settings
from stragglerkit.loop.sinks import EventLogSink, Sinks
from stragglerkit.plans import WindowStats
from stragglerkit.telemetry.records import RecordLog, nic_rates, plain, run_record, window_record

LATE_S = 0.03
FORCED_AT = 6
STEPS = 20
SWITCH = {"kind": "switch", "evidence": {"why": "forced by the test", "ranks": {"1": 0.5}}}


def _loop_run(rank: int, n: int, log: str, restore_at: int | None) -> dict[str, Any]:
    """``STEPS`` steps of two buckets through the loop; rank n-1 arrives ``LATE_S`` late."""
    import stragglerkit
    from stragglerkit.loop import StragglerLoop
    from stragglerkit.session import session_for

    config = stragglerkit.Config().replace(
        report={"event_log": log}, detection={"warmup_steps": 2, "exchange_every": 2, "quiet_exchange_every": 0}
    )
    stragglerkit.init(config=config)
    session = session_for(None)
    loop = StragglerLoop(session, config)
    buckets = [torch.ones(32 * 1024), torch.ones(8 * 1024)]
    for step in range(STEPS):
        if step == restore_at:  # a checkpoint between steps, resumed as a fresh process would
            state = pickle.dumps(loop)
            loop.close()
            loop = pickle.loads(state)
            loop.bind(session)
        if step == FORCED_AT:  # every rank adopts the same plan (and its event) before the step
            loop.adopt(Decision(10_000, step, Plan("allreduce", ("ring", "ring")), [dict(SWITCH)]))
        if rank == n - 1 and step >= 1:
            time.sleep(LATE_S)
        for index, bucket in enumerate(buckets):
            bucket.fill_(1.0)
            loop.all_reduce_bucket(bucket, index, index == len(buckets) - 1)
        loop.synchronize()
        assert float(buckets[0][0]) == pytest.approx(1.0)
    loop.close()
    events = list(loop.events)
    stragglerkit.destroy()
    return {"events": events, "run_id": loop.run_id}


HEADER_TEST = "test_every_rank_writes_the_header_and_rank_0_the_windows"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each multi-rank run's event log: a path with ``{rank}`` (a file per rank), or without."""
    folder = tmp_path_factory.mktemp("event_logs")
    return {
        "2-12": folder / "2-12" / "events.rank{rank}.jsonl",  # the folder is made by the loop
        "3-None": folder / "3-None" / "events.rank{rank}.jsonl",
        "no_rank": folder / "no_rank" / "events.jsonl",
    }


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest, logs: dict[str, Path]) -> Callable[[str], dict[int, Any]]:
    """``launches(run)``: {rank: what ``_loop_run`` returned}, from one process group per world
    size that runs the runs of the tests selected in this session (tests/_launch.py)."""
    logs["no_rank"].parent.mkdir()
    cases = {
        "2-12": (2, (HEADER_TEST, "2-12"), _loop_run, (str(logs["2-12"]), 12)),
        "3-None": (3, (HEADER_TEST, "3-None"), _loop_run, (str(logs["3-None"]), None)),
        "no_rank": (2, ("test_a_path_without_rank_is_rank_0_s_alone", ""), _loop_run, (str(logs["no_rank"]), None)),
    }
    return launched(request, cases, timeout=600.0)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize(("n", "restore_at"), [(2, 12), (3, None)])
def test_every_rank_writes_the_header_and_rank_0_the_windows(
    n: int, restore_at: int | None, launches: Callable[[str], dict[int, Any]], logs: dict[str, Path]
) -> None:
    pattern = str(logs[f"{n}-{restore_at}"])
    results = launches(f"{n}-{restore_at}")
    files = {r: Path(pattern.format(rank=r)) for r in range(n)}
    logs = {r: _lines(path) for r, path in files.items()}

    # the header: first line of every file, once, the same run id on every rank
    headers = {r: lines[0] for r, lines in logs.items()}
    run_ids = {h["run_id"] for h in headers.values()}
    assert len(run_ids) == 1 and run_ids == {results[0]["run_id"]}, headers
    for r, header in headers.items():
        assert header["kind"] == "run" and header["schema"] == 1
        assert header["rank"] == r and header["world_size"] == n and header["framework"] == "loop"
        assert header["hosts"] is not None and len(header["hosts"]) == n and len(set(header["hosts"])) == 1
        assert header["config"]["detection"]["warmup_steps"] == 2 and header["config"]["detection"]["window"] > 0
        assert isinstance(header["started"], float) and header["version"]
        assert [line["kind"] for line in logs[r]].count("run") == 1, "a restored loop appends under its header"

    # the decisions: unchanged lines (sorted keys), the same on every rank, equal to the loop's events
    for r, path in files.items():
        raw = [line for line in path.read_text(encoding="utf-8").splitlines() if '"kind": "run"' not in line]
        decisions = [json.loads(line) for line in raw if '"kind": "window"' not in line]
        assert decisions == results[r]["events"]
        assert all(line == json.dumps(json.loads(line), sort_keys=True) for line in raw if '"window"' not in line)
        # a plan of plain rings has the baseline as its headline algorithm
        assert {"kind": "switch", "step": FORCED_AT, "algorithm": "allreduce", **SWITCH} in decisions
        if r > 0:
            assert not [line for line in logs[r] if line["kind"] == "window"], "windows are rank 0's"

    # rank 0's windows: consistent shapes, steps in order, the late rank late, the plan that ran
    windows = [line for line in logs[0] if line["kind"] == "window"]
    steps = [s for w in windows for s in w["steps"]]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] >= 14, steps
    if restore_at is None:
        assert steps == list(range(len(steps))), "every step of every exchange, once"
    for w in windows:
        k = len(w["steps"])
        assert len(w["lateness_s"]) == len(w["allreduce_s"]) == len(w["step_end_s"]) == k
        assert len(w["algorithms"]) == len(w["predicted_s"]) == k
        assert all(len(row) == n for row in w["lateness_s"])
        assert len(w["nic_rate_Bps"]) == len(w["slowdown"]) == n
        # rank 0's own bucket sizes: none for steps run before a restore (their figures stay behind)
        behind = restore_at is not None and w["steps"][-1] == restore_at - 1
        assert w["bucket_bytes"] == ([] if behind else [32 * 1024 * 4, 8 * 1024 * 4]), (w["steps"], restore_at)
        assert all(len(row) == len(w["bucket_bytes"]) for row in w["algorithms"])
        ends = [e for e in w["step_end_s"] if e is not None]
        assert ends == sorted(ends)
    by_step = {s: (w, i) for w in windows for i, s in enumerate(w["steps"])}
    ran = {s: w["algorithms"][i] for s, (w, i) in by_step.items() if w["bucket_bytes"]}
    assert ran[0] == ran[1] == ["allreduce", "allreduce"]
    # rank 0's controller switches back to its baseline (nothing is wrong), a decision of its own
    back = min([e["step"] for e in results[0]["events"] if e["kind"] == "switch" and e["step"] > FORCED_AT] + [STEPS])
    assert all(ran[s] == ["ring", "ring"] for s in ran if FORCED_AT <= s < back), ran
    # (on 3 ranks a probe step runs the ring on the largest bucket)
    assert all(ran[s][1] == "allreduce" and ran[s][0] in ("allreduce", "ring") for s in ran if s >= back), ran
    late = [by_step[s][0]["lateness_s"][by_step[s][1]] for s in by_step if s >= 2]
    late = [row for row in late if None not in row]
    assert len(late) >= 8
    assert statistics.median(row[n - 1] for row in late) >= 0.7 * LATE_S, late
    assert all(statistics.median(row[r] for row in late) < 0.5 * LATE_S for r in range(n - 1)), late
    tails = [t for s, (w, i) in by_step.items() if s >= 2 for t in [w["allreduce_s"][i]] if t is not None]
    assert tails and all(0 <= t < 5.0 for t in tails)
    under_ring = [w for w in windows if FORCED_AT <= w["steps"][0] and w["steps"][-1] < back]
    assert under_ring and all(None not in w["nic_rate_Bps"] for w in under_ring), "a ring run measures every link"
    assert all(p is not None and p > 0 for w in windows if w["bucket_bytes"] for p in w["predicted_s"])


def test_a_path_without_rank_is_rank_0_s_alone(
    launches: Callable[[str], dict[int, Any]], logs: dict[str, Path]
) -> None:
    log = logs["no_rank"]
    launches("no_rank")
    lines = _lines(log)
    assert [line["kind"] for line in lines].count("run") == 1 and lines[0]["rank"] == 0
    assert len(list(log.parent.iterdir())) == 1


# -- the writer's parts, without processes --------------------------------------------------------


def test_events_are_written_as_they_were_and_windows_queue_until_flushed(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    sink = EventLogSink(str(log))
    sinks = Sinks([sink])
    sinks.add({"kind": "window", "steps": [3]})  # as the loop takes the controller's outbox
    assert not log.exists(), "nothing written until the loop flushes"
    event = {"kind": "switch", "step": 40, "algorithm": "stragglar", "evidence": {}}
    sinks.add(event)
    sinks.flush()
    assert [line["kind"] for line in _lines(log)] == ["window", "switch"]
    assert log.read_text().splitlines()[1] == json.dumps(event, sort_keys=True)


def test_a_new_run_on_a_used_path_starts_a_section_and_the_same_run_appends(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "events.jsonl")
    config = Settings()

    def header(run_id: str) -> dict[str, Any]:
        return run_record(run_id, rank=0, world_size=2, framework="ddp", hosts=[1, 1], config=config)

    first = RecordLog(path)
    first.start(header("aaaa"))
    first.put({"kind": "switch", "step": 4, "algorithm": "ring", "evidence": {}})
    first.flush()
    again = pickle.loads(pickle.dumps(first))  # a restored loop: same run
    again.start(header("aaaa"))
    again.put({"kind": "rollback", "step": 9, "algorithm": "allreduce", "evidence": {}})
    again.flush()
    other = RecordLog(path)
    other.start(header("bbbb"))
    kinds = [(line["kind"], line.get("run_id")) for line in _lines(Path(path))]
    assert kinds == [("run", "aaaa"), ("switch", None), ("rollback", None), ("run", "bbbb")]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "run", "schema": 1, "run_id": "cc')  # a header cut short
    RecordLog(path).start(header("bbbb"))
    assert _lines_tail(path) == "bbbb", "a cut header does not count: the run writes its own, on a line of its own"
    with pytest.raises(ValueError, match="framework"):
        run_record("x", rank=0, world_size=1, framework="jax", hosts=None, config=config)


def _lines_tail(path: str) -> str:
    last = Path(path).read_text(encoding="utf-8").splitlines()[-1]
    return str(json.loads(last)["run_id"])


def test_window_record_fills_unknown_figures_with_null() -> None:
    nan = float("nan")
    arrival = np.array([[10.0, 10.02, 10.001], [11.0, nan, 11.0]])
    rates = np.full((3, 3), np.nan)
    rates[0, 1], rates[1, 2], rates[2, 0] = 100.0, 50.0, 50.0  # rank 2's links are both slow
    stats = WindowStats(
        steps=[4, 5],
        totals=np.zeros((2, 3)),
        bucket_spans=np.zeros((2, 3, 2)),
        bucket_bytes=[1024, 512],
        algorithms=[["ring", "allreduce", ""], ["ring", "", ""]],
        link_rates=rates,
        speeds=np.full(3, np.nan),
        lateness=np.array([[0.0, 0.02, 0.001]]),  # the complete steps only
        tails=np.array([0.05, nan]),
        ends=np.array([10.1, nan]),
        arrival_wall=arrival,
    )
    record = window_record(stats, np.array([1.0, nan, 2.0]), [0.04, None])
    assert record == {
        "kind": "window",
        "steps": [4, 5],
        "lateness_s": [[0.0, 0.02, 0.001], [None, None, None]],
        "allreduce_s": [0.05, None],
        "step_end_s": [10.1, None],
        "algorithms": [["ring", "allreduce"], ["ring", ""]],
        "bucket_bytes": [1024, 512],
        "nic_rate_Bps": [100.0, 100.0, 50.0],
        "slowdown": [1.0, None, 2.0],
        "predicted_s": [0.04, None],
    }
    json.dumps(record, allow_nan=False)  # strict JSON
    assert nic_rates(np.full((2, 2), np.nan)) == [None, None]
    assert plain({"a": np.float32(1.5), "b": (np.inf, 2)}) == {"a": 1.5, "b": [None, 2]}

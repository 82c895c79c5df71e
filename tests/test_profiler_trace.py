"""stragglerkit's ranges in real torch.profiler traces (chrome trace JSON, one file per rank).

Real gloo groups on loopback (2, 3 and 4 ranks) train a small model through the DDP hook under
``torch.profiler.profile`` (CPU): two warm-up steps on the process group's own all_reduce, a probe
(3+ ranks), then a plan that rank 0 ships through the stats exchange and every rank adopts
(profiler_bodies.py). The exported traces must hold the names of docs/profiling.md, nested as
they happen: the executor's phases, messages and reductions inside their bucket's all_reduce (on
the runtime's worker thread, which records in the caller's profiler), one step mark per step.
The 3-rank runs share one process group, one after the other (tests/_launch.py).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import profiler_bodies as body
import pytest
from _dist import run_group
from _horovod import HOROVODRUN, horovodrun_env
from _launch import launches as launched
from _require import require_or_skip

Event = dict[str, Any]


def _ranges(trace: Path) -> list[Event]:
    events = json.loads(trace.read_text())["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("stragglerkit/")]


def _named(events: Iterable[Event], pattern: str) -> list[Event]:
    compiled = re.compile(pattern)
    return [e for e in events if compiled.fullmatch(e["name"])]


def _inside(inner: Event, outer: Event, same_thread: bool = True, slack_us: float = 1.0) -> bool:
    if same_thread and inner["tid"] != outer["tid"]:
        return False
    return outer["ts"] - slack_us <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + slack_us


def _each_inside(inner: list[Event], outer: list[Event], what: str, same_thread: bool = True) -> None:
    assert inner, f"no {what} ranges"
    for event in inner:
        assert any(_inside(event, o, same_thread) for o in outer), (
            f"{event['name']} at {event['ts']} (thread {event['tid']}) is in no {what}'s enclosing range"
        )


WAIT_MODES = ["ordered", "concurrent"]


@pytest.fixture(scope="module")
def traces_of(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The folder of each 3-rank run's traces."""
    return {
        case: tmp_path_factory.mktemp(case.replace("/", "-"))
        for case in ("optcc", "direct/ordered", "direct/concurrent")
    }


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest, traces_of: dict[str, Path]) -> Callable[[str], dict[int, Any]]:
    """``launches(case)``: {rank: what the body returned}, the 3-rank runs of the tests selected in
    this session from one process group (tests/_launch.py)."""
    cases = {
        "optcc": (3, ("test_optcc_plan_on_three_ranks", ""), body.profiled_steps, ("optcc", str(traces_of["optcc"]))),
        **{
            f"direct/{mode}": (
                3,
                ("test_direct_calls_in_both_wait_modes", mode),
                body.direct_calls,
                (mode, str(traces_of[f"direct/{mode}"])),
            )
            for mode in WAIT_MODES
        },
    }
    return launched(request, cases, timeout=600.0)


def _run(world_size: int, kind: str, tmp_path: Path) -> tuple[dict[int, Any], dict[int, list[Event]]]:
    results = run_group(world_size, body.profiled_steps, kind, str(tmp_path), timeout=300.0)
    return _checked_run(world_size, results, tmp_path)


def _checked_run(
    world_size: int, results: dict[int, Any], tmp_path: Path
) -> tuple[dict[int, Any], dict[int, list[Event]]]:
    for rank in range(world_size):
        ran = results[rank]["ran"]
        assert ran[0] and all(a == "allreduce" for a in ran[0]), ran  # warm-up: the process group's
        assert "switch" in results[rank]["events"], results[rank]["events"]
    traces = {rank: _ranges(tmp_path / f"rank{rank}.json") for rank in range(world_size)}
    return results, traces


def _check_common(world_size: int, results: dict[int, Any], traces: dict[int, list[Event]], algorithm: str) -> None:
    for rank, events in traces.items():
        names = [e["name"] for e in events]
        # one arrival mark per step, on the thread that hands the buckets over
        for step in range(body.STEPS):
            assert names.count(f"stragglerkit/step {step}") == 1, (rank, step, sorted(set(names)))
        # the warm-up's buckets: the process group's own all_reduce, one range per bucket
        baseline = _named(events, r"stragglerkit/all_reduce process_group")
        warmup_buckets = sum(len(results[rank]["ran"][s]) for s in range(body.WARMUP))
        assert len(baseline) >= warmup_buckets, (rank, len(baseline), warmup_buckets)
        # ranges that end on another thread (the completion callback's) end there, before the next step
        marks = sorted(e["ts"] for e in _named(events, r"stragglerkit/step \d+"))
        for event in baseline + _named(events, r"stragglerkit/probe"):
            later = [ts for ts in marks if ts > event["ts"]]
            if later:
                assert event["ts"] + event["dur"] <= later[0], (rank, event, later[0])
        for kind in ("exchange", "wait", "decision switch"):
            assert f"stragglerkit/{kind}" in names, (rank, kind, sorted(set(names)))
        # the adopted plan: its bucket ranges, with the executor's phases, messages and reductions inside
        outer = _named(events, rf"stragglerkit/all_reduce {algorithm}")
        adopted = sum(a == algorithm for s in range(body.ADOPTED_AT, body.STEPS) for a in results[rank]["ran"][s])
        assert len(outer) >= adopted > 0, (rank, len(outer), adopted)
        phases = _named(events, rf"stragglerkit/{algorithm}/.+")
        _each_inside(phases, outer, f"all_reduce {algorithm}")
        messages = _named(events, r"stragglerkit/(send|recv) \d+")
        peers = {int(e["name"].split()[-1]) for e in messages}
        assert peers and rank not in peers and peers <= set(range(world_size)), (rank, peers)
        _each_inside(messages, _named(events, r"stragglerkit/all_reduce \w+"), "all_reduce")
        _each_inside(
            _named(events, r"stragglerkit/reduction"),
            outer + _named(events, r"stragglerkit/all_reduce ring"),
            "all_reduce",
        )


def test_stragglar_plan_on_four_ranks(tmp_path: Path) -> None:
    n = 4  # StragglAR needs an even world size of at least 4
    results, traces = _run(n, "stragglar", tmp_path)
    _check_common(n, results, traces, "stragglar")
    straggler = n - 1
    for rank, events in traces.items():
        names = {e["name"] for e in events}
        assert ("stragglerkit/stragglar/pre-phase" in names) == (rank != straggler), (rank, sorted(names))
        assert any(re.fullmatch(r"stragglerkit/stragglar/round \d+", name) for name in names), (rank, sorted(names))
        # the probe at step 3 (baseline plan, 3+ ranks): stragglerkit's ring, inside the probe's range
        probes = _named(events, r"stragglerkit/probe")
        assert len(probes) == 1, (rank, len(probes))
        rings = _named(events, r"stragglerkit/all_reduce ring")
        assert any(_inside(ring, probes[0], same_thread=False) for ring in rings), (rank, probes, rings)


def test_optcc_plan_on_three_ranks(launches: Callable[[str], dict[int, Any]], traces_of: dict[str, Path]) -> None:
    n = 3
    results, traces = _checked_run(n, launches("optcc"), traces_of["optcc"])
    _check_common(n, results, traces, "optcc")
    for rank, events in traces.items():
        stages = {e["name"] for e in _named(events, r"stragglerkit/optcc/.+")}
        assert stages & {f"stragglerkit/optcc/stage {s}" for s in range(1, 5)}, (rank, sorted(stages))


def test_ring_plan_and_baseline_on_two_ranks(tmp_path: Path) -> None:
    n = 2
    results, traces = _run(n, "ring", tmp_path)
    _check_common(n, results, traces, "ring")
    for events in traces.values():
        assert not _named(events, r"stragglerkit/probe"), "two ranks never probe"
        phases = {e["name"].rsplit(" round ", 1)[0] for e in _named(events, r"stragglerkit/ring/\w+ round \d+")}
        assert phases == {"stragglerkit/ring/reduce_scatter", "stragglerkit/ring/allgather"}, phases


@pytest.mark.parametrize("wait_mode", WAIT_MODES)
def test_direct_calls_in_both_wait_modes(
    wait_mode: str, launches: Callable[[str], dict[int, Any]], traces_of: dict[str, Path]
) -> None:
    """``stragglerkit.all_reduce`` itself (blocking on the caller's thread, ``async_op`` on the
    runtime's worker), both observers of the executor: the sums are right and every message and
    phase is inside its call's range."""
    n = 3
    tmp_path = traces_of[f"direct/{wait_mode}"]
    results = launches(f"direct/{wait_mode}")
    for rank in range(n):
        assert all(results[rank]["correct"]), (rank, results[rank])
        events = _ranges(tmp_path / f"rank{rank}.json")
        for algorithm in ("ring", "optcc"):
            calls = _named(events, rf"stragglerkit/all_reduce {algorithm}")
            assert len(calls) == 2, (rank, algorithm, len(calls))
            assert len({c["tid"] for c in calls}) == 2, "blocking on the caller's thread, async on the worker"
            _each_inside(_named(events, rf"stragglerkit/{algorithm}/.+"), calls, f"all_reduce {algorithm}")
        outer = _named(events, r"stragglerkit/all_reduce \w+")
        _each_inside(_named(events, r"stragglerkit/(send|recv) \d+"), outer, "all_reduce")
        _each_inside(_named(events, r"stragglerkit/reduction"), outer, "all_reduce")


def test_horovod_baseline_on_two_ranks(tmp_path: Path) -> None:
    """stragglerkit's Horovod optimizer under real ``horovodrun --gloo``: Horovod's allreduce is
    the baseline, started on the training thread and seen complete on a waiter thread; its range
    ends there, before the next step, and every step is marked once."""
    if importlib.util.find_spec("horovod") is None or not Path(HOROVODRUN).exists():
        require_or_skip("Horovod", "bash scripts/install_horovod.sh (scripts/setup.sh runs it)")
    n, steps = 2, 4
    body_file = Path(__file__).with_name("horovod_trace_body.py")
    env = horovodrun_env()
    command = [HOROVODRUN, "--gloo", "-np", str(n), "-H", f"localhost:{n}", sys.executable, str(body_file)]
    done = subprocess.run([*command, str(tmp_path), str(steps)], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and (tmp_path / "done").exists(), f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    for rank in range(n):
        events = _ranges(tmp_path / f"rank{rank}.json")
        marks = sorted(e["ts"] for e in _named(events, r"stragglerkit/step \d+"))
        assert len(marks) == steps, (rank, len(marks))
        horovod = _named(events, r"stragglerkit/all_reduce horovod")
        assert len(horovod) >= steps, (rank, len(horovod))
        for event in horovod:
            later = [ts for ts in marks if ts > event["ts"]]
            if later:
                assert event["ts"] + event["dur"] <= later[0], (rank, event, later[0])
        assert _named(events, r"stragglerkit/wait"), rank

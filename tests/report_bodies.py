"""Inputs of ``stragglerkit report`` for its tests, written the way their producers write them.

* :func:`write_event_logs`: a run's JSONL event logs as the loop writes them (docs/event_log.md):
  a ``run`` header per file with one ``run_id``, rank 0's ``window`` lines every ``exchange``
  steps, the decisions on every writing rank. The run has a persistent straggler from
  ``fault_step`` (or no fault), detection, a switch and its verification, as the controller
  would record them.
* :func:`write_nsys_export`: an Nsight Systems SQLite export built from the documented export
  schema (META_DATA_EXPORT, StringIds, NVTX_EVENTS, CUPTI_ACTIVITY_KIND_KERNEL), because Nsight
  Systems itself cannot be installed where the tests run.
* :func:`write_chrome_trace`: a torch.profiler-style chrome trace with given ranges (the test of
  real traces records them with torch.profiler on a real 2-rank group).
* :func:`bench_allreduce_json` / :func:`bench_train_json`: ``stragglerkit bench --json`` output
  with the fields the report reads, in both modes.

``python tests/report_bodies.py DIR`` writes the example run of docs/report.md (8 ranks, rank 7
late from step 20) into DIR.
"""

from __future__ import annotations

import json
import random
import sqlite3
import sys
from pathlib import Path
from typing import Any

RUN_ID = "5f1c0a9e2b7d4c31"


def _decision(kind: str, step: int, algorithm: str, evidence: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "step": step, "algorithm": algorithm, "evidence": evidence}


def example_run(
    world_size: int = 8,
    steps: int = 120,
    straggler: int | None = -1,
    delay: float = 0.030,
    fault_step: int = 20,
    exchange: int = 5,
    seed: int = 1,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(windows, decisions) of a run with a persistent straggler (default the last rank; None: no fault)."""
    rng = random.Random(seed)
    if straggler == -1:
        straggler = world_size - 1
    ring, stragglar = 0.048, 0.029
    detect_step = fault_step + 3 * exchange if straggler is not None else None
    switch_step = detect_step + exchange if detect_step is not None else None
    verified_step = switch_step + 3 * exchange if switch_step is not None else None
    decisions: list[dict[str, Any]] = []
    if straggler is not None and detect_step is not None and switch_step is not None and verified_step is not None:
        window = [detect_step - 15, detect_step - 1]
        decisions = [
            _decision(
                "detected_straggler",
                detect_step,
                "ring",
                {
                    "ranks": {str(straggler): delay},
                    "window": window,
                    "fraction": 1.0,
                    "median_delay_s": delay,
                    "critical_delay_s": 0.011,
                    "last_counts": [0] * (world_size - 1) + [15],
                },
            ),
            _decision(
                "switch",
                switch_step,
                "stragglar",
                {
                    "from": {"default": "ring", "buckets": [], "straggler": None, "slowdowns": {}},
                    "to": {"default": "ring", "buckets": ["stragglar"], "straggler": straggler, "slowdowns": {}},
                    "predicted_before_s": ring,
                    "predicted_after_s": stragglar,
                    "measure": "step_period",
                    "measured_before_s": 0.205,
                },
            ),
            _decision(
                "verified",
                verified_step,
                "stragglar",
                {
                    "switched_at_step": switch_step,
                    "measure": "step_period",
                    "measured_before_s": 0.205,
                    "measured_after_s": 0.186,
                    "predicted_after_s": stragglar,
                },
            ),
        ]
    windows = []
    end = 1_790_000_000.0
    for first in range(0, steps, exchange):
        chunk = list(range(first, min(steps, first + exchange)))
        record: dict[str, Any] = {
            "kind": "window",
            "steps": chunk,
            "lateness_s": [],
            "allreduce_s": [],
            "step_end_s": [],
            "algorithms": [],
            "bucket_bytes": [4 << 20],
            "nic_rate_Bps": [rng.uniform(112e6, 119e6) for _ in range(world_size)],
            "slowdown": [round(rng.uniform(0.98, 1.03), 3) for _ in range(world_size)],
            "predicted_s": [],
        }
        for step in chunk:
            late = [abs(rng.gauss(0, 0.0015)) for _ in range(world_size)]
            if straggler is not None and step >= fault_step:
                late[straggler] = delay + rng.gauss(0, 0.002)
            base = min(late)
            late = [round(v - base, 6) for v in late]
            switched = switch_step is not None and step >= switch_step
            algorithm = "stragglar" if switched else "ring"
            part = (stragglar if switched else ring) * rng.uniform(0.95, 1.12)
            end += 0.120 + max(late) + part
            record["lateness_s"].append(late)
            record["allreduce_s"].append(round(part, 6))
            record["step_end_s"].append(end)
            record["algorithms"].append([algorithm])
            record["predicted_s"].append(stragglar if switched else ring)
        windows.append(record)
    return windows, decisions


def header(rank: int, world_size: int, run_id: str = RUN_ID) -> dict[str, Any]:
    return {
        "kind": "run",
        "schema": 1,
        "run_id": run_id,
        "rank": rank,
        "world_size": world_size,
        "started": 1_790_000_000.0,
        "framework": "ddp",
        "hosts": list(range(world_size)),
        "version": "0.2.0",
        "config": {"warmup_steps": 10, "exchange_every": 5, "detector": {"window": 16, "degraded_threshold": 1.5}},
    }


def write_event_logs(
    folder: Path,
    world_size: int = 8,
    ranks: list[int] | None = None,
    run_id: str = RUN_ID,
    per_rank: bool = True,
    **run: Any,
) -> list[Path]:
    """The run's logs: ``events.rank{r}.jsonl`` for ``ranks`` (default all), or one ``events.jsonl``."""
    folder.mkdir(parents=True, exist_ok=True)
    windows, decisions = example_run(world_size=world_size, **run)
    paths = []
    for rank in ranks if ranks is not None else (range(world_size) if per_rank else [0]):
        path = folder / (f"events.rank{rank}.jsonl" if per_rank else "events.jsonl")
        lines = [header(rank, world_size, run_id)]
        if rank == 0:
            # decisions are written when adopted: after the window that led to them
            events = sorted(decisions, key=lambda d: d["step"])
            for window in windows:
                lines.append(window)
                while events and events[0]["step"] <= window["steps"][-1] + 1:
                    lines.append(events.pop(0))
            lines += events
        else:
            lines += decisions
        path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        paths.append(path)
    return paths


def write_chrome_trace(
    path: Path, rank: int | None, world_size: int, ranges: list[tuple[str, float, float]], offset_s: float = 0.0
) -> Path:
    """A chrome trace of ``ranges`` (name, start s, end s) on a clock ``offset_s`` ahead."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5.0, "dur": 1.0}]
    for name, start, end in ranges:
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": 1,
                "tid": 1,
                "ts": (start + offset_s) * 1e6,
                "dur": (end - start) * 1e6,
            }
        )
    data: dict[str, Any] = {"schemaVersion": 1, "traceEvents": events}
    if rank is not None:
        data["distributedInfo"] = {"backend": "gloo", "rank": rank, "world_size": world_size}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def step_ranges(
    rank: int, steps: int, late_rank: int, delay: float, algorithm: str = "ring"
) -> list[tuple[str, float, float]]:
    """Per step: ``stragglerkit/step S`` at the rank's arrival, then its AllReduce ending at one instant."""
    out = []
    for step in range(steps):
        start = step * 0.1 + (delay if rank == late_rank else 0.001 * rank)
        finish = step * 0.1 + delay + 0.02
        out.append((f"stragglerkit/step {step}", start, start + 1e-5))
        out.append((f"stragglerkit/all_reduce {algorithm}", start + 2e-5, finish))
    return out


def write_nsys_export(
    path: Path,
    ranges: list[tuple[str, float, float]],
    kernels: list[tuple[str, float, float]] = (),  # type: ignore[assignment]
    schema: str = "3.24.14",
    pids: tuple[int, ...] = (4242,),
    text_inline: bool = False,
) -> Path:
    """An export in Nsight Systems' documented SQLite schema (the tables and columns the reader uses)."""
    if path.exists():
        path.unlink()
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT);
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
            endGlobalTid INTEGER, textId INTEGER REFERENCES StringIds(id), domainId INTEGER,
            uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
            int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER, contextId INTEGER, streamId INTEGER, correlationId INTEGER,
            globalPid INTEGER, demangledName INTEGER REFERENCES StringIds(id),
            shortName INTEGER REFERENCES StringIds(id), gridX INTEGER, blockX INTEGER);
        """
    )
    db.executemany(
        "INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
        [("EXPORT_SCHEMA_VERSION", schema), ("EXPORT_PRODUCT_VERSION", "2024.5.1")],
    )
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        if text not in strings:
            strings[text] = len(strings) + 1
            db.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[text], text))
        return strings[text]

    # the domain's creation (eventType 75), then push/pop ranges (59) in it
    db.execute("INSERT INTO NVTX_EVENTS (start, eventType, text, domainId) VALUES (0, 75, 'stragglerkit', 1)")
    for index, (name, start, end) in enumerate(ranges):
        tid = (pids[index % len(pids)] << 24) | 7
        if text_inline:
            row = (int(start * 1e9), int(end * 1e9), 59, name, tid, None, 1)
        else:
            row = (int(start * 1e9), int(end * 1e9), 59, None, tid, sid(name), 1)
        db.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId, domainId) VALUES (?,?,?,?,?,?,?)",
            row,
        )
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (1, 2, 59, 'other', 7)")
    for name, start, end in kernels:
        db.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, demangledName, shortName) "
            "VALUES (?, ?, 0, ?, ?)",
            (int(start * 1e9), int(end * 1e9), sid(name + "(ncclDevComm*)"), sid(name)),
        )
    db.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, demangledName, shortName) "
        "VALUES (1, 2, 0, ?, ?)",
        (sid("gemm_kernel"), sid("gemm_kernel")),
    )
    db.commit()
    db.close()
    return path


def bench_allreduce_json(path: Path, world_size: int = 4, iterations: int = 5) -> Path:
    """An AllReduce bench JSON (the row fields of stragglerkit/bench/results.py the report reads)."""
    rng = random.Random(3)
    rows = []
    for algorithm, ran, base, predicted in (("gloo", "gloo", 0.060, 0.055), ("stragglar", "stragglar", 0.038, 0.036)):
        arrival, finish = [], []
        for _ in range(iterations):
            arr = [rng.uniform(0, 0.001) for _ in range(world_size)]
            arr[world_size - 1] = 0.025 + rng.uniform(0, 0.002)
            end = max(arr) + base * rng.uniform(0.95, 1.05)
            arrival.append(arr)
            finish.append([end - rng.uniform(0, 1e-4) for _ in range(world_size)])
        rows.append(
            {
                "algorithm": algorithm,
                "ran": ran,
                "world_size": world_size,
                "size_bytes": 1 << 22,
                "scenario": "straggler",
                "straggler": world_size - 1,
                "time_s": base,
                "predicted_s": predicted,
                "speedup_vs_gloo": 0.060 / base,
                "samples": {"arrival": arrival, "finish": finish},
            }
        )
    data = {"header": {"command": "stragglerkit bench --json x", "config": {"world_size": world_size}}, "rows": rows}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def bench_train_json(path: Path, world_size: int = 4, steps: int = 40) -> Path:
    """A training bench JSON (``{"header", <summary>}`` as profiling/lab/train_report.py writes it)."""
    rng = random.Random(5)
    switch = 18
    hooked = [0.30 + rng.uniform(0, 0.01) - (0.04 if s >= switch else 0.0) for s in range(steps)]
    plain = [0.30 + rng.uniform(0, 0.01) for _ in range(steps)]
    backward = []
    for _ in range(steps):
        times = [0.12 + rng.uniform(0, 0.002) for _ in range(world_size)]
        times[world_size - 1] -= 0.03  # the late rank waits least
        backward.append(times)
    events = [
        _decision("detected_straggler", 15, "allreduce", {"ranks": {str(world_size - 1): 0.03}, "window": [5, 14]}),
        _decision("switch", switch, "stragglar", {"predicted_before_s": 0.05, "predicted_after_s": 0.03}),
    ]
    data = {
        "header": {"command": "stragglerkit bench --mode train", "config": {"world_size": world_size}},
        "scenario": "straggler",
        "events": events,
        "steady_steps": [switch + 2, steps - 1],
        "steady_from_why": "from 2 steps after the last plan change",
        "plain_steady_ms": 305.0,
        "hooked_steady_ms": 265.0,
        "speedup_steady": 305.0 / 265.0,
        "steps": {
            "plain_s": plain,
            "hooked_s": hooked,
            "hook_algorithm": ["allreduce" if s < switch else "stragglar" for s in range(steps)],
            "per_rank": {"hooked_backward_s": backward},
        },
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "example-run")
    for written in write_event_logs(out):
        print(f"wrote {written}")

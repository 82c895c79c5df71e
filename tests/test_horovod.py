"""stragglerkit's Horovod optimizer under real ``horovodrun --gloo`` (Horovod 0.28.1, built by
scripts/install_horovod.sh, which scripts/setup.sh runs): the same training as
``hvd.DistributedOptimizer``, in every form of the decorator, with a straggler the loop acts on."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BODIES = Path(__file__).with_name("horovod_bodies.py")
HOROVODRUN = shutil.which("horovodrun") or str(Path(sys.executable).with_name("horovodrun"))

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("horovod") is None or not Path(HOROVODRUN).exists(),
    reason="Horovod is not installed: bash scripts/install_horovod.sh (scripts/setup.sh runs it)",
)


def horovodrun(n: int, case: str, tmp_path: Path, timeout: float = 300.0, **args: Any) -> list[dict[str, Any]]:
    """Run ``case`` of tests/horovod_bodies.py on ``n`` ranks; every rank's result, each checked ok."""
    out = tmp_path / f"{case}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    command = [HOROVODRUN, "--gloo", "-np", str(n), "-H", f"localhost:{n}", sys.executable, str(BODIES), case]
    proc = subprocess.run(
        [*command, str(out), json.dumps(args)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0 and out.exists(), (
        f"horovodrun failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    results = json.loads(out.read_text())
    failed = [f"rank {rank}:\n{r['error']}" for rank, r in enumerate(results) if not r["ok"]]
    assert not failed, "\n".join(failed)
    return results


def check_same_training(results: list[dict[str, Any]], steps: int) -> None:
    for r in results:
        assert len(r["diffs"]) == steps
        assert max(r["diffs"]) <= 1e-5 * max(r["scale"], 1.0), r["diffs"]
    assert all(r["ours"] == results[0]["ours"] for r in results), "ranks differ"


@pytest.mark.parametrize("form", ["drop_in", "instance", "class", "function"])
def test_trains_like_horovods_optimizer_in_every_form(form: str, tmp_path: Path) -> None:
    results = horovodrun(2, "side_by_side", tmp_path, steps=12, form=form)
    check_same_training(results, 12)
    assert all(r["is_sgd"] and r["class"] == ("MySGD" if form == "class" else "SGD") for r in results), results[0]


@pytest.mark.parametrize(
    "options",
    [{"fp16": True}, {"backward_passes_per_step": 2}, {"clip": True}, {"op": "sum"}],
    ids=["fp16_compression", "two_backward_passes", "synchronize_clip_skip", "op_sum"],
)
def test_horovods_options_keep_their_meaning(options: dict[str, Any], tmp_path: Path) -> None:
    results = horovodrun(2, "side_by_side", tmp_path, steps=10, **options)
    check_same_training(results, 10)


def test_a_late_rank_switches_the_buckets_to_stragglar_with_the_same_parameters(tmp_path: Path) -> None:
    """4 ranks, rank 3 late from step 5: the loop moves the buckets off Horovod's allreduce to
    StragglAR at the same step on every rank, and the parameters stay Horovod's."""
    results = horovodrun(4, "side_by_side", tmp_path, timeout=400.0, steps=60, late_rank=3, late_s=0.03)
    check_same_training(results, 60)
    assert all(r["events"] == results[0]["events"] for r in results)
    assert "stragglar" in results[0]["ran"] and "allreduce" in results[0]["ran"], (
        results[0]["ran"],
        results[0]["events"],
    )


def test_bad_input_is_named(tmp_path: Path) -> None:
    errors = horovodrun(2, "bad_input", tmp_path)[0]["errors"]
    assert errors["twice"].startswith("ConfigError") and "already distributed" in errors["twice"], errors
    assert errors["not_an_optimizer"].startswith("ConfigError") and "int" in errors["not_an_optimizer"], errors
    # Horovod's own checks, with Horovod's messages
    assert "Parameter names in named_parameters must be unique" in errors["duplicate_names"], errors
    assert "backward_passes_per_step must be > 0" in errors["passes"], errors


def test_a_stalled_rank_is_named_within_the_timeout(tmp_path: Path) -> None:
    """Horovod's own allreduce waits for a stalled rank forever; under the loop every other rank
    fails within the timeout (plus the fault report's 2 s) with a PeerError naming it."""
    out = tmp_path / "stalled"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    command = [HOROVODRUN, "--gloo", "-np", "3", "-H", "localhost:3", sys.executable, str(BODIES), "stalled_rank"]
    arguments = {"stalled": 2, "stall_s": 25.0, "timeout": 6.0}  # rank 0 exits as soon as it has its error
    subprocess.run([*command, str(out), json.dumps(arguments)], capture_output=True, text=True, timeout=180, env=env)
    for rank in (0, 1):
        result = json.loads(Path(f"{out}.rank{rank}.json").read_text())
        assert result["error"] == "PeerError" and result["peer"] == 2, result
        assert "rank 2 did not reach step 5" in result["message"], result
        assert result["seconds"] < 6.0 + 2 * 2.0 + 6.0, result  # timeout + report windows + the steps before

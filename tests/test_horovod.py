"""stragglerkit's Horovod optimizer under real ``horovodrun --gloo`` (Horovod 0.28.1, built by
scripts/install_horovod.sh, which scripts/setup.sh runs): the same training as
``hvd.DistributedOptimizer``, in every form of the decorator, with a straggler the loop acts on."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _horovod import HOROVODRUN, horovodrun_env, rank_errors
from _launch import selected_tests
from _require import needs

BODIES = Path(__file__).with_name("horovod_bodies.py")

pytestmark = needs(
    "Horovod",
    importlib.util.find_spec("horovod") is None or not Path(HOROVODRUN).exists(),
    "bash scripts/install_horovod.sh (scripts/setup.sh runs it)",
)

DIFFERENCES = {
    "shape": "parameter 2: rank 1 has '2.weight' of shape (9, 192) float32, rank 0 has '2.weight' of shape (8, 192)",
    "dtype": "parameter 0: rank 1 has '0.weight' of shape (192, 64) float64, rank 0 has '0.weight' of shape (192, 64)",
    "count": "parameter 4: rank 1 has '3.weight' of shape (8, 8) float32 there, rank 0 has no parameter",
}
"""What every rank's error says when rank 1's model differs from rank 0's in one way."""


def horovodrun(n: int, case: str, tmp_path: Path, timeout: float = 300.0, **args: Any) -> list[dict[str, Any]]:
    """Run ``case`` of tests/horovod_bodies.py on ``n`` ranks; every rank's result, each checked ok."""
    out = tmp_path / f"{case}.json"
    env = horovodrun_env()
    command = [HOROVODRUN, "--gloo", "-np", str(n), "-H", f"localhost:{n}", sys.executable, str(BODIES), case]
    proc = subprocess.run(
        [*command, str(out), json.dumps(args)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert proc.returncode == 0 and out.exists(), (
        f"horovodrun failed ({proc.returncode}):\n{rank_errors(proc.stdout + proc.stderr)}\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
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


FORMS = ["drop_in", "instance", "class", "function"]
OPTIONS = {
    "fp16_compression": {"fp16": True},
    "two_backward_passes": {"backward_passes_per_step": 2},
    "synchronize_clip_skip": {"clip": True},
    "op_sum": {"op": "sum"},
}
TWO_RANK_CASES: dict[str, dict[str, Any]] = {
    **{f"form/{form}": {"case": "side_by_side", "steps": 12, "form": form} for form in FORMS},
    **{f"options/{name}": {"case": "side_by_side", "steps": 10, **options} for name, options in OPTIONS.items()},
    "bad_input": {"case": "bad_input"},
}
"""The cases on 2 ranks, all run by one ``horovodrun`` (:func:`two_ranks`), each checked by its test."""


def _two_rank_case(test: str, params: str) -> str | None:
    """The case of :data:`TWO_RANK_CASES` that test ``test`` (of parameters ``params``) checks, if any."""
    if test == "test_trains_like_horovods_optimizer_in_every_form":
        return f"form/{params}"
    if test == "test_horovods_options_keep_their_meaning":
        return f"options/{params}"
    return "bad_input" if test == "test_bad_input_is_named" else None


@pytest.fixture(scope="module")
def two_ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list]:
    """``two_ranks(case)``: every rank's result of ``case``, from one ``horovodrun`` on 2 ranks
    that runs the cases of the tests selected in this session, one after the other."""
    selected = {_two_rank_case(test, params) for test, params in selected_tests(request)}
    cases = {name: args for name, args in TWO_RANK_CASES.items() if name in selected}
    ran: list[list[dict[str, Any]]] = []

    def case(name: str) -> list[dict[str, Any]]:
        if not ran:
            ran.append(horovodrun(2, "several", tmp_path_factory.mktemp("two_ranks"), timeout=900.0, cases=cases))
        results = [r["cases"][name] for r in ran[0]]
        failed = [f"rank {rank}:\n{r['error']}" for rank, r in enumerate(results) if not r["ok"]]
        assert not failed, "\n".join(failed)
        return results

    return case


@pytest.mark.parametrize("form", FORMS)
def test_trains_like_horovods_optimizer_in_every_form(form: str, two_ranks: Callable[[str], list]) -> None:
    results = two_ranks(f"form/{form}")
    check_same_training(results, 12)
    assert all(r["is_sgd"] and r["class"] == ("MySGD" if form == "class" else "SGD") for r in results), results[0]
    assert all(r["closed"] for r in results), "optimizer.close() stops the loop's thread"


@pytest.mark.parametrize("options", list(OPTIONS.values()), ids=list(OPTIONS))
def test_horovods_options_keep_their_meaning(
    options: dict[str, Any], request: pytest.FixtureRequest, two_ranks: Callable[[str], list]
) -> None:
    results = two_ranks(f"options/{request.node.callspec.id}")
    assert all(TWO_RANK_CASES[f"options/{request.node.callspec.id}"][k] == v for k, v in options.items())
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


def test_bad_input_is_named(two_ranks: Callable[[str], list]) -> None:
    errors = two_ranks("bad_input")[0]["errors"]
    assert errors["twice"].startswith("ConfigError") and "already distributed" in errors["twice"], errors
    assert errors["not_an_optimizer"].startswith("ConfigError") and "int" in errors["not_an_optimizer"], errors
    # Horovod's own checks, with Horovod's messages
    assert "Parameter names in named_parameters must be unique" in errors["duplicate_names"], errors
    assert "backward_passes_per_step must be > 0" in errors["passes"], errors


def test_parameters_that_differ_across_ranks_are_named_on_every_rank(tmp_path: Path) -> None:
    """3 ranks; rank 1 (and in ``count`` rank 2 too) builds another model: every rank raises the
    same ConfigError naming rank 1 and the first parameter that differs, at construction (which
    is collective). Other values alone are not an error (hvd.broadcast_parameters follows)."""
    results = horovodrun(3, "mismatched_parameters", tmp_path)
    for rank, result in enumerate(results):
        errors = result["errors"]
        assert errors["values"] == "no error", (rank, errors["values"])
        for kind, text in DIFFERENCES.items():
            assert errors[kind].startswith("ConfigError") and text in errors[kind], (rank, kind, errors[kind])
            assert errors[kind] == results[0]["errors"][kind], (rank, kind)  # the same words on every rank


@pytest.mark.parametrize("fault", ["stalls", "dies"])
def test_a_rank_that_stalls_or_dies_is_named_within_the_timeout(fault: str, tmp_path: Path) -> None:
    """Horovod's own allreduce waits for a stalled rank forever; under the loop every other rank
    fails within the timeout (plus the fault report's 2 s) with a PeerError naming it. A rank that
    exits mid-step (status 0, so horovodrun does not end the others) is named the same way."""
    out = tmp_path / fault
    env = horovodrun_env()
    command = [HOROVODRUN, "--gloo", "-np", "3", "-H", "localhost:3", sys.executable, str(BODIES), "faulty_rank"]
    arguments = {"faulty": 2, "fault": fault, "stall_s": 25.0, "timeout": 6.0}  # rank 0 exits once it has its error
    proc = subprocess.run(
        [*command, str(out), json.dumps(arguments)], capture_output=True, text=True, timeout=180, env=env
    )
    for rank in (0, 1):
        path = Path(f"{out}.rank{rank}.json")
        assert path.exists(), f"rank {rank} wrote no result:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        result = json.loads(path.read_text())
        assert result["error"] == "PeerError" and "rank 2 did not reach step 5" in result["message"], result
        # A dead rank ends Horovod's loop first on the ranks that talk to it; a rank still blocked in
        # Horovod's allreduce when their report window ends is named with it (then no single peer)
        assert result["peer"] == 2 or (fault == "dies" and result["peer"] is None), result
        assert result["seconds"] < 6.0 + 2 * 2.0 + 6.0, result  # timeout + report windows + the steps before

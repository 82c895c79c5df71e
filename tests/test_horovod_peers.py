"""Horovod 0.28.1's own tests of ``hvd.DistributedOptimizer`` (../shared/peers/horovod, unmodified)
run under ``horovodrun --gloo`` twice: as published, and with the optimizer replaced by
stragglerkit's (tests/horovod_peer_plugin.py). Every test that passes with Horovod's optimizer must
pass with ours, on every rank."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from _horovod import HOROVODRUN, ROOT, horovodrun_env, rank_errors

PEERS = ROOT.parent / "shared" / "peers" / "horovod"
OPTIMIZER_TESTS = (
    "test_broadcast_state",
    "test_broadcast_state_options",
    "test_broadcast_state_no_grad",
    "test_force_allreduce",
    "test_model_parallelism",
    "test_delta_optimizer",
    "test_duplicate_names",
    "test_dynamic_requires_grad",
    "test_gradient_clipping",
    "test_synchronize_step_warning",
    "test_no_named_parameters",
    "test_missing_named_parameters",
    "test_optimizer_no_named_parameters",
    "test_sparse_embeddings",
    "test_optimizer_process_sets",
)
"""The tests of test_torch.py that make an ``hvd.DistributedOptimizer``."""

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("horovod") is None or not Path(HOROVODRUN).exists(),
        reason="Horovod is not installed: bash scripts/install_horovod.sh (scripts/setup.sh runs it)",
    ),
    pytest.mark.skipif(not (PEERS / "test_torch.py").exists(), reason=f"no peer suite at {PEERS}"),
]


def outcomes(n: int, tmp_path: Path, ours: bool, why: dict[str, str] | None = None) -> dict[str, set[str]]:
    """{test name: the outcomes its ranks had} for the optimizer tests on ``n`` ranks; ``why`` gets
    the first rank's message for each test that did not pass."""
    out = tmp_path / ("ours" if ours else "horovod") / str(n)
    out.mkdir(parents=True)
    plugin = "-p horovod_peer_plugin" if ours else ""
    selection = " or ".join(f"{name}" for name in OPTIMIZER_TESTS)
    pytest_command = (
        f"{sys.executable} -m pytest -q -p no:cacheprovider {plugin} {PEERS / 'test_torch.py'} "
        f"-k '{selection}' --junitxml={out}/rank_$HOROVOD_RANK.xml"
    )
    env = horovodrun_env(ROOT / "tests")  # the same for Horovod's optimizer and ours
    proc = subprocess.run(
        [HOROVODRUN, "--gloo", "-np", str(n), "-H", f"localhost:{n}", "bash", "-c", pytest_command],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    reports = sorted(out.glob("rank_*.xml"))
    assert len(reports) == n, (
        f"horovodrun ({proc.returncode}) left {len(reports)} reports:\n{rank_errors(proc.stdout + proc.stderr)}\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    seen: dict[str, set[str]] = {}
    for report in reports:
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            child = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
            seen.setdefault(str(case.get("name")), set()).add("passed" if child is None else child.tag)
            if why is not None and child is not None and child.tag != "skipped":
                why.setdefault(str(case.get("name")), str(child.get("message"))[:300])
    return seen


@pytest.mark.parametrize("n", [2, 3])
def test_horovods_optimizer_tests_pass_with_stragglerkits_optimizer(n: int, tmp_path: Path) -> None:
    theirs = outcomes(n, tmp_path, ours=False)
    why: dict[str, str] = {}
    ours = outcomes(n, tmp_path, ours=True, why=why)
    assert set(OPTIMIZER_TESTS) <= set(theirs), sorted(theirs)  # (-k also selects test_broadcast_state_gpu)
    passing = {name for name, seen in theirs.items() if seen == {"passed"}}
    assert len(passing) >= 8, theirs  # most of them run on CPU ranks
    regressions = {name: sorted(ours[name]) for name in passing if ours.get(name) != {"passed"}}
    assert not regressions, f"pass with Horovod's optimizer but not with stragglerkit's: {regressions}\n" + "\n".join(
        f"  {name}: {why.get(name)}" for name in sorted(regressions)
    )
    print(f"n = {n}: Horovod's optimizer {dict(sorted((k, sorted(v)) for k, v in theirs.items()))}")
    print(f"n = {n}: stragglerkit's {dict(sorted((k, sorted(v)) for k, v in ours.items()))}")

"""Horovod 0.28.1's own tests of ``hvd.DistributedOptimizer`` (../shared/peers/horovod, unmodified)
run under ``horovodrun --gloo`` twice: as published, where exactly :data:`PASS_WITH_HOROVOD` must
pass, and with the optimizer replaced by stragglerkit's (tests/horovod_peer_plugin.py), where every
one of those must pass too, on every rank. The second run takes only those tests: the others fail or
skip with Horovod's own optimizer already."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable
from pathlib import Path

import pytest
from _horovod import HOROVODRUN, ROOT, horovodrun_env, rank_errors
from _require import needs

PEERS = ROOT.parent / "shared" / "peers" / "horovod"
OPTIMIZER_TESTS = (
    "test_broadcast_state",
    "test_broadcast_state_gpu",
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
PASS_WITH_HOROVOD = frozenset(
    {
        "test_broadcast_state_no_grad",
        "test_duplicate_names",
        "test_dynamic_requires_grad",
        "test_gradient_clipping",
        "test_missing_named_parameters",
        "test_no_named_parameters",
        "test_optimizer_no_named_parameters",
        "test_optimizer_process_sets",
        "test_sparse_embeddings",
        "test_synchronize_step_warning",
    }
)
"""Those that pass with Horovod's own optimizer on 2 and on 3 CPU ranks with torch 2.13. Of the
others, test_broadcast_state, test_broadcast_state_options and test_force_allreduce fail (they build
every ``torch.optim`` optimizer, and torch's Muon refuses parameters that are not 2-D);
test_delta_optimizer skips without MPI (Adasum), test_broadcast_state_gpu and test_model_parallelism
without GPUs."""

pytestmark = [
    needs(
        "Horovod",
        importlib.util.find_spec("horovod") is None or not Path(HOROVODRUN).exists(),
        "bash scripts/install_horovod.sh (scripts/setup.sh runs it)",
    ),
    needs(
        "Horovod's own tests",
        not (PEERS / "test_torch.py").exists(),
        f"no peer suite at {PEERS} (../shared/peers beside the repository)",
    ),
]


def outcomes(n: int, tmp_path: Path, tests: Iterable[str], ours: bool, why: dict[str, str]) -> dict[str, set[str]]:
    """{test name: the outcomes its ranks had} for ``tests`` of test_torch.py on ``n`` ranks, with
    Horovod's optimizer or ours; ``why`` gets the first rank's message for each test that did not pass."""
    out = tmp_path / ("ours" if ours else "horovod") / str(n)
    out.mkdir(parents=True)
    plugin = "-p horovod_peer_plugin" if ours else ""
    selection = " ".join(f"{PEERS / 'test_torch.py'}::TorchTests::{name}" for name in tests)
    pytest_command = (
        f"{sys.executable} -m pytest -q -p no:cacheprovider {plugin} {selection} "
        f"--junitxml={out}/rank_$HOROVOD_RANK.xml"
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
            if child is not None:
                why.setdefault(str(case.get("name")), str(child.get("message"))[:300])
    return seen


def _listed(seen: dict[str, set[str]], names: Iterable[str], why: dict[str, str]) -> str:
    """One line per test: its ranks' outcomes and the first message."""
    return "\n".join(f"  {name}: {sorted(seen.get(name, {'not run'}))} {why.get(name, '')}" for name in sorted(names))


@pytest.mark.parametrize("n", [2, 3])
def test_horovods_optimizer_tests_pass_with_stragglerkits_optimizer(n: int, tmp_path: Path) -> None:
    why_theirs: dict[str, str] = {}
    theirs = outcomes(n, tmp_path, OPTIMIZER_TESTS, ours=False, why=why_theirs)
    assert set(theirs) == set(OPTIMIZER_TESTS), sorted(theirs)
    passing = {name for name, seen in theirs.items() if seen == {"passed"}}
    assert passing == PASS_WITH_HOROVOD, (
        "with Horovod's own optimizer, these tests no longer pass:\n"
        + _listed(theirs, PASS_WITH_HOROVOD - passing, why_theirs)
        + "\nand these pass now (add them to PASS_WITH_HOROVOD):\n"
        + _listed(theirs, passing - PASS_WITH_HOROVOD, why_theirs)
    )
    why: dict[str, str] = {}
    ours = outcomes(n, tmp_path, sorted(PASS_WITH_HOROVOD), ours=True, why=why)
    regressions = {name for name in PASS_WITH_HOROVOD if ours.get(name) != {"passed"}}
    assert not regressions, "pass with Horovod's optimizer but not with stragglerkit's:\n" + _listed(
        ours, regressions, why
    )
    print(f"n = {n}: Horovod's optimizer {dict(sorted((k, sorted(v)) for k, v in theirs.items()))}")
    print(f"n = {n}: stragglerkit's {dict(sorted((k, sorted(v)) for k, v in ours.items()))}")

"""The layers hold: lint-imports keeps the contract of .importlinter, and breaks it when a lower
layer imports a higher one or two subpackages import each other (docs/architecture.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(where))
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(where / ".importlinter"), "--no-cache"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's Python sources and the contract, copied (the copy is then changed)."""
    where = tmp_path_factory.mktemp("layers")
    shutil.copytree(ROOT / "stragglerkit", where / "stragglerkit", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / ".importlinter", where / ".importlinter")
    return where


def test_the_package_keeps_its_layers() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _with_line(copy: Path, module: str, line: str) -> Path:
    path = copy / "stragglerkit" / module
    original = path.read_text(encoding="utf-8")
    path.write_text(original + f"\n{line}\n", encoding="utf-8")
    return path


def test_a_lower_layer_that_imports_a_higher_one_breaks_the_contract(copy: Path) -> None:
    path = _with_line(copy, "runtime/executor.py", "import stragglerkit.detect  # noqa")
    original = path.read_text(encoding="utf-8")
    try:
        result = _lint(copy)
    finally:
        path.write_text(original.rsplit("\nimport stragglerkit.detect", 1)[0] + "\n", encoding="utf-8")
    assert result.returncode != 0, result.stdout
    assert "Layers: each module imports only from its own layer and below BROKEN" in result.stdout
    assert "stragglerkit.runtime is not allowed to import stragglerkit.detect" in result.stdout


def test_a_function_level_import_counts_and_a_cycle_breaks_the_contract(copy: Path) -> None:
    # inside a function, and from the simulator into the planner, which imports the simulator
    path = _with_line(copy, "sim/fast.py", "def _up() -> None:\n    import stragglerkit.planner  # noqa")
    try:
        result = _lint(copy)
    finally:
        path.write_text(path.read_text(encoding="utf-8").rsplit("\ndef _up()", 1)[0] + "\n", encoding="utf-8")
    assert result.returncode != 0, result.stdout
    assert "stragglerkit.sim is not allowed to import stragglerkit.planner" in result.stdout
    assert "No import cycles among the subpackages and top-level modules BROKEN" in result.stdout

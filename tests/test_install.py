"""``pip install .`` into an environment that already has torch keeps that torch and builds the
extension against it (build_backend/ lets pip's isolated build see the installed torch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch
from _require import needs

ROOT = Path(__file__).resolve().parents[1]


@needs("git", shutil.which("git") is None, "it copies the source tree: apt-get install git")
def test_pip_install_keeps_the_installed_torch(tmp_path: Path) -> None:
    target = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    python = target / "bin" / "python"
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )
    # the environment "has torch" (and numpy, ...): this test environment's packages, through a .pth
    (site_packages / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.so", "*.egg-info",
                                                                 "__pycache__", "profiling"))
    # a new environment: no PYTHONPATH (the lab's tests put the repository root there) or pip settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_REQUIRE") and k != "PYTHONPATH"}
    subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps", str(source)],
        check=True, env=env, timeout=1800,
    )
    probe = subprocess.run(
        [str(python), "-c", "import torch, stragglerkit, stragglerkit._C; print(torch.__version__, torch.__file__); "
         "print(stragglerkit.__file__)"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=env,
    ).stdout.split("\n")
    version, torch_file = probe[0].split(" ", 1)
    assert version == torch.__version__
    assert torch_file == torch.__file__  # the same installation, not a second torch
    assert probe[1].startswith(str(site_packages))  # the installed package, with its built extension

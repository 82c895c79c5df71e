"""The CUDA reduction kernel compiles with nvcc wherever a CUDA toolkit is present."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "csrc" / "reduce_cuda.cu"


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidate = Path(cuda_home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else None


def test_cuda_reduction_kernel_compiles(tmp_path: Path) -> None:
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip(
            "no CUDA toolkit (nvcc not on PATH and not under $CUDA_HOME/bin): the kernel is not compiled here; "
            "run scripts/gpu_check.sh on a GPU machine"
        )
    out = tmp_path / "reduce_cuda.o"
    proc = subprocess.run(
        [nvcc, "-c", str(KERNEL), "-o", str(out), "-O3", "-std=c++17", "-Xcompiler", "-Wall"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"nvcc failed:\n{proc.stdout}\n{proc.stderr}"
    symbols = subprocess.run(["nm", str(out)], capture_output=True, text=True).stdout
    assert "stragglerkit_cuda_reduce_add" in symbols

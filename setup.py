"""Builds stragglerkit and its native extension stragglerkit._C from csrc/."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cpp"))
CUDA_SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cu"))
# The CUDA reduction kernel joins the extension when torch is a CUDA build and a toolkit is present
# (STRAGGLERKIT_NO_CUDA=1 opts out); tests/test_cuda_kernel.py compiles it with nvcc either way.
WITH_CUDA = torch.version.cuda is not None and CUDA_HOME is not None and os.environ.get("STRAGGLERKIT_NO_CUDA") != "1"


def native_extension() -> CppExtension:
    if WITH_CUDA:
        return CUDAExtension(
            "stragglerkit._C",
            SOURCES + CUDA_SOURCES,
            define_macros=[("STRAGGLERKIT_CUDA", None)],
            extra_compile_args={"cxx": ["-O3", "-std=c++17"], "nvcc": ["-O3", "-std=c++17"]},
        )
    return CppExtension("stragglerkit._C", SOURCES, extra_compile_args=["-O3", "-std=c++17"])


setup(
    name="stragglerkit",
    version="0.2.0",
    description="Straggler-aware AllReduce for data-parallel training (StragglAR, OptCC, selective reduce)",
    packages=find_packages(include=["stragglerkit", "stragglerkit.*"]),
    python_requires=">=3.11",
    # the oldest torch tested is 2.11 (the development set-up pins 2.13.0: scripts/setup.sh)
    install_requires=["torch>=2.11", "numpy", "scipy", "networkx", "matplotlib", "pyyaml", "tqdm"],
    # wandb: per-step logging to Weights & Biases; nvtx: NVTX ranges without a CUDA build of torch
    extras_require={"dev": ["pytest", "ruff", "mypy", "types-PyYAML"], "wandb": ["wandb"], "nvtx": ["nvtx"]},
    ext_modules=[native_extension()],
    cmdclass={"build_ext": BuildExtension},
    entry_points={"console_scripts": ["stragglerkit=stragglerkit.cli:main"]},
)

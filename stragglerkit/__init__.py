"""stragglerkit: fast data-parallel AllReduce when some ranks are slow.

Example::

    import torch.distributed as dist
    import stragglerkit

    dist.init_process_group("gloo")
    stragglerkit.init()                          # collective, once per group
    stragglerkit.all_reduce(grad)                # like dist.all_reduce
    state = stragglerkit.DDPState(None)          # the closed loop as a DDP comm hook
    ddp_model.register_comm_hook(state, stragglerkit.ddp_hook)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from stragglerkit.api import Work, all_reduce, destroy, init, is_initialized, last_run
from stragglerkit.config import Config
from stragglerkit.errors import (
    CollectiveError,
    ConfigError,
    NotApplicableError,
    NotInitializedError,
    PeerError,
    ScheduleError,
    StragglerKitError,
)
from stragglerkit.runtime.calls import FallbackWarning, RunRecord
from stragglerkit.telemetry import wandb as _wandb
from stragglerkit.version import __version__

if TYPE_CHECKING:
    from stragglerkit.decorator import straggler_aware
    from stragglerkit.integrations.ddp import DDPState, ddp_hook
    from stragglerkit.loop import StragglerLoop

__all__ = [
    "CollectiveError",
    "Config",
    "ConfigError",
    "DDPState",
    "FallbackWarning",
    "NotApplicableError",
    "NotInitializedError",
    "PeerError",
    "RunRecord",
    "ScheduleError",
    "StragglerKitError",
    "StragglerLoop",
    "Work",
    "__version__",
    "all_reduce",
    "ddp_hook",
    "destroy",
    "init",
    "is_initialized",
    "last_run",
    "straggler_aware",
]

_LAZY = {
    "DDPState": "stragglerkit.integrations.ddp",
    "ddp_hook": "stragglerkit.integrations.ddp",
    "StragglerLoop": "stragglerkit.loop",
    "straggler_aware": "stragglerkit.decorator",
}


def _report_figures(log: Path) -> list[tuple[str, bytes]]:
    """The offline report's figures of an event log, for the W&B logger at the loop's close
    (telemetry sits below the report, so the package wires them together here)."""
    from stragglerkit.report.plots import event_log_figures

    return event_log_figures(log)


_wandb.set_figure_drawer(_report_figures)


if not TYPE_CHECKING:  # (hidden from type checkers, which see the imports above)

    def __getattr__(name: str) -> Any:
        """The integrations load on first use (they pull in the cost model, scipy and the simulator)."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'stragglerkit' has no attribute {name!r}")
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

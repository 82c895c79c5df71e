"""What a checkpoint keeps of the closed loop, and how a pickled one is read back.

:func:`loop_state` is :meth:`StragglerLoop.__getstate__`'s dict: the settings, the controller,
the step, the exchange schedule (the step of the last exchange, rank 0's decision not yet
shipped, the clock re-measurements), the last step's bucket sizes, the rank it was saved on,
the run's id, the adapter's name and the event log (path, run header written, records queued).
:func:`restore` reads it back, also as an earlier version wrote it (``version`` 1: the settings
as a ``ControllerConfig``, the event log inside the controller).

Example::

    state = loop_state(loop)                  # what pickle stores
    restore(StragglerLoop.__new__(StragglerLoop), state)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stragglerkit.errors import ConfigError
from stragglerkit.loop.exchange import Exchange
from stragglerkit.loop.sinks import EventLogSink
from stragglerkit.telemetry.records import RecordLog

if TYPE_CHECKING:
    from stragglerkit.loop.loop import StragglerLoop

__all__ = ["STATE_VERSION", "loop_state", "restore"]

STATE_VERSION = 2
"""2: ``config`` is the loop's ``Settings`` and the event log is the loop's own; 1 (earlier
versions): ``config`` a ``ControllerConfig``, the event log inside the controller."""


def loop_state(loop: StragglerLoop) -> dict[str, Any]:
    """The loop's checkpoint state (the loop finished its exchange in flight first)."""
    exchange = loop.exchange
    return {
        "version": STATE_VERSION,
        "config": loop.settings,
        "controller": loop.controller,
        "clock_syncs": list(exchange.clock_syncs),
        "step": loop._step,
        "algorithm": loop._algorithm,
        "last_exchange": exchange.last_exchange,
        "decision_in_flight": exchange.decision_in_flight,
        "previous_sizes": loop._previous_sizes,
        "rank": loop._saved_rank,
        "run_id": loop.run_id,
        "framework": loop.framework,
        "records": loop.event_log.log,
    }


def restore(loop: StragglerLoop, state: dict[str, Any]) -> tuple[RecordLog, str | None]:
    """Set ``loop``'s kept state from ``state``; return its event log and its run id (``None``
    where the state has none)."""
    version = state.get("version")
    if version not in (1, STATE_VERSION):
        raise ConfigError(f"a stragglerkit loop state of version {version!r}; this version reads 1 to {STATE_VERSION}")
    controller = state["controller"]
    loop.controller = controller
    loop.settings = controller.settings if version == 1 else state["config"]
    controller.settings = loop.settings
    records = state.get("records")
    if records is None:  # version 1: the controller kept the log
        records = controller.restored_records if controller.restored_records is not None else RecordLog(None)
    controller.restored_records = None
    exchange = Exchange(state["last_exchange"], state["decision_in_flight"])
    exchange.clock_syncs.extend(state["clock_syncs"])
    loop.exchange = exchange
    loop.event_log = EventLogSink(log=records)
    loop._step = state["step"]
    loop._algorithm = state["algorithm"]
    loop._previous_sizes = list(state["previous_sizes"])
    loop._saved_rank = state["rank"]
    loop.framework = state.get("framework", "loop")
    return records, state.get("run_id")

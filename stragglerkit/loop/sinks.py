"""Where the closed loop's records go: the event log, Weights & Biases, NVTX marks.

A record is a plain dict (docs/event_log.md): the ``run`` header, the decisions every rank
adopts, rank 0's ``window`` per exchange. A :class:`RecordSink` takes records on the loop's
thread (:meth:`RecordSink.add`) and may hold them until :meth:`RecordSink.flush`, which the loop
calls once per exchange, after the step's first bucket went to its AllReduce, and when a
decision is adopted. :class:`Sinks` hands every record to each sink in order; the controller
only produces records (its decisions' events, its :attr:`~stragglerkit.detect.controller.Controller.outbox`).

Example::

    sinks = Sinks([EventLogSink("events.jsonl"), NvtxSink()])
    sinks.add({"kind": "switch", "step": 40, "algorithm": "stragglar", "evidence": {}})
    sinks.flush()
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any, Protocol

from stragglerkit.plans import EVENT_KINDS
from stragglerkit.telemetry import nvtx
from stragglerkit.telemetry.records import RecordLog
from stragglerkit.telemetry.wandb import WandbLogger

__all__ = ["EventLogSink", "NvtxSink", "RecordSink", "Sinks", "WandbSink"]


class RecordSink(Protocol):
    """What takes the loop's records."""

    @property
    def wanted(self) -> bool:
        """Are records worth building for this sink now (window records cost predictions)?"""
        ...

    def add(self, record: dict[str, Any]) -> None:
        """Take one record (the loop's thread)."""
        ...

    def flush(self) -> None:
        """Write or hand on what was taken (the loop's thread)."""
        ...

    def close(self) -> None:
        """The loop stops: write what is left, let go of what the sink holds."""
        ...


class EventLogSink:
    """The JSONL event log (:class:`~stragglerkit.telemetry.records.RecordLog`): an unwritable file
    is reported once and written no more; training goes on."""

    __slots__ = ("log",)

    def __init__(self, path: str | None = None, log: RecordLog | None = None) -> None:
        self.log = log if log is not None else RecordLog(path)

    @property
    def path(self) -> str | None:
        return self.log.path

    @path.setter
    def path(self, path: str | None) -> None:
        self.log.path = path

    @property
    def wanted(self) -> bool:
        return self.log.path is not None

    def start(self, header: dict[str, Any]) -> None:
        """Write the ``run`` header (once per binding; see ``RecordLog.start``)."""
        try:
            self.log.start(header)
        except OSError as err:
            self._failed(err)

    def add(self, record: dict[str, Any]) -> None:
        if self.log.path is not None:
            self.log.put(record)

    def flush(self) -> None:
        try:
            self.log.flush()
        except OSError as err:
            self._failed(err)

    def close(self) -> None:
        self.flush()

    def _failed(self, err: OSError) -> None:
        warnings.warn(
            f"stragglerkit: the event log {self.log.path} cannot be written, no more records go there: {err}",
            stacklevel=4,
        )
        self.log.path = None


class WandbSink:
    """Rank 0's Weights & Biases logger (:mod:`stragglerkit.telemetry.wandb`)."""

    __slots__ = ("logger",)

    def __init__(self, logger: WandbLogger) -> None:
        self.logger = logger

    @property
    def wanted(self) -> bool:
        return bool(self.logger.active)

    def add(self, record: dict[str, Any]) -> None:
        self.logger.add(record)

    def flush(self) -> None:
        self.logger.pump()

    def close(self) -> None:
        self.logger.close()


class NvtxSink:
    """Marks each adopted decision on the timeline (``stragglerkit/decision <kind>``)."""

    __slots__ = ()

    @property
    def wanted(self) -> bool:
        return False  # marks cost nothing to make; they need no window records

    def add(self, record: dict[str, Any]) -> None:
        if record.get("kind") in EVENT_KINDS:
            nvtx.mark(nvtx.DECISION, record.get("kind"))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Sinks:
    """Every sink of a loop, each given every record in order."""

    __slots__ = ("sinks",)

    def __init__(self, sinks: Iterable[RecordSink] = ()) -> None:
        self.sinks = list(sinks)

    @property
    def wanted(self) -> bool:
        return any(sink.wanted for sink in self.sinks)

    def add(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.add(record)

    def add_all(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.add(record)

    def flush(self) -> None:
        for sink in self.sinks:
            sink.flush()

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

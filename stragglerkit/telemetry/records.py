"""The closed loop's records, as written: the JSONL event log's ``run`` and ``window`` lines.

docs/event_log.md is the schema; this module is the writing side (the reading side is
:mod:`stragglerkit.report.events`). Three kinds of line go into one file per writing rank:

* ``run``, the header: who wrote the file (rank, world size, framework, hosts, version), the
  controller's configuration and a ``run_id`` that is the same on every rank of the run, so that
  the per-rank files of one run can be told from those of another in one folder.
* the decisions (``detected_straggler``, ``switch``, ``rollback``, ...), unchanged: the events of
  :class:`~stragglerkit.detect.controller.Controller`, one per line, on every writing rank.
* ``window``, rank 0 only: what one stats exchange measured, step by step (lateness of each
  rank, the AllReduce part, the algorithms, each rank's NIC rate and slowdown, the cost model's
  prediction); :func:`window_record` builds it from the controller's
  :class:`~stragglerkit.plans.WindowStats`.

**Threads.** Rank 0 digests an exchange on a background thread while the training thread runs
the next steps and adopts decisions. :class:`RecordLog` takes records from any thread
(:meth:`RecordLog.put` only appends to a deque) and writes them from the loop's thread alone
(:meth:`RecordLog.flush`), in the order they were put. The loop flushes once per exchange, after
the step's first bucket went to its AllReduce, so the file is touched off the critical path and
only every ``K`` steps; a decision is written when it is adopted, as before.

**Reused paths.** The header is written when the file is new or empty. A restored loop keeps its
run's ``run_id`` and appends under that header; a new run writing to a file whose last ``run``
line names another run starts a new section with a ``run`` line of its own, so nothing of the
earlier run is lost (readers take the sections apart by those lines).

Example::

    log = RecordLog("run/events.rank{rank}.jsonl".format(rank=0))
    log.start(run_record(run_id, rank=0, world_size=4, framework="ddp", hosts=None, config=cfg))
    log.put(window_record(stats))          # any thread
    log.flush()                            # the loop's thread
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from stragglerkit.plans import WindowStats
from stragglerkit.version import __version__

__all__ = [
    "FRAMEWORKS",
    "SCHEMA",
    "RecordConsumer",
    "RecordLog",
    "new_run_id",
    "nic_rates",
    "plain",
    "run_record",
    "window_record",
]

SCHEMA = 1
"""The version of the ``run`` and ``window`` lines (``"schema"`` in the header)."""
FRAMEWORKS = ("ddp", "horovod", "megatron", "loop")
"""What the header's ``framework`` names: an adapter, or ``loop`` for the loop used directly."""
_RUN_PREFIX = b'{"kind": "run"'


def new_run_id() -> str:
    """A fresh run id: 16 random hex digits (the loop shares one between its ranks through the rendezvous store)."""
    return secrets.token_hex(8)


def plain(value: Any) -> Any:
    """``value`` as plain JSON data: numpy scalars and arrays as numbers and lists, NaN and
    infinities as ``None`` (strict JSON has neither), dataclasses as dicts, anything else as text."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value)


def run_record(
    run_id: str,
    *,
    rank: int,
    world_size: int,
    framework: str,
    hosts: Sequence[int] | None,
    config: Any,
    version: str | None = None,
    started: float | None = None,
) -> dict[str, Any]:
    """The header line (``kind: run``, docs/event_log.md): ``config`` is the loop's settings
    (``Config.detection`` and the internal constants it runs with; any dataclass), ``hosts`` a host
    id per rank or ``None`` when unknown."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if version is None:
        version = __version__
    return {
        "kind": "run",
        "schema": SCHEMA,
        "run_id": run_id,
        "rank": rank,
        "world_size": world_size,
        "started": time.time() if started is None else started,
        "framework": framework,
        "hosts": None if hosts is None else [int(h) for h in hosts],
        "version": version,
        "config": plain(config),
    }


def nic_rates(link_rates: np.ndarray) -> list[float | None]:
    """Per rank: the achieved bytes/s of its fastest measured link in a ``[src, dst]`` matrix
    (``None``: no link of it measured). A link runs at the slower of its two NICs, so a healthy
    rank next to a degraded one has one slow link and one fast one: its fastest link is what its
    own NIC showed it can do (the same reading the detector's slowdown is taken from)."""
    matrix = np.asarray(link_rates, dtype=np.float64)
    n = matrix.shape[0]
    observed = np.isfinite(matrix) & (matrix > 0)
    np.fill_diagonal(observed, False)
    masked = np.where(observed, matrix, 0.0)
    fastest = np.maximum(masked.max(axis=1, initial=0.0), masked.max(axis=0, initial=0.0))
    return [float(fastest[r]) if fastest[r] > 0 else None for r in range(n)]


def _per_step_lateness(stats: WindowStats) -> list[list[float | None]]:
    """[step][rank]: ``stats.lateness`` holds rows for the steps whose every arrival is known
    only; the others get a row of ``None``."""
    n = stats.totals.shape[1] if stats.totals.ndim == 2 else 0
    empty: list[float | None] = [None] * n
    if stats.lateness is None:
        return [list(empty) for _ in stats.steps]
    rows = iter(np.asarray(stats.lateness, dtype=np.float64))
    complete: list[bool] = [True] * len(stats.steps)
    if stats.arrival_wall is not None:
        arrivals = np.asarray(stats.arrival_wall, dtype=np.float64)
        complete = [not np.isnan(arrivals[i]).any() for i in range(arrivals.shape[0])]
    out = []
    for known in complete:
        row = next(rows, None) if known else None
        out.append(plain(row) if row is not None else list(empty))
    return out


def window_record(
    stats: WindowStats,
    slowdowns: Sequence[float] | np.ndarray | None = None,
    predicted: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """The ``window`` line of one exchange (rank 0): ``slowdowns`` is the detector's ``l`` per
    rank from this exchange (NaN: no estimate), ``predicted`` the cost model's AllReduce part per
    step for the algorithms that ran."""
    steps = len(stats.steps)
    buckets = len(stats.bucket_bytes)

    def per_step(values: np.ndarray | None) -> list[float | None]:
        if values is None:
            return [None] * steps
        return [plain(float(v)) for v in np.asarray(values, dtype=np.float64)[:steps]]

    return {
        "kind": "window",
        "steps": [int(s) for s in stats.steps],
        "lateness_s": _per_step_lateness(stats),
        "allreduce_s": per_step(stats.tails),
        "step_end_s": per_step(stats.ends),
        "algorithms": [list(row[:buckets]) for row in stats.algorithms[:steps]],
        "bucket_bytes": [int(b) for b in stats.bucket_bytes],
        "nic_rate_Bps": nic_rates(stats.link_rates),
        "slowdown": [None] * stats.totals.shape[1] if slowdowns is None else plain(np.asarray(slowdowns, float)),
        "predicted_s": [None] * steps if predicted is None else [plain(p) for p in predicted],
    }


class RecordConsumer(Protocol):
    """Who else takes the records as they are written (rank 0's W&B logger)."""

    @property
    def active(self) -> bool:
        """Does it want records now (window records are built only if someone does)?"""
        ...

    def add(self, record: dict[str, Any]) -> None: ...


class RecordLog:
    """The loop's JSONL file: records put from any thread, written from the loop's thread.

    ``path``: the file (``None``: nothing is written; records are still handed to
    :attr:`consumer`). :attr:`wanted` says whether records are worth building at all.

    Example::

        log = RecordLog("events.jsonl")
        log.put({"kind": "switch", "step": 40, "algorithm": "stragglar", "evidence": {}})
        log.flush()
    """

    __slots__ = ("_queue", "consumer", "path", "started")

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._queue: deque[dict[str, Any]] = deque()
        self.consumer: RecordConsumer | None = None
        """Given every record as it is flushed (rank 0's W&B logger); not saved."""
        self.started: str | None = None
        """The run id whose header this file has (set by :meth:`start`)."""

    @property
    def wanted(self) -> bool:
        """Is anyone taking records (a file, or a consumer)?"""
        return self.path is not None or (self.consumer is not None and self.consumer.active)

    def put(self, record: dict[str, Any]) -> None:
        """Queue ``record`` (any thread: a deque's append is atomic)."""
        self._queue.append(record)

    def start(self, header: dict[str, Any]) -> None:
        """Write the ``run`` header unless the file's last run already is ``header``'s (the loop's
        thread, once per binding)."""
        self.started = header["run_id"]
        if self.path is None:
            return
        folder = os.path.dirname(self.path)
        if folder:
            os.makedirs(folder, exist_ok=True)  # a run folder named in the configuration, not made yet
        _end_cut_line(self.path)
        if _last_run_id(self.path) != header["run_id"]:
            _append(self.path, [json.dumps(header, allow_nan=False)])

    def flush(self) -> None:
        """Write what was queued, in order, with one open of the file (the loop's thread)."""
        if not self._queue:
            return
        records = []
        while self._queue:
            records.append(self._queue.popleft())
        if self.path is not None:
            # decisions as they always were (sort_keys); run and window lines in the schema's order
            _append(
                self.path,
                [json.dumps(r, sort_keys=r["kind"] not in ("run", "window")) for r in records],
            )
        if self.consumer is not None:
            for record in records:
                self.consumer.add(record)

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "queue": list(self._queue), "started": self.started}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._queue = deque(state["queue"])
        self.consumer = None
        self.started = state["started"]


def _append(path: str, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as log:
        log.write("".join(line + "\n" for line in lines))


def _end_cut_line(path: str) -> None:
    """End a last line that a killed run left cut short, so that the next record starts a line of
    its own (the reader reports the cut one and reads on)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return
            handle.seek(-1, os.SEEK_END)
            last = handle.read(1)
    except FileNotFoundError:
        return
    if last != b"\n":
        with open(path, "ab") as handle:
            handle.write(b"\n")


def _last_run_id(path: str) -> str | None:
    """The ``run_id`` of the last ``run`` line of ``path`` (``None``: no file, or no header)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return None
    last = None
    with handle:
        for line in handle:
            if line.startswith(_RUN_PREFIX):
                last = line
    if last is None:
        return None
    try:
        found = json.loads(last).get("run_id")
    except ValueError:  # a header cut short by a killed run: a new one follows
        return None
    return found if isinstance(found, str) else None

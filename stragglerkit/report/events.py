"""Reading the loop's JSONL event log: the run header, the decisions and rank 0's windows.

The loop writes one file per run (rank 0 only) or one per rank (a path with ``{rank}``), one JSON
object a line, each with a ``"kind"`` (docs/report.md, "The event log"):

* ``run`` -- the first line of every file: ``run_id`` (the same on every rank), ``rank``,
  ``world_size``, ``framework``, ``hosts``, ``version`` and the controller's ``config``;
* the decisions (``detected_straggler``, ``detected_degraded``, ``switch``, ``rollback``,
  ``cleared``, ``probing``, ``verified``, ``exchange``) with ``step``, ``algorithm`` and
  ``evidence`` -- the same on every rank that writes a file;
* ``window`` -- rank 0 only, one per stats exchange: per step the ranks' lateness, the AllReduce
  part, the last finish, the buckets' algorithms and the model's prediction, and per rank the NIC
  rate and the detector's slowdown estimate.

:func:`read_event_log` never gives up on a file because of one bad line: a line that is not JSON
(a killed run's truncated last line, say), or a window whose lists do not fit its steps, becomes a
problem that names the file and the line, and the rest is read. A file that two runs wrote (a
path reused) holds one section per run, each starting at its ``run`` line; every section is read.
The line formats are specified in docs/event_log.md.

Example::

    [log] = read_event_log("run/events.rank0.jsonl")
    log.header["world_size"], len(log.decisions), len(log.windows), log.problems
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stragglerkit.plans import EVENT_KINDS

__all__ = ["DECISION_KINDS", "EventLog", "Window", "looks_like_event_log", "read_event_log"]

DECISION_KINDS = (
    *EVENT_KINDS,
    # stragglerkit.megatron's notes: what was left to megatron-core's own collective
    "megatron_reduce_scatter",
    "megatron_expert_parallel",
)
"""The decision events' kinds (the controller's ``EVENT_KINDS``) and the Megatron adapter's notes,
which have the same fields; a note written without a loop comes without a ``run`` header."""

SCHEMA = 1
"""The ``run`` header's ``schema`` this reader knows."""


@dataclass(kw_only=True, slots=True)
class Window:
    """One stats exchange as rank 0 saw it (all lists per step, or per rank where said)."""

    line: int
    """Line number in its file (1-based), for messages."""
    steps: list[int]
    lateness_s: list[list[float | None]]
    """Per step, per rank: arrival after the step's first arrival (None: unknown)."""
    allreduce_s: list[float | None]
    """Per step: last arrival to last finish."""
    step_end_s: list[float | None]
    """Per step: the last finish, rank 0's wall clock."""
    algorithms: list[list[str]]
    """Per step, per bucket."""
    bucket_bytes: list[int]
    nic_rate_Bps: list[float | None] | None
    """Per rank: the achieved NIC rate in bytes/s that this exchange measured (None: not measured)."""
    slowdown: list[float | None] | None
    """Per rank: the detector's slowdown estimate l."""
    predicted_s: list[float | None]
    """Per step: the cost model's prediction of the AllReduce part for the plan that ran."""


@dataclass(kw_only=True, slots=True)
class EventLog:
    """What one event-log file holds."""

    path: str
    header: dict[str, Any] | None = None
    """The ``run`` line (None when the file has none: a log from before the header existed)."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lines: int = 0
    """Lines read (the blank ones not counted)."""
    section: int = 0
    """Which run section of the file this is (0: the first; a later run may append its own)."""
    first_line: int = 1

    @property
    def rank(self) -> int | None:
        return None if self.header is None else int(self.header["rank"])

    @property
    def run_id(self) -> str | None:
        return None if self.header is None else str(self.header["run_id"])

    @property
    def world_size(self) -> int | None:
        return None if self.header is None else int(self.header["world_size"])


def looks_like_event_log(head: bytes) -> bool:
    """Whether a file's first bytes are an event log's first line (a JSON object with ``"kind"``)."""
    first = head.split(b"\n", 1)[0].strip()
    if not first.startswith(b"{"):
        return False
    try:
        record = json.loads(first)
    except ValueError:
        return first.startswith(b'{"kind"')  # a log whose header line was cut off still says so
    return isinstance(record, dict) and "kind" in record


def _number_list(value: Any, length: int | None, what: str, allow_none: bool = True) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list")
    if length is not None and len(value) != length:
        raise ValueError(f"{what} has {len(value)} entries, expected {length}")
    for item in value:
        if item is None and allow_none:
            continue
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise ValueError(f"{what} holds {item!r}, not a number")
    return value


def _window(record: dict[str, Any], line: int, world_size: int | None) -> Window:
    steps = record.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, int) for s in steps):
        raise ValueError("'steps' is not a list of step numbers")
    n = len(steps)
    lateness = record.get("lateness_s")
    if not isinstance(lateness, list) or len(lateness) != n:
        raise ValueError(f"'lateness_s' must hold one list per step ({n})")
    rows = [_number_list(row, world_size, "a row of 'lateness_s'") for row in lateness]
    algorithms = record.get("algorithms", [[] for _ in steps])
    if not isinstance(algorithms, list) or len(algorithms) != n:
        raise ValueError(f"'algorithms' must hold one list per step ({n})")
    nic = record.get("nic_rate_Bps")
    slowdown = record.get("slowdown")
    return Window(
        line=line,
        steps=steps,
        lateness_s=rows,
        allreduce_s=_number_list(record.get("allreduce_s", [None] * n), n, "'allreduce_s'"),
        step_end_s=_number_list(record.get("step_end_s", [None] * n), n, "'step_end_s'"),
        algorithms=[[str(a) for a in per_step] if isinstance(per_step, list) else [] for per_step in algorithms],
        bucket_bytes=_number_list(record.get("bucket_bytes", []), None, "'bucket_bytes'", allow_none=False),
        nic_rate_Bps=None if nic is None else _number_list(nic, world_size, "'nic_rate_Bps'"),
        slowdown=None if slowdown is None else _number_list(slowdown, world_size, "'slowdown'"),
        predicted_s=_number_list(record.get("predicted_s", [None] * n), n, "'predicted_s'"),
    )


def _header(record: dict[str, Any]) -> dict[str, Any]:
    schema = record.get("schema")
    if schema != SCHEMA:
        raise ValueError(f"run header has schema {schema!r}; this stragglerkit reads schema {SCHEMA}")
    for key in ("run_id", "rank", "world_size"):
        if key not in record:
            raise ValueError(f"run header lacks {key!r}")
    if not isinstance(record["rank"], int) or not isinstance(record["world_size"], int) or record["world_size"] < 1:
        raise ValueError("run header's 'rank' and 'world_size' must be whole numbers")
    if not 0 <= record["rank"] < record["world_size"]:
        raise ValueError(f"run header's rank {record['rank']} is outside world_size {record['world_size']}")
    return record


def read_event_log(path: str | Path) -> list[EventLog]:
    """Read one event-log file: one :class:`EventLog` per run section, oldest first.

    A file is one section unless a later run appended to it: every ``run`` line starts a new
    section (the writer does that when a new run reuses the path). Bad lines become
    :attr:`EventLog.problems` of the section they are in (see the module docstring).
    """
    name = str(path)
    sections = [EventLog(path=name)]
    with open(path, encoding="utf-8", errors="replace") as handle:
        text = handle.read()
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for index, raw in enumerate(lines):
        number = index + 1
        if not raw.strip():
            continue
        log = sections[-1]
        log.lines += 1
        try:
            record = json.loads(raw)
        except ValueError:
            if index == last and not text.endswith("\n"):
                log.problems.append(
                    f"{name}:{number}: the last line is cut off (the run was killed while writing it?); "
                    "read the lines before it"
                )
            else:
                log.problems.append(f"{name}:{number}: not a JSON object (corrupt line); skipped it")
            continue
        if not isinstance(record, dict) or not isinstance(record.get("kind"), str):
            log.problems.append(f"{name}:{number}: not an event (a JSON object with a 'kind'); skipped it")
            continue
        kind = record["kind"]
        try:
            if kind == "run":
                if log.header is not None or log.decisions or log.windows:
                    log.lines -= 1
                    log = EventLog(path=name, section=len(sections), lines=1)
                    sections.append(log)
                log.header = _header(record)
                log.first_line = number
            elif kind == "window":
                log.windows.append(_window(record, number, log.world_size))
            elif kind in DECISION_KINDS:
                if not isinstance(record.get("step"), int):
                    raise ValueError(f"{kind} event without a step number")
                record.setdefault("evidence", {})
                record.setdefault("algorithm", "?")
                record["line"] = number
                log.decisions.append(record)
            else:
                raise ValueError(f"unknown event kind {kind!r}")
        except ValueError as err:
            log.problems.append(f"{name}:{number}: {err}; skipped it")
    first = sections[0]
    if first.header is None and (first.decisions or first.windows):
        first.problems.append(
            f"{name}: no run header on the first line (a log of an older stragglerkit?): its run, rank and "
            "world size are unknown; read it as rank 0's"
        )
    return [log for log in sections if log.header is not None or log.decisions or log.windows or log.problems]

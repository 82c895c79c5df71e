"""Reading a torch.profiler chrome trace: one rank's ``stragglerkit/`` ranges.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes a JSON object whose
``traceEvents`` hold, among torch's own operator events, the ranges that stragglerkit opens with
``record_function`` (docs/report.md, "Range names"): complete events (``"ph": "X"``) with a
``name``, a start ``ts`` and a duration ``dur``, both in microseconds. Only names starting with
``stragglerkit/`` are kept.

Which rank wrote the trace: torch records ``distributedInfo`` (``rank``, ``world_size``) when a
process group exists; otherwise the file name must say it (``trace.rank3.json``,
``rank_3.json``); otherwise the trace is refused with a message asking for that.

Example::

    ranks = read_torch_trace("run/trace.rank1.json")    # RankRanges(rank=1, world_size=2, ranges=[...])
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from stragglerkit.report.ranges import PREFIX, InputError, Range, RankRanges

__all__ = ["rank_from_name", "read_torch_trace"]

_RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)


def rank_from_name(path: str | Path) -> int | None:
    """The ``N`` of ``rankN`` (or ``rank_N``, ``rank-N``) in the file's name, else None."""
    match = _RANK_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def read_torch_trace(path: str | Path, data: dict[str, Any] | None = None) -> RankRanges:
    """One rank's ranges from a chrome trace (``data``: the parsed JSON, if already read)."""
    name = str(path)
    if data is None:
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except ValueError as err:
            raise InputError(f"{name}: not valid JSON ({err}); a torch.profiler trace is one JSON object") from err
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(f"{name}: no 'traceEvents' list; not a torch.profiler chrome trace")
    info = data.get("distributedInfo")
    rank: int | None = None
    world_size: int | None = None
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        rank = int(info["rank"])
        world_size = int(info["world_size"]) if isinstance(info.get("world_size"), int) else None
    if rank is None:
        rank = rank_from_name(name)
    if rank is None:
        raise InputError(
            f"{name}: cannot tell which rank wrote this trace: it has no distributedInfo (no process group "
            "when it was recorded) and its name has no 'rank<N>'; rename it, e.g. trace.rank0.json"
        )
    ranges = []
    for event in data["traceEvents"]:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        label = event.get("name")
        if not isinstance(label, str) or not label.startswith(PREFIX):
            continue
        try:
            start = float(event["ts"]) * 1e-6
            end = start + float(event.get("dur", 0.0)) * 1e-6
        except (KeyError, TypeError, ValueError):
            continue
        ranges.append(Range(label, start, end))
    ranges.sort(key=lambda r: r.start)
    return RankRanges(path=name, rank=rank, world_size=world_size, ranges=ranges, source="torch.profiler")

"""Reading an Nsight Systems SQLite export: one rank's ``stragglerkit/`` ranges and NCCL kernels.

``nsys export --type sqlite report.nsys-rep`` (or ``nsys profile --export sqlite``) writes a
SQLite database in Nsight Systems' documented export schema. It is read here with the standard
library's :mod:`sqlite3`, using only these tables and columns:

* ``META_DATA_EXPORT(name, value)``: the row ``EXPORT_SCHEMA_VERSION`` says which schema the file
  follows. Versions ``3.x`` (Nsight Systems 2021.2 onwards) are read; any other version is refused
  with a message naming the file and the version, since the columns below may differ.
* ``StringIds(id, value)``: the strings that other tables refer to by id.
* ``NVTX_EVENTS(start, end, eventType, text, textId, domainId, globalTid)``: push/pop (eventType
  59) and start/end (60) ranges; a range's name is ``text`` or, when that is NULL, the
  ``StringIds`` value of ``textId``. Ranges whose name starts with ``stragglerkit/`` are kept
  whatever their domain (the ``stragglerkit`` domain of the ``nvtx`` package, or the default one
  where ``torch.cuda.nvtx`` writes). ``globalTid`` carries the process id in bits 24-47.
* ``CUPTI_ACTIVITY_KIND_KERNEL(start, end, shortName, demangledName)``: GPU kernels; the
  collective ones (a name containing ``AllReduce`` or ``nccl``) are kept. The table is absent
  when no CUDA kernel was traced; then there are no kernels.

Times are nanoseconds on the capturing host's clock; ranks are aligned later
(:func:`stragglerkit.report.ranges.align`). One export holds one rank: profile each rank into its
own report (``nsys profile -o report.rank%q{RANK} ...``); the rank is read from the file's name.

Example::

    ranks = read_nsys_export("run/report.rank0.sqlite")     # RankRanges(rank=0, ranges=[...], kernels=[...])
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from stragglerkit.report.ranges import PREFIX, InputError, Range, RankRanges
from stragglerkit.report.torch_trace import rank_from_name

__all__ = ["SQLITE_MAGIC", "SUPPORTED_SCHEMA_MAJOR", "read_nsys_export", "schema_version"]

SQLITE_MAGIC = b"SQLite format 3\x00"
SUPPORTED_SCHEMA_MAJOR = 3
"""Major version of ``EXPORT_SCHEMA_VERSION`` this reader knows."""
_RANGE_TYPES = (59, 60)  # NvtxPushPopRange, NvtxStartEndRange


def _tables(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def schema_version(db: sqlite3.Connection, name: str) -> str:
    """The export's ``EXPORT_SCHEMA_VERSION``; raises :class:`InputError` if absent or not supported."""
    if "META_DATA_EXPORT" not in _tables(db):
        raise InputError(
            f"{name}: a SQLite file without a META_DATA_EXPORT table: not an Nsight Systems export "
            "(make one with: nsys export --type sqlite REPORT.nsys-rep)"
        )
    row = db.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_SCHEMA_VERSION'").fetchone()
    if row is None:
        raise InputError(f"{name}: META_DATA_EXPORT has no EXPORT_SCHEMA_VERSION row; cannot tell its schema")
    version = str(row[0])
    major = version.split(".", 1)[0]
    if major != str(SUPPORTED_SCHEMA_MAJOR):
        raise InputError(
            f"{name}: Nsight Systems export schema {version}; this stragglerkit reads schema "
            f"{SUPPORTED_SCHEMA_MAJOR}.x (Nsight Systems 2021.2 and later): export it again with such a version"
        )
    return version


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def read_nsys_export(path: str | Path) -> RankRanges:
    """One rank's ranges and collective kernels from an export (see the module docstring)."""
    name = str(path)
    try:
        db = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    except sqlite3.Error as err:
        raise InputError(f"{name}: cannot open it as SQLite ({err})") from err
    try:
        return _read(db, name)
    except sqlite3.Error as err:
        raise InputError(f"{name}: unreadable as an Nsight Systems export ({err})") from err
    finally:
        db.close()


def _read(db: sqlite3.Connection, name: str) -> RankRanges:
    schema_version(db, name)
    tables = _tables(db)
    missing = {"NVTX_EVENTS", "StringIds"} - tables
    ranges: list[Range] = []
    pids: set[int] = set()
    if "StringIds" in missing:
        raise InputError(f"{name}: no StringIds table; the export is incomplete")
    if "NVTX_EVENTS" in tables:
        text = "COALESCE(e.text, s.value)" if "textId" in _columns(db, "NVTX_EVENTS") else "e.text"
        join = "LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in _columns(db, "NVTX_EVENTS") else ""
        query = (
            f"SELECT {text}, e.start, e.end, e.globalTid FROM NVTX_EVENTS e {join} "
            f"WHERE e.eventType IN ({', '.join(map(str, _RANGE_TYPES))}) AND e.end IS NOT NULL"
        )
        for label, start, end, tid in db.execute(query):
            if isinstance(label, str) and label.startswith(PREFIX):
                ranges.append(Range(label, start * 1e-9, end * 1e-9))
                if tid is not None:
                    pids.add((int(tid) >> 24) & 0xFFFFFF)
    kernels: list[Range] = []
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        columns = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL")
        key = "shortName" if "shortName" in columns else "demangledName"
        query = (
            f"SELECT s.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.{key} "
            "WHERE s.value LIKE '%AllReduce%' OR s.value LIKE '%nccl%'"
        )
        kernels = [Range(str(label), start * 1e-9, end * 1e-9) for label, start, end in db.execute(query)]
    if len(pids) > 1:
        raise InputError(
            f"{name}: holds stragglerkit ranges of {len(pids)} processes; export one report per rank "
            "(nsys profile -o report.rank%q{RANK} ...) so that each file is one rank"
        )
    rank = rank_from_name(name)
    if rank is None:
        raise InputError(
            f"{name}: cannot tell which rank this export is: its name has no 'rank<N>'; "
            "rename it, e.g. report.rank0.sqlite"
        )
    ranges.sort(key=lambda r: r.start)
    kernels.sort(key=lambda r: r.start)
    return RankRanges(path=name, rank=rank, world_size=None, ranges=ranges, kernels=kernels, source="nsys")

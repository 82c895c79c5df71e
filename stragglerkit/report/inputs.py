"""From the files and folders given to ``stragglerkit report`` to one :class:`~.run_data.RunData`.

Each file is recognised by its content, not its name: an SQLite file is an Nsight Systems export
(:mod:`.nsys`); a JSON object with ``traceEvents`` a torch.profiler trace (:mod:`.torch_trace`);
one with ``header`` and ``rows`` the AllReduce bench's JSON, with ``header`` and ``steps`` the
training bench's (``stragglerkit bench --json``); a file of JSON lines with a ``kind`` an event
log (:mod:`.events`). A folder is scanned (recursively) for files ending in ``.json``, ``.jsonl``,
``.sqlite``, ``.sqlite3`` or ``.db``; other files in it are passed over. A file given by name that
is none of these is an error that names it.

One report shows one run. The files are grouped by run -- event logs by their ``run_id``,
profiler traces by their world size (and one trace per rank), a bench JSON alone or with the
event logs its training's hooked copy wrote (``--event-log DIR``: the folder is in the JSON's
configuration) -- and the run of the first file given is shown; files of another run are listed
as left out, never mixed into its figures. Within the run: a world of n ranks whose per-rank
event logs lack some rank is reported (rank 0's log holds the per-step windows; the others' only
the same decisions, which are checked against rank 0's); profiler traces are put on one clock
(:func:`.ranges.align`).

Example::

    loaded = load(["run/"])
    loaded.run.world_size, loaded.read, loaded.problems
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stragglerkit.report.events import EventLog, looks_like_event_log, read_event_log
from stragglerkit.report.nsys import SQLITE_MAGIC, read_nsys_export
from stragglerkit.report.ranges import InputError, RankRanges, align, decisions_from_ranges, steps_from_ranges
from stragglerkit.report.run_data import Comparison, NicSample, RunData, StepRecord
from stragglerkit.report.torch_trace import read_torch_trace

__all__ = ["SCANNED_SUFFIXES", "Loaded", "load"]

SCANNED_SUFFIXES = (".json", ".jsonl", ".sqlite", ".sqlite3", ".db")
"""What a scanned folder's files must end in to be read."""
_UNKNOWN_TAIL = (
    "expected an event log (JSON lines with a 'kind'), a bench JSON (stragglerkit bench --json), "
    "a torch.profiler chrome trace (JSON with 'traceEvents') or an Nsight Systems SQLite export"
)


@dataclass(kw_only=True, slots=True)
class Loaded:
    """The run to report on (None if nothing could be read), what was read, and what went wrong."""

    run: RunData | None = None
    read: list[str] = field(default_factory=list)
    """One line per input read."""
    problems: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Source:
    kind: str  # "log", "bench", "trace"
    path: str
    item: Any
    key: tuple[str, object]


def _files(inputs: list[str], problems: list[str]) -> list[tuple[Path, bool]]:
    """(file, named explicitly) in the order given, folders expanded in sorted order."""
    out: list[tuple[Path, bool]] = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            found = sorted(
                Path(root) / name
                for root, _, names in os.walk(path)
                for name in names
                if name.endswith(SCANNED_SUFFIXES)
            )
            if not found:
                problems.append(f"{given}: a folder with no event log, bench JSON, trace or export in it")
            out += [(f, False) for f in found]
        elif path.is_file():
            out.append((path, True))
        else:
            problems.append(f"{given}: no such file or folder")
    return out


def _classify(path: Path) -> list[_Source]:
    name = str(path)
    with open(path, "rb") as handle:
        head = handle.read(len(SQLITE_MAGIC))
        handle.seek(0)
        first_line = handle.readline(1 << 20)
    if head.startswith(SQLITE_MAGIC):
        ranks = read_nsys_export(path)
        return [_Source("trace", name, ranks, ("trace", None))]
    data: Any = None
    broken: ValueError | None = None
    if first_line.lstrip().startswith(b"{"):
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except ValueError as err:
            broken = err  # JSON lines, or a damaged file: see below
    if isinstance(data, dict) and "traceEvents" in data:
        ranks = read_torch_trace(path, data)
        return [_Source("trace", name, ranks, ("trace", ranks.world_size))]
    if isinstance(data, dict) and isinstance(data.get("header"), dict) and ("rows" in data or "steps" in data):
        return [_Source("bench", name, data, ("bench", name))]
    if (data is None or (isinstance(data, dict) and "kind" in data)) and looks_like_event_log(first_line):
        sections = read_event_log(path)
        # the newest run first: a file's latest section is the run it stands for
        return [_Source("log", _section_name(log), log, ("log", log.run_id)) for log in reversed(sections)]
    if broken is not None and (first_line.strip() == b"{" or b'"traceEvents"' in first_line):
        raise InputError(f"{name}: JSON that does not parse ({broken}): a trace or bench JSON cut short?")
    raise InputError(f"{name}: not a known input: {_UNKNOWN_TAIL}")


def _section_name(log: EventLog) -> str:
    """The file's name, with the section's first line when the file holds several runs."""
    return log.path if log.section == 0 else f"{log.path} (from line {log.first_line})"


def _describe(source: _Source) -> str:
    if source.kind == "log":
        log: EventLog = source.item
        rank = "rank ?" if log.rank is None else f"rank {log.rank}"
        return f"event log, {rank}: {len(log.decisions)} decisions, {len(log.windows)} windows"
    if source.kind == "trace":
        ranks: RankRanges = source.item
        extra = f", {len(ranks.kernels)} collective kernels" if ranks.source == "nsys" else ""
        return f"{ranks.source} trace, rank {ranks.rank}: {len(ranks.ranges)} stragglerkit ranges{extra}"
    data = source.item
    mode = "AllReduce bench" if "rows" in data else "training bench"
    return f"{mode} JSON ({data['header'].get('command', '?')})"


def _world_size(source: _Source) -> int | None:
    if source.kind == "log":
        return int(source.item.world_size) if source.item.world_size is not None else None
    if source.kind == "trace":
        ws: int | None = source.item.world_size
        return ws
    config = source.item["header"].get("config", {})
    return int(config["world_size"]) if isinstance(config.get("world_size"), int) else None


def _choose(sources: list[_Source], loaded: Loaded) -> list[_Source]:
    """The sources of the first file's run (see the module docstring); the others go to ``left_out``."""
    first = sources[0]
    chosen = [first]
    world = _world_size(first)
    run_id = first.item.run_id if first.kind == "log" else None
    trace_ranks: dict[int, str] = {first.item.rank: first.path} if first.kind == "trace" else {}
    log_ranks: dict[int | None, str] = {first.item.rank: first.path} if first.kind == "log" else {}
    what = f"the run of {first.path}" + (f" ({run_id})" if run_id else "")
    bench_seen = first.kind == "bench"
    for source in sources[1:]:
        why = None
        size = _world_size(source)
        if first.kind == "bench" or source.kind == "bench":
            bench, other = (first, source) if first.kind == "bench" else (source, first)
            if other.kind != "log" or not _linked(bench, other) or (source.kind == "bench" and bench_seen):
                why = "a bench JSON is a run of its own (or of the event logs in its --event-log folder)"
            bench_seen = True
            if why is None and source.kind == "log":  # the bench's hooked copy: one run id, as below
                hooked: EventLog = source.item
                if run_id is not None and hooked.run_id is not None and hooked.run_id != run_id:
                    why = f"run {hooked.run_id}, not {run_id}"
                elif hooked.rank in log_ranks:
                    why = f"a second log of rank {hooked.rank} ({log_ranks[hooked.rank]} is one)"
                run_id = run_id or hooked.run_id
        elif world is not None and size is not None and size != world:
            why = f"world size {size}, not {world}"
        elif source.kind == "log":
            log: EventLog = source.item
            if run_id is None and first.kind == "log":
                run_id = log.run_id
            if run_id is not None and log.run_id is not None and log.run_id != run_id:
                why = f"run {log.run_id}, not {run_id}"
            elif log.rank in log_ranks:
                why = f"a second log of rank {log.rank} ({log_ranks[log.rank]} is one)"
            elif run_id is None and first.kind != "log":
                run_id = log.run_id
        else:
            ranks: RankRanges = source.item
            if ranks.rank in trace_ranks:
                why = f"a second trace of rank {ranks.rank} ({trace_ranks[ranks.rank]} is one): another run"
        if why is not None:
            loaded.left_out.append(f"{source.path}: {why}; left out of {what}")
            continue
        if world is None:
            world = size
        if source.kind == "trace":
            trace_ranks[source.item.rank] = source.path
        elif source.kind == "log":
            log_ranks[source.item.rank] = source.path
        chosen.append(source)
    return chosen


def load(inputs: list[str]) -> Loaded:
    """Read, classify and group ``inputs`` (see the module docstring)."""
    loaded = Loaded()
    sources: list[_Source] = []
    for path, named in _files(inputs, loaded.problems):
        try:
            found = _classify(path)
        except InputError as err:
            if named or not str(err).endswith(_UNKNOWN_TAIL):
                loaded.problems.append(str(err))
            else:  # a file of a scanned folder that is none of the inputs (a config, say)
                loaded.left_out.append(f"{path}: not an input of the report; passed over")
            continue
        except OSError as err:
            loaded.problems.append(f"{path}: cannot read it ({err.strerror})")
            continue
        for source in found:
            sources.append(source)
            loaded.read.append(f"{source.path}: {_describe(source)}")
    if not sources:
        return loaded
    chosen = _choose(sources, loaded)
    loaded.problems += [problem for s in chosen if s.kind == "log" for problem in s.item.problems]
    logs = [s.item for s in chosen if s.kind == "log"]
    traces = [s.item for s in chosen if s.kind == "trace"]
    benches = [s.item for s in chosen if s.kind == "bench"]
    if benches and not logs:
        loaded.run = _from_bench(benches[0], chosen[0].path, loaded.problems)
        return loaded
    run = RunData(kind="event log" if logs else traces[0].source)
    run.files = [s.path for s in chosen]
    if logs:
        _from_logs(run, logs, loaded.problems)
    if traces:
        _from_traces(run, traces, loaded.problems)
    if benches:
        _merge_bench(run, benches[0], next(s.path for s in chosen if s.kind == "bench"), loaded.problems)
    loaded.run = run
    return loaded


# --------------------------------------------------------------------------- event logs


def _algorithm(buckets: list[str]) -> str | None:
    """The step's algorithms, ``+``-joined in bucket order (``""``: a bucket that did not run)."""
    unique = list(dict.fromkeys(b for b in buckets if b))
    return "+".join(unique) if unique else None


def _from_logs(run: RunData, logs: list[EventLog], problems: list[str]) -> None:
    by_rank = {(log.rank if log.rank is not None else 0): log for log in logs}
    reference = by_rank[min(by_rank)]
    header = reference.header or {}
    run.run_id = header.get("run_id")
    run.world_size = header.get("world_size")
    run.framework = header.get("framework")
    run.version = header.get("version")
    run.hosts = header.get("hosts")
    run.started = header.get("started")
    run.config = header.get("config") or {}
    run.ranks_seen = sorted(by_rank)
    run.decisions = list(reference.decisions)
    n = run.world_size
    per_rank_logs = len(by_rank) > 1 or min(by_rank) != 0
    if n is not None and per_rank_logs:
        missing = [r for r in range(n) if r not in by_rank]
        if missing:
            problems.append(
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {n}: no event log among "
                f"the inputs (the others' headers say world_size {n}; look for events.rank{missing[0]}.jsonl)"
            )
    if 0 not in by_rank:
        problems.append(
            "rank 0's event log is missing: it alone holds the per-step windows (lateness, AllReduce times, "
            f"NIC rates); decisions are taken from rank {min(by_rank)}'s"
        )
    mine = [(d["step"], d["kind"]) for d in reference.decisions]
    for rank, log in sorted(by_rank.items()):
        theirs = [(d["step"], d["kind"]) for d in log.decisions]
        if log is not reference and theirs != mine and not log.problems:
            problems.append(
                f"{log.path}: rank {rank}'s decisions differ from rank {min(by_rank)}'s "
                f"({len(theirs)} against {len(mine)}); the report uses rank {min(by_rank)}'s"
            )
    ends: dict[int, float] = {}
    for window in reference.windows:
        for i, step in enumerate(window.steps):
            end = window.step_end_s[i]
            if end is not None:
                ends[step] = end
            run.steps.append(
                StepRecord(
                    step=step,
                    lateness_s=window.lateness_s[i],
                    allreduce_s=window.allreduce_s[i],
                    algorithm=_algorithm(window.algorithms[i]),
                    predicted_s=window.predicted_s[i],
                )
            )
        if window.nic_rate_Bps is not None and any(v is not None for v in window.nic_rate_Bps):
            step = window.steps[-1] if window.steps else 0
            run.nic.append(NicSample(step=step, rates_Bps=window.nic_rate_Bps, slowdown=window.slowdown))
    run.steps.sort(key=lambda r: r.step)
    for record in run.steps:
        if record.step in ends and record.step - 1 in ends:
            record.step_time_s = ends[record.step] - ends[record.step - 1]
    if run.steps:
        run.step_time_note = "step time: from one step's last finish to the next's (rank 0's clock)"


# --------------------------------------------------------------------------- traces


def _from_traces(run: RunData, traces: list[RankRanges], problems: list[str]) -> None:
    ranks = {t.rank: t for t in traces}
    world = run.world_size or next((t.world_size for t in traces if t.world_size), None) or max(ranks) + 1
    if run.world_size is None:
        run.world_size = world
    missing = [r for r in range(world) if r not in ranks]
    if missing:
        problems.append(
            f"profiler traces: rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {world} "
            "missing; per-step figures use the ranks present"
        )
    aligned, offsets, trouble = align(ranks)
    problems += trouble
    if len(offsets) > 1:
        shown = ", ".join(f"rank {r}: {o * 1e3:+.3f} ms" for r, o in sorted(offsets.items()))
        run.notes.append(f"trace clocks aligned on the ends of stragglerkit/all_reduce ranges ({shown})")
    if not run.ranks_seen:
        run.ranks_seen = sorted(ranks)
    for rank, mine in sorted(aligned.items()):
        if mine.kernels:
            run.kernels[rank] = (len(mine.kernels), sum(k.end - k.start for k in mine.kernels))
        if not mine.ranges:
            problems.append(
                f"{mine.path}: no stragglerkit/ ranges in it (was the profiler on while stragglerkit ran? "
                "NVTX ranges need STRAGGLERKIT_NVTX=1 or a profiler that sets NVTX_INJECTION64_PATH)"
            )
    if run.steps:
        return  # rank 0's event log already has the per-step figures, on aligned clocks
    trace_steps = steps_from_ranges(aligned, world)
    previous_end: float | None = None
    for step in trace_steps:
        record = StepRecord(
            step=step.step,
            lateness_s=step.lateness_s,
            allreduce_s=step.allreduce_s,
            algorithm=_algorithm(step.algorithms),
        )
        if previous_end is not None and step.end_s is not None:
            record.step_time_s = step.end_s - previous_end
        previous_end = step.end_s
        run.steps.append(record)
    if not run.decisions:
        run.decisions = [
            {"kind": kind, "step": step, "algorithm": "?", "evidence": {"from": "profiler range"}}
            for step, kind in decisions_from_ranges(aligned)
        ]


# --------------------------------------------------------------------------- bench JSON


def _from_bench(data: dict[str, Any], path: str, problems: list[str]) -> RunData:
    header = data["header"]
    config = header.get("config") or {}
    source = header.get("source") or {}
    run = RunData(
        kind="bench (allreduce)" if "rows" in data else "bench (train)",
        world_size=config.get("world_size"),
        framework=config.get("framework", "ddp") if "steps" in data else None,
        version=source.get("version"),
        config=config,
        files=[path],
    )
    run.ranks_seen = list(range(run.world_size or 0))
    try:
        if "rows" in data:
            _bench_rows(run, data["rows"])
        else:
            _bench_train(run, data)
    except (KeyError, TypeError, IndexError, ValueError) as err:
        problems.append(f"{path}: a bench JSON without the fields this report reads ({err!r}); partly read")
    return run


def _bench_rows(run: RunData, rows: list[dict[str, Any]]) -> None:
    from stragglerkit.units import format_bytes

    index = 0
    for row in rows:
        label = f"{row['scenario']}, {format_bytes(row['size_bytes'])}"
        ran = str(row.get("ran") or row["algorithm"])
        samples = row.get("samples") or {}
        for arrival, finish in zip(samples.get("arrival", []), samples.get("finish", [])):
            first = min(arrival)
            run.steps.append(
                StepRecord(
                    step=index,
                    lateness_s=[a - first for a in arrival],
                    allreduce_s=max(finish) - max(arrival),
                    algorithm=ran,
                    predicted_s=row.get("predicted_s"),
                    label=label,
                )
            )
            index += 1
        run.comparisons.append(
            Comparison(
                label=label,
                algorithm=ran,
                measured_s=float(row["time_s"]),
                predicted_s=row.get("predicted_s"),
                speedup=row.get("speedup_vs_gloo"),
            )
        )
    run.step_time_note = "one 'step' per measured AllReduce, the cases one after another"


def _bench_train(run: RunData, data: dict[str, Any]) -> None:
    steps = data["steps"]
    # a run of one copy (the fine-tuning examples' --stragglerkit on|off) has only its own series
    shown = "hooked" if "hooked_s" in steps else "plain"
    hooked, plain = steps[f"{shown}_s"], steps.get("plain_s") if shown == "hooked" else None
    algorithms = steps.get("hook_algorithm") or [None] * len(hooked)
    if len(algorithms) < len(hooked):
        algorithms = [None] * len(hooked)
    backward = (steps.get("per_rank") or {}).get(f"{shown}_backward_s")
    for step, h in enumerate(hooked):
        p = plain[step] if plain is not None and step < len(plain) else None
        lateness: list[float | None] | None = None
        if backward and step < len(backward) and backward[step]:
            times = backward[step]
            slowest = max(times)
            lateness = [slowest - t for t in times]
        run.steps.append(
            StepRecord(step=step, lateness_s=lateness, step_time_s=h, baseline_step_s=p, algorithm=algorithms[step])
        )
    if backward:
        run.lateness_note = (
            "lateness estimated without clocks: each rank's backward + AllReduce time against the longest "
            "(the rank that arrives last waits least)"
        )
    run.step_time_note = (
        "step time: the hooked copy's; the plain copy's in grey"
        if plain is not None
        else f"step time: the {shown} copy's (a run of that copy alone)"
    )
    run.decisions = [dict(e, evidence=e.get("evidence") or {}) for e in data.get("events", [])]
    run.bench_saving = _bench_saving(data)


def _bench_saving(data: dict[str, Any]) -> dict[str, Any] | None:
    """The training bench's steady state: plain against hooked (its own figures) and the time saved."""
    steady = data.get("steady_steps")
    if not steady or "plain_s" not in data["steps"] or "hooked_s" not in data["steps"]:
        return None
    hooked, plain = data["steps"]["hooked_s"], data["steps"]["plain_s"]
    chosen = range(int(steady[0]), int(steady[1]) + 1)
    return {
        "steps": steady,
        "why": data.get("steady_from_why", ""),
        "plain_ms": data.get("plain_steady_ms"),
        "hooked_ms": data.get("hooked_steady_ms"),
        "speedup": data.get("speedup_steady"),
        "saved_s": sum(plain[s] - hooked[s] for s in chosen if s < len(hooked)),
    }


def _linked(bench: _Source, log: _Source) -> bool:
    """Whether ``log`` was written by the hooked copy of the training bench ``bench`` (its ``--event-log``
    folder, recorded in the bench's configuration, is the log's folder)."""
    folder = (bench.item["header"].get("config") or {}).get("event_log")
    if "steps" not in bench.item or not isinstance(folder, str):
        return False
    return Path(folder).resolve() == Path(log.item.path).resolve().parent


def _merge_bench(run: RunData, data: dict[str, Any], path: str, problems: list[str]) -> None:
    """Add a training bench's plain copy and steady-state figures to its hooked copy's event-log run."""
    try:
        if "plain_s" not in data["steps"]:  # a run of the hooked copy alone: nothing to add
            return
        plain = data["steps"]["plain_s"]
        for record in run.steps:
            if 0 <= record.step < len(plain):
                record.baseline_step_s = plain[record.step]
        run.bench_saving = _bench_saving(data)
    except (KeyError, TypeError, IndexError, ValueError) as err:
        problems.append(f"{path}: a training bench JSON without the fields this report reads ({err!r}); left out")
        return
    run.notes.append(f"the plain copy's step times and the steady-state figures from the training bench {path}")

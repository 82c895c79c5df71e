"""From the ranks' raw timings to the table, the JSON rows, the model's prediction and a plot.

Per iteration the ranks recorded wall-clock ``arrival`` (entering the AllReduce, after the
straggler's delay) and ``finish`` (``time.time()``; one machine, so one clock). Per case:

* ``time_s``: median over iterations of the slowest rank's own time (``finish - arrival``, the
  nccl-tests way); in the straggler scenario the time from the straggler's arrival to the last
  finish, which is what a straggler-aware algorithm can shorten.
* ``time_from_straggler_s`` / ``time_from_first_arrival_s``: last finish minus the straggler's /
  the first rank's arrival (medians over iterations).
* ``algbw = size / time`` and ``busbw = algbw · 2(n-1)/n`` in GB/s (GB = 1e9), ``wrong`` the
  number of elements that differed from the exact sum, over every iteration and rank.
* ``cpu_busy`` / ``cpu_softirq``: the busiest host's share of busy CPU time (all its cores) from
  the barrier that starts an iteration to the finish, over the iterations, and its soft-interrupt
  share (:mod:`stragglerkit.bench.cpu_load`); from ``CPU_BOUND`` (0.9) on the table flags the row:
  the CPUs, not the links, may set its time. None where ``/proc/stat`` is missing.
* ``run_queue_wait_s``: per iteration the ranks' mean time waiting for a core (their threads'
  schedstat run delay, summed over threads), median over iterations; None where unknown.
* ``predicted_s``: the flow-level simulator (:func:`stragglerkit.sim.simulate`) on the same setting:
  per-rank NICs at the payload rate of the links, the measured latency, the straggler arriving
  ``delay`` late, the degraded NICs; gloo is modelled as a ring.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from stragglerkit.bench.config import BASELINE, BenchConfig
from stragglerkit.bench.cpu_load import CPU_BOUND, CpuTimes, busy_share, softirq_share
from stragglerkit.bench.launch import LaunchResult
from stragglerkit.config import Config
from stragglerkit.errors import NotApplicableError
from stragglerkit.report.critical_path import critical_path
from stragglerkit.units import format_bytes

__all__ = ["cpu_model", "header_record", "plot_rows", "print_table", "rows_from_cases", "write_json"]

_MTU_PAYLOAD = (1500 - 52) / (1500 + 14)  # TCP payload share of a frame at MTU 1500 (docs/testbed.md)


class RunConfig(Protocol):
    """What the header needs from a run's configuration (BenchConfig, TrainConfig)."""

    @property
    def bandwidth(self) -> float | None: ...

    def to_json(self) -> str: ...


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _payload_bandwidth(config: RunConfig, launched: LaunchResult) -> float | None:
    if launched.cluster is not None:
        rates: list[float] = launched.cluster["expected_payload_Bps"]
        return float(min(rates))
    if config.bandwidth is None:
        return None
    return config.bandwidth * (_MTU_PAYLOAD if launched.mode == "torchrun" else 1.0)


def _predict(case: dict[str, Any], alpha: float, bandwidth: float | None) -> tuple[float | None, float | None]:
    """(predicted time as ``time_s`` counts it, predicted time from the first arrival)."""
    if bandwidth is None:
        return None, None
    from stragglerkit.planner.policy import planned_situation
    from stragglerkit.schedules.registry import generate
    from stragglerkit.sim import Network, simulate

    n = case["world_size"]
    slowdowns = {int(k): float(v) for k, v in case["slowdowns"].items()}
    straggler = case["straggler"]
    algorithm = "ring" if case["ran"] == BASELINE else case["ran"]
    try:
        # OptCC: the segments and bubble filling the runtime uses for this bucket
        schedule = generate(algorithm, planned_situation(algorithm, n, straggler, slowdowns, case["size_bytes"]))
    except NotApplicableError:
        return None, None
    arrivals = [0.0] * n
    if straggler is not None:
        arrivals[straggler] = case["delay_s"]
    network = Network.uniform(n, alpha=alpha, bandwidth=bandwidth, slowdowns=slowdowns)
    result = simulate(schedule, case["size_bytes"], network, arrivals=arrivals)
    return result.time_from_last_arrival, result.time_from_first_arrival


def _lower_bound(case: dict[str, Any], bandwidth: float | None) -> float | None:
    """OptCC's lower bound (OptCC paper, Theorems 1 and 2) for the degraded NICs, in seconds."""
    slowdowns = [float(v) for v in case["slowdowns"].values()]
    if not slowdowns or bandwidth is None or case["world_size"] < 3:
        return None
    from stragglerkit.sim import optcc_bounds

    n_seconds = case["size_bytes"] / bandwidth
    if len(slowdowns) == 1:
        return optcc_bounds.theorem1_bound(case["world_size"], slowdowns[0], n_seconds)
    return optcc_bounds.theorem2_bound(case["world_size"], slowdowns, n_seconds)


def _critical_path(case: dict[str, Any], payload_Bps: list[float] | None) -> dict[str, Any] | None:
    """The last iteration's critical path (:mod:`stragglerkit.report.critical_path`), counted from
    the straggler's arrival (from the first arrival without one); None for gloo's all_reduce."""
    traces = case.get("critical")
    if not traces or any(t is None for t in traces):
        return None
    straggler = case["straggler"]
    origin = traces[straggler]["entered_ns"] if straggler is not None else None
    return critical_path(traces, payload_Bps, origin)


def _row(
    case: dict[str, Any], alpha: float, bandwidth: float | None, payload_Bps: list[float] | None = None
) -> dict[str, Any]:
    n = case["world_size"]
    straggler = case["straggler"]
    ends = [max(f) for f in case["finish"]]
    iterations = list(zip(case["arrival"], case["finish"], strict=True))
    own = [max(f - a for a, f in zip(arr, fin, strict=True)) for arr, fin in iterations]
    from_first = _median([end - min(arr) for end, arr in zip(ends, case["arrival"], strict=True)])
    from_straggler = None
    if straggler is not None:
        from_straggler = _median([end - arr[straggler] for end, arr in zip(ends, case["arrival"], strict=True)])
    time_s = from_straggler if from_straggler is not None else _median(own)
    algbw = case["size_bytes"] / time_s / 1e9 if time_s > 0 else 0.0
    hosts = [CpuTimes(*ticks) for ticks in case.get("cpu") or [] if ticks is not None]
    busiest = max(hosts, key=lambda t: busy_share(t) or 0.0, default=None)
    predicted, predicted_first = _predict(case, alpha, bandwidth)
    return {
        "algorithm": case["algorithm"],
        "ran": case["ran"],
        "world_size": n,
        "size_bytes": case["size_bytes"],
        "count": case["count"],
        "dtype": case["dtype"],
        "scenario": case["scenario"],
        "straggler": straggler,
        "slowdowns": case["slowdowns"],
        "delay_s": case["delay_s"],
        "iterations": len(ends),
        "time_s": time_s,
        "time_from_straggler_s": from_straggler,
        "time_from_first_arrival_s": from_first,
        "time_min_s": min(own) if straggler is None else None,
        "algbw_GBps": algbw,
        "busbw_GBps": algbw * 2 * (n - 1) / n,
        "wrong": case["wrong"],
        "predicted_s": predicted,
        "predicted_from_first_arrival_s": predicted_first,
        "lower_bound_s": _lower_bound(case, bandwidth),
        "cpu_busy": busy_share(busiest),
        "run_queue_wait_s": _run_queue_wait(case.get("waited_ns")),
        "cpu_softirq": softirq_share(busiest),
        "calibration": case["calibration"],
        "samples": {"arrival": case["arrival"], "finish": case["finish"]},
        "timeline": case.get("timeline"),
        "critical_path": _critical_path(case, payload_Bps),
    }


def _add_speedups(rows: list[dict[str, Any]]) -> None:
    gloo = {(r["scenario"], r["size_bytes"]): r for r in rows if r["algorithm"] == BASELINE}
    for row in rows:
        base = gloo.get((row["scenario"], row["size_bytes"]))
        row["speedup_vs_gloo"] = base["time_s"] / row["time_s"] if base and row["time_s"] > 0 else None
        row["speedup_from_first_vs_gloo"] = (
            base["time_from_first_arrival_s"] / row["time_from_first_arrival_s"]
            if base and row["straggler"] is not None
            else None
        )
        healthy = gloo.get(("none", row["size_bytes"])) if row["scenario"] == "degraded" else None
        row["speedup_vs_fault_free_gloo"] = healthy["time_s"] / row["time_s"] if healthy else None


def rows_from_cases(config: BenchConfig, launched: LaunchResult) -> list[dict[str, Any]]:
    """One row per (scenario, size, algorithm), with speedups against gloo and the model's prediction."""
    bandwidth = _payload_bandwidth(config, launched)
    # one clock for every rank is needed to walk the critical path: not under torchrun
    same_clock = launched.mode != "torchrun"
    payload = [float(r) for r in launched.cluster["expected_payload_Bps"]] if launched.cluster is not None else None
    rows = []
    for case in launched.cases:
        if not same_clock:
            case = {**case, "critical": None}
        rows.append(_row(case, launched.alpha, bandwidth, payload))
    _add_speedups(rows)
    return rows


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo's "model name"), or None where the system does not say.
    Step times are comparable only between runs on the same CPU model."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def header_record(config: RunConfig, launched: LaunchResult, argv: list[str]) -> dict[str, Any]:
    """Command line, machine, date, load average, mode and the verified shaping of the links."""
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:  # pragma: no cover - torch is a dependency
        torch_version = None
    return {
        "command": " ".join(["stragglerkit", "bench", *argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "kernel": platform.release(),
            "python": platform.python_version(),
            "torch": torch_version,
        },
        "load_average": list(os.getloadavg()),
        "source": source_revision(),
        "environment": {k: v for k, v in os.environ.items() if k.startswith("STRAGGLERKIT_")},
        "runtime_tcp_send_buffer": _runtime_send_buffer(),
        "runtime_optcc_send_buffer": _runtime_optcc_send_buffer(),
        "mode": launched.mode,
        "mode_reason": launched.why,
        "config": json.loads(config.to_json()),
        "alpha_s": launched.alpha,
        "model_bandwidth_Bps": _payload_bandwidth(config, launched),
        "cluster": launched.cluster,
    }


def source_revision() -> dict[str, Any]:
    """The stragglerkit source a run used: the package version and, in a git checkout, the commit
    and whether the package's sources (stragglerkit/, csrc/, setup.py, pyproject.toml) differ from
    it; ``commit`` and ``modified`` are None outside a checkout or without git.

    Example::

        source_revision()  # {"version": "0.1.0", "commit": "79d1ad1...", "modified": False}
    """
    import stragglerkit

    root = Path(stragglerkit.__file__).resolve().parent.parent
    out: dict[str, Any] = {"version": stragglerkit.__version__, "commit": None, "modified": None}
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False)
        if head.returncode != 0:
            return out
        out["commit"] = head.stdout.strip()
        sources = ["stragglerkit", "csrc", "setup.py", "pyproject.toml"]
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", *sources],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if status.returncode == 0:
            out["modified"] = bool(status.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def _runtime_send_buffer() -> int | str:
    """What the ranks' runtime bounds its gloo connections' send buffers to (runtime/send_buffer.py)."""
    size = Config.from_env().executor.send_buffer  # checked before the run (cli.bench)
    return "off (the kernel's)" if size is None else size


def _runtime_optcc_send_buffer() -> int | str:
    """What those connections are bounded to while an OptCC plan runs (runtime/send_buffer.py)."""
    size = Config.from_env().optcc.send_buffer  # checked before the run (cli.bench)
    return "off (the bound above)" if size is None else size


def write_json(path: str, header: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"header": header, "rows": rows}, handle, indent=1)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_table(rows: list[dict[str, Any]], header: dict[str, Any], out: Any = None) -> None:
    """The nccl-tests-style table, one block per scenario."""
    stream = out if out is not None else sys.stdout
    config = header["config"]
    where = f"{header['mode']} ({header['mode_reason']})"
    print(f"# stragglerkit bench: {config['world_size']} ranks, {where}", file=stream)
    if header.get("model_bandwidth_Bps"):
        print(
            f"# model: flow-level simulator, NIC payload {header['model_bandwidth_Bps'] / 1e6:.1f} MB/s, "
            f"alpha {header['alpha_s'] * 1e6:.0f} us; load average {header['load_average'][0]:.2f}",
            file=stream,
        )
    source = header.get("source")
    if source and source.get("commit"):
        modified = " with modified sources" if source.get("modified") else ""
        print(f"# source: stragglerkit {source['version']} at {source['commit'][:12]}{modified}", file=stream)
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        mine = [r for r in rows if r["scenario"] == scenario]
        _print_block(scenario, mine, stream)
    print(
        "# time: median over iterations of the slowest rank's time (straggler scenario: from the straggler's "
        "arrival); GB = 1e9; busbw = algbw*2(n-1)/n; #wrong: elements differing from the exact sum, all "
        "iterations; model: simulator's prediction; cpu%: the busiest host's busy CPU share during the iterations; "
        "wait: a rank's threads' time waiting for a core per iteration (mean over ranks, median over iterations)",
        file=stream,
    )


def _print_block(scenario: str, rows: list[dict[str, Any]], stream: Any) -> None:
    first = rows[0]
    straggling = scenario == "straggler"
    degraded = scenario == "degraded"
    if straggling:
        title = f"persistent straggler: rank {first['straggler']}, delay {first['delay_s'] * 1e3:.2f} ms"
        if first["calibration"]:
            title += " (auto: the others' measured pre-phase ReduceScatter)"
    elif degraded:
        title = "degraded NICs: " + ", ".join(f"rank {k} at 1/{v:.3g}" for k, v in first["slowdowns"].items())
    else:
        title = "no fault"
    print(f"#\n# scenario: {title}", file=stream)
    columns = ["size", "count", "type", "algorithm", "time(ms)", "algbw", "busbw", "#wrong"]
    if straggling:
        columns += ["first(ms)", "speedup", "spd-first"]
    else:
        columns += ["speedup"]
    if degraded:
        columns += ["vs-healthy", "bound(ms)"]
    columns += ["model(ms)", "cpu%", "wait(ms)"]
    widths = [9, 10, 8, 10, 9, 7, 7, 6, 9, 8, 9, 9, 9, 5, 8]
    print("# " + " ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=False)), file=stream)
    for row in rows:
        name = row["algorithm"] if row["ran"] == row["algorithm"] else f"{row['algorithm']}>{row['ran']}"
        cells = [
            format_bytes(row["size_bytes"]),
            str(row["count"]),
            row["dtype"],
            name,
            _ms(row["time_s"]),
            f"{row['algbw_GBps']:.3f}",
            f"{row['busbw_GBps']:.3f}",
            str(row["wrong"]),
        ]
        if straggling:
            cells += [
                _ms(row["time_from_first_arrival_s"]),
                _x(row["speedup_vs_gloo"]),
                _x(row["speedup_from_first_vs_gloo"]),
            ]
        else:
            cells += [_x(row["speedup_vs_gloo"])]
        if degraded:
            cells += [_x(row["speedup_vs_fault_free_gloo"]), _ms(row["lower_bound_s"])]
        cells += [_ms(row["predicted_s"]), _percent(row.get("cpu_busy")), _ms(row.get("run_queue_wait_s"))]
        print("  " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=False)), file=stream)
    for row in rows:
        path = row.get("critical_path")
        if path is None:
            continue
        ideal = (
            ""
            if path["wire_ideal_s"] is None
            else f" (alone on their links: {_ms(path['wire_ideal_s'])}; their links busy: "
            f"{_ms(path['wire_link_busy_s'])})"
        )
        print(
            f"# critical path of {row['algorithm']} {format_bytes(row['size_bytes'])} (last iteration, "
            f"{_ms(path['total_s'])} ms): {path['messages']} messages ({path['queued_on_connection']} queued "
            f"behind the one ahead on their connection) on the wire {_ms(path['wire_s'])} ms{ideal}, "
            f"post lag {_ms(path['post_lag_s'])} ms ({_ms(path['first_from_peer_s'])} of it at first receives "
            "from a peer), "
            f"before its first post {_ms(path['start_s'])} ms",
            file=stream,
        )
    bound = [r for r in rows if (r.get("cpu_busy") or 0.0) >= CPU_BOUND]
    if bound:
        names = ", ".join(dict.fromkeys(f"{r['algorithm']} {format_bytes(r['size_bytes'])}" for r in bound))
        print(
            f"# note: the CPUs were at least {CPU_BOUND:.0%} busy during {names}: on this host the CPU, not "
            "the links, may set these times (docs/bench.md)",
            file=stream,
        )


def _run_queue_wait(waited: list[list[int | None]] | None) -> float | None:
    per_iteration = []
    for ranks in waited or []:
        known = [w for w in ranks if w is not None]
        if known:
            per_iteration.append(sum(known) / len(known) / 1e9)
    return _median(per_iteration) if per_iteration else None


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}"


def plot_rows(rows: list[dict[str, Any]], path: str) -> None:
    """Time against buffer size, one line per (algorithm, scenario), log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in dict.fromkeys((r["algorithm"], r["scenario"]) for r in rows):
        mine = [r for r in rows if (r["algorithm"], r["scenario"]) == key]
        label = key[0] if len({r["scenario"] for r in rows}) == 1 else f"{key[0]} ({key[1]})"
        ax.plot([r["size_bytes"] for r in mine], [r["time_s"] * 1e3 for r in mine], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("AllReduce time (ms)")
    ax.set_title(f"stragglerkit bench, {rows[0]['world_size']} ranks" if rows else "stragglerkit bench")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Summarise the bench acceptance runs (profiling/bench_acceptance.sh) against their targets.

Reads the four JSON files that the script wrote and writes profiling/results/bench_acceptance.json
with each figure, its target, the model's figure, whether it was met and how busy the host's CPUs
were during the runs compared (``cpu_busy`` per algorithm: the busiest host's busy share of all
cores, stragglerkit.bench.cpu_load), plus the runs' headers (command line, machine, date, load
average, verified shaping). Where profiling/bench_slow_links.sh has written the same scenarios at
250 Mbit/s (``bench_250mbit_*.json``), each figure also carries ``at_250mbit``: the same figure,
and the CPUs' busy share, with 4x less CPU work per second of transfer. A figure that is met at
250 Mbit/s and missed at 1 Gbit/s with the CPUs saturated is the machine's, not the algorithm's.
Each figure (and its 250 Mbit/s counterpart) also carries our algorithm's ``critical_path`` in the
run's last iteration (stragglerkit.report.critical_path): how much of it was messages on the wire,
what those would take alone on their links, and how much was post lag (CPU between a message's
dependencies completing and its post), the direct evidence of what the machine added. Where
profiling/bench_link_rate_l8_7.sh has run, the two l = 8/7 figures also carry ``at_link_rates``:
their medians at 1 Gbit/s, 500 and 250 Mbit/s in alternating launches of the same plans.

Example::

    python profiling/bench_acceptance_summary.py profiling/results
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Rows = dict[tuple[str, str], dict[str, Any]]


def _rows(path: Path) -> tuple[dict[str, Any], Rows]:
    data = json.loads(path.read_text())
    return data["header"], {(r["scenario"], r["algorithm"]): r for r in data["rows"]}


def _cpu(*rows: dict[str, Any]) -> dict[str, float | None]:
    return {f"{r['algorithm']} ({r['scenario']})": r.get("cpu_busy") for r in rows}


def _straggler_from_arrival(rows: Rows) -> tuple[float, float, dict[str, float | None]]:
    gloo, ours = rows[("straggler", "gloo")], rows[("straggler", "stragglar")]
    ratio = gloo["time_from_straggler_s"] / ours["time_from_straggler_s"]
    return ratio, gloo["predicted_s"] / ours["predicted_s"], _cpu(gloo, ours)


def _straggler_from_first(rows: Rows) -> tuple[float, float, dict[str, float | None]]:
    gloo, ours = rows[("straggler", "gloo")], rows[("straggler", "stragglar")]
    ratio = gloo["time_from_first_arrival_s"] / ours["time_from_first_arrival_s"]
    model = gloo["predicted_from_first_arrival_s"] / ours["predicted_from_first_arrival_s"]
    return ratio, model, _cpu(gloo, ours)


def _optcc_speedup(rows: Rows) -> tuple[float, float, dict[str, float | None]]:
    gloo, ours = rows[("degraded", "gloo")], rows[("degraded", "optcc")]
    return gloo["time_s"] / ours["time_s"], gloo["predicted_s"] / ours["predicted_s"], _cpu(gloo, ours)


def _optcc_over_bound(rows: Rows) -> tuple[float, float, dict[str, float | None]]:
    ours = rows[("degraded", "optcc")]
    over = ours["time_s"] / ours["lower_bound_s"] - 1.0
    return over, ours["predicted_s"] / ours["lower_bound_s"] - 1.0, _cpu(ours)


def _optcc_over_healthy(rows: Rows) -> tuple[float, float, dict[str, float | None]]:
    healthy, ours = rows[("none", "gloo")], rows[("degraded", "optcc")]
    over = ours["time_s"] / healthy["time_s"] - 1.0
    return over, ours["predicted_s"] / healthy["predicted_s"] - 1.0, _cpu(healthy, ours)


def _balanced_ring_over_healthy(rows: Rows) -> tuple[float, float, dict[str, float | None]]:
    healthy, ours = rows[("none", "gloo")], rows[("degraded", "balanced_ring")]
    over = ours["time_s"] / healthy["time_s"] - 1.0
    return over, ours["predicted_s"] / healthy["predicted_s"] - 1.0, _cpu(healthy, ours)


def _ring_over_gloo(rows: Rows) -> tuple[float, float, dict[str, float | None]]:
    gloo, ours = rows[("none", "gloo")], rows[("none", "ring")]
    return ours["time_s"] / gloo["time_s"] - 1.0, 0.0, _cpu(gloo, ours)


Measure = Callable[[Rows], tuple[float, float, dict[str, float | None]]]

# (figure, run, file at 1 Gbit/s, file at 250 Mbit/s or None, measure, target, met)
FIGURES: list[tuple[str, str, str, str | None, Measure, str, Callable[[float], bool]]] = [
    (
        "StragglAR vs gloo, from the straggler's arrival",
        "straggler",
        "bench_straggler.json",
        "bench_250mbit_straggler.json",
        _straggler_from_arrival,
        ">= 1.25x",
        lambda v: v >= 1.25,
    ),
    (
        "StragglAR vs gloo, from the first arrival",
        "straggler",
        "bench_straggler.json",
        "bench_250mbit_straggler.json",
        _straggler_from_first,
        ">= 1.15x",
        lambda v: v >= 1.15,
    ),
    (
        "OptCC vs gloo, one host at 1/2",
        "degraded_l2",
        "bench_degraded_l2.json",
        "bench_250mbit_degraded_l2.json",
        _optcc_speedup,
        ">= 1.5x",
        lambda v: v >= 1.5,
    ),
    (
        "OptCC above the lower bound l*S/B, one host at 1/2",
        "degraded_l2",
        "bench_degraded_l2.json",
        "bench_250mbit_degraded_l2.json",
        _optcc_over_bound,
        "<= 15%",
        lambda v: v <= 0.15,
    ),
    (
        "OptCC (one host at 7/8) over gloo on the fault-free cluster",
        "degraded_l8_7",
        "bench_degraded_l8_7.json",
        "bench_250mbit_degraded_l8_7.json",
        _optcc_over_healthy,
        "<= 8%",
        lambda v: v <= 0.08,
    ),
    (
        "balanced ring (one host at 7/8; what auto runs there) over gloo on the fault-free cluster",
        "degraded_l8_7_balanced",
        "bench_degraded_l8_7.json",
        "bench_250mbit_degraded_l8_7.json",
        _balanced_ring_over_healthy,
        "<= 8%",
        lambda v: v <= 0.08,
    ),
    (
        "our ring over gloo, no fault",
        "no_fault",
        "bench_no_fault.json",
        None,
        _ring_over_gloo,
        "<= 5%",
        lambda v: v <= 0.05,
    ),
]


OURS = {
    "straggler": ("straggler", "stragglar"),
    "degraded_l2": ("degraded", "optcc"),
    "degraded_l8_7": ("degraded", "optcc"),
    "degraded_l8_7_balanced": ("degraded", "balanced_ring"),
    "no_fault": ("none", "ring"),
}
"""Per run: the row of our algorithm, whose critical path each figure carries."""
_PATH_FIELDS = (
    "total_s",
    "start_s",
    "wire_s",
    "wire_ideal_s",
    "wire_link_busy_s",
    "post_lag_s",
    "first_from_peer_s",
    "messages",
    "queued_on_connection",
)


def _critical_path(rows: Rows, run: str) -> dict[str, Any] | None:
    """Our algorithm's critical path in the last iteration (stragglerkit.report.critical_path),
    without its segments; None in files written before the bench recorded it."""
    path = rows[OURS[run]].get("critical_path")
    return None if path is None else {key: path.get(key) for key in _PATH_FIELDS}


def summarise(results: Path) -> dict[str, Any]:
    figures = []
    headers = {}
    for name, run, at_1gbit, at_250mbit, measure, target, met in FIGURES:
        header, rows = _rows(results / at_1gbit)
        headers[run] = header
        measured, model, cpu = measure(rows)
        figure: dict[str, Any] = {
            "figure": name,
            "measured": measured,
            "target": target,
            "met": met(measured),
            "model": model,
            "cpu_busy": cpu,
            "critical_path": _critical_path(rows, run),
        }
        if at_250mbit is not None and (results / at_250mbit).exists():
            slow_header, slow_rows = _rows(results / at_250mbit)
            if OURS[run] not in slow_rows:
                figures.append(figure)  # a run at 250 Mbit/s from before this algorithm was benched
                continue
            slow, slow_model, slow_cpu = measure(slow_rows)
            figure["at_250mbit"] = {
                "file": at_250mbit,
                "command": slow_header.get("command"),
                "measured": slow,
                "met": met(slow),
                "model": slow_model,
                "cpu_busy": slow_cpu,
                "critical_path": _critical_path(slow_rows, run),
            }
        sweep = _link_rate_sweep(results, run)
        if sweep is not None:
            figure["at_link_rates"] = sweep
        figures.append(figure)
    return {"figures": figures, "runs": headers}


LINK_RATE_SWEEP = "link_rate_l8_7/summary.json"
"""Written by profiling/bench_link_rate_l8_7.sh: the l = 8/7 scenario at 1 Gbit/s, 500 and 250 Mbit/s."""


def _link_rate_sweep(results: Path, run: str) -> dict[str, Any] | None:
    """For the l = 8/7 figures: the medians per link rate of profiling/bench_link_rate_l8_7.sh
    (``LINK_RATE_SWEEP``), the same plan with less CPU work per second of transfer; None for the
    other figures or where the sweep has not run."""
    path = results / LINK_RATE_SWEEP
    if not run.startswith("degraded_l8_7") or not path.exists():
        return None
    algorithm = OURS[run][1]
    found: dict[str, Any] = {"file": LINK_RATE_SWEEP}
    for rate, per_algorithm in json.loads(path.read_text())["rates"].items():
        entry = per_algorithm.get(algorithm)
        if entry is None:
            continue
        median = entry["median"]
        found[rate] = {
            "runs": [r["file"] for r in entry["runs"]],
            "measured": median["over_fault_free_gloo"],
            "model": median["model_over_fault_free_gloo"],
            "excess_over_model": median["excess_over_model"],
            "cpu_busy": median.get("cpu_busy"),
            "run_queue_wait_s": median.get("run_queue_wait_s"),
        }
    return found


def _share(cpu: dict[str, float | None]) -> str:
    known = [v for v in cpu.values() if v is not None]
    return f"CPU {max(known) * 100:.0f}% busy" if known else "CPU -"


def _path_text(path: dict[str, Any]) -> str:
    ideal = ""
    if path["wire_ideal_s"] is not None:
        ideal = (
            f" (alone on their links {path['wire_ideal_s'] * 1e3:.0f} ms; their links busy "
            f"{path['wire_link_busy_s'] * 1e3:.0f} ms)"
        )
    return (
        f"{path['total_s'] * 1e3:.0f} ms: wire {path['wire_s'] * 1e3:.0f} ms{ideal}, post lag "
        f"{path['post_lag_s'] * 1e3:.0f} ms ({path['first_from_peer_s'] * 1e3:.0f} ms at first receives from a peer), "
        "before the first post "
        f"{path['start_s'] * 1e3:.0f} ms ({path['messages']} messages, {path.get('queued_on_connection') or 0} queued "
        "behind the one ahead on their connection)"
    )


def main() -> int:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "profiling/results")
    summary = summarise(results)
    for figure in summary["figures"]:
        verdict = "met" if figure["met"] else "NOT MET"
        line = (
            f"{figure['figure']:<62} {figure['measured']:8.3f} (target {figure['target']}, model "
            f"{figure['model']:.3f}, {_share(figure['cpu_busy'])}) {verdict}"
        )
        slow = figure.get("at_250mbit")
        if slow is not None:
            verdict = "met" if slow["met"] else "NOT MET"
            line += f"; at 250 Mbit/s {slow['measured']:.3f} ({_share(slow['cpu_busy'])}) {verdict}"
        print(line)
        sweep = figure.get("at_link_rates")
        if sweep is not None:
            rates = ", ".join(
                f"{rate} {entry['measured']:.3f} (model {entry['model']:.3f}, {len(entry['runs'])} runs)"
                for rate, entry in sweep.items()
                if rate != "file"
            )
            print(f"    by link rate ({sweep['file']}): {rates}")
        for where, part in (("1 Gbit/s", figure), ("250 Mbit/s", slow)):
            path = None if part is None else part.get("critical_path")
            if path is not None:
                print(f"    critical path at {where}: {_path_text(path)}")
    out = results / "bench_acceptance.json"
    out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

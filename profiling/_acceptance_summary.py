"""The acceptance summary: the figures of bench_acceptance.sh's runs against the README's targets.

Reads one folder per run, each with the four files of the acceptance scenarios
(``bench_no_fault.json``, ``bench_straggler.json``, ``bench_degraded_l2.json``,
``bench_degraded_l8_7.json``, as ``stragglerkit bench --json`` writes them) and, optionally, a
folder of the l = 8/7 scenario at other link rates (``<rate>_<run>.json``). Overwrites one summary
(default ``profiling/results/bench_acceptance.json``): each figure's median over the runs, every
run's value, the target, whether the median meets it, and the simulator's figure for the same
plan; the commit, machine and date are the runs' own (from their headers).

Example::

    python profiling/_acceptance_summary.py --runs /tmp/acc/run1 /tmp/acc/run2 /tmp/acc/run3 \\
        --link-rates /tmp/acc/rates --command "bash profiling/bench_acceptance.sh"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary

Rows = dict[tuple[str, str], dict[str, Any]]
Measure = Callable[[Rows], tuple[float, float]]
"""A figure from one run's rows: (measured, the simulator's figure)."""


def _ratio(rows: Rows, scenario: str, ours: str, field: str, model_field: str = "predicted_s") -> tuple[float, float]:
    gloo, mine = rows[(scenario, "gloo")], rows[(scenario, ours)]
    return gloo[field] / mine[field], gloo[model_field] / mine[model_field]


def _over_healthy(rows: Rows, ours: str) -> tuple[float, float]:
    healthy, mine = rows[("none", "gloo")], rows[("degraded", ours)]
    return mine["time_s"] / healthy["time_s"] - 1.0, mine["predicted_s"] / healthy["predicted_s"] - 1.0


def _over_bound(rows: Rows) -> tuple[float, float]:
    mine = rows[("degraded", "optcc")]
    return mine["time_s"] / mine["lower_bound_s"] - 1.0, mine["predicted_s"] / mine["lower_bound_s"] - 1.0


def _ring_over_gloo(rows: Rows) -> tuple[float, float]:
    return rows[("none", "ring")]["time_s"] / rows[("none", "gloo")]["time_s"] - 1.0, 0.0


# key, description, scenario file, measure, target text, target test, unit
FIGURES: list[tuple[str, str, str, Measure, str, Callable[[float], bool], str]] = [
    ("ring_over_gloo", "our ring over gloo, no fault", "bench_no_fault.json",
     _ring_over_gloo, "<= 5 %", lambda v: abs(v) <= 0.05, "fraction"),
    ("stragglar_from_straggler", "StragglAR vs gloo, from the straggler's arrival", "bench_straggler.json",
     lambda r: _ratio(r, "straggler", "stragglar", "time_from_straggler_s"), ">= 1.25x", lambda v: v >= 1.25, "x"),
    ("stragglar_from_first", "StragglAR vs gloo, from the first arrival", "bench_straggler.json",
     lambda r: _ratio(r, "straggler", "stragglar", "time_from_first_arrival_s", "predicted_from_first_arrival_s"),
     ">= 1.15x", lambda v: v >= 1.15, "x"),
    ("optcc_l2_speedup", "OptCC vs gloo, one host at 1/2 (l = 2)", "bench_degraded_l2.json",
     lambda r: _ratio(r, "degraded", "optcc", "time_s"), ">= 1.5x", lambda v: v >= 1.5, "x"),
    ("optcc_l2_over_bound", "OptCC over the lower bound l*S/B, l = 2", "bench_degraded_l2.json",
     _over_bound, "<= 15 %", lambda v: v <= 0.15, "fraction"),
    ("balanced_ring_l8_7_over_healthy", "balanced ring, one host at 7/8, over fault-free gloo",
     "bench_degraded_l8_7.json", lambda r: _over_healthy(r, "balanced_ring"), "<= 8 %", lambda v: v <= 0.08,
     "fraction"),
    ("optcc_l8_7_over_healthy", "OptCC, one host at 7/8, over fault-free gloo", "bench_degraded_l8_7.json",
     lambda r: _over_healthy(r, "optcc"), "<= 8 %", lambda v: v <= 0.08, "fraction"),
]  # fmt: skip
LINK_RATE_FIGURES = ("balanced_ring_l8_7_over_healthy", "optcc_l8_7_over_healthy")


def _rows(path: Path) -> tuple[dict[str, Any], Rows]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["header"], {(r["scenario"], r["algorithm"]): r for r in data["rows"]}


def _entry(values: list[float], models: list[float], test: Callable[[float], bool]) -> dict[str, Any]:
    median = statistics.median(values)
    return {
        "measured": round(median, 4),
        "met": test(median),
        "runs": [round(v, 4) for v in values],
        "model": round(statistics.median(models), 4),
    }


def summarise(run_dirs: list[Path], link_rates: Path | None) -> dict[str, Any]:
    figures, headers = [], []
    for key, description, name, measure, target, test, unit in FIGURES:
        values, models = [], []
        for folder in run_dirs:
            header, rows = _rows(folder / name)
            measured, model = measure(rows)
            values.append(measured)
            models.append(model)
            if key in ("ring_over_gloo", "stragglar_from_straggler", "optcc_l2_speedup", "optcc_l8_7_over_healthy"):
                headers.append(
                    {"file": f"{folder.name}/{name}", "command": header.get("command"), "date": header.get("date")}
                )
        figures.append(
            {"key": key, "figure": description, "target": target, "unit": unit, **_entry(values, models, test)}
        )
    record: dict[str, Any] = {"figures": figures}
    if link_rates is not None:
        record["at_link_rates"] = _link_rates(link_rates)
    first_header = _rows(run_dirs[0] / FIGURES[0][2])[0]
    record["setting"] = "8 ranks on the emulated cluster, 32 MiB float32, median of 7 iterations per run"
    record["environment"] = first_header.get("environment", {})
    record["source"] = first_header.get("source")
    record["machine"] = first_header.get("machine")
    record["date"] = min(h["date"] for h in headers if h["date"])
    record["run_files"] = headers
    return record


def _link_rates(folder: Path) -> dict[str, Any]:
    """The two l = 8/7 figures per link rate over that rate's launches (``<rate>_<run>.json``),
    with the launches' commit and first date."""
    by_rate: dict[str, list[Rows]] = {}
    headers = []
    for path in sorted(folder.glob("*_*.json"), key=lambda p: (-_rate_bps(p.stem.rsplit("_", 1)[0]), p.stem)):
        header, rows = _rows(path)
        headers.append(header)
        by_rate.setdefault(path.stem.rsplit("_", 1)[0], []).append(rows)
    rates: dict[str, dict[str, Any]] = {}
    for rate, launches in by_rate.items():
        rates[rate] = {}
        for key, _, _, measure, _, test, _ in FIGURES:
            if key in LINK_RATE_FIGURES:
                pairs = [measure(rows) for rows in launches]
                rates[rate][key] = _entry([p[0] for p in pairs], [p[1] for p in pairs], test)
    return {
        "commit": (headers[0].get("source") or {}).get("commit") if headers else None,
        "date": min(h["date"] for h in headers) if headers else None,
        "rates": rates,
    }


def _rate_bps(rate: str) -> float:
    units = {"Gbit": 1e9, "Mbit": 1e6, "Kbit": 1e3}
    for suffix, scale in units.items():
        if rate.endswith(suffix):
            return float(rate[: -len(suffix)]) * scale
    return 0.0


def _text(value: float, unit: str) -> str:
    return f"{value:.3f}x" if unit == "x" else f"{value * 100:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="one folder per run")
    parser.add_argument("--link-rates", type=Path, help="folder of <rate>_<run>.json launches at l = 8/7")
    parser.add_argument("--command", help="the command that made the runs (recorded)")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_acceptance.json")
    args = parser.parse_args(argv)
    record = summarise(args.runs, args.link_rates)
    for figure in record["figures"]:
        runs = ", ".join(_text(v, figure["unit"]) for v in figure["runs"])
        verdict = "met" if figure["met"] else "NOT MET"
        print(f"{figure['figure']:<55} {_text(figure['measured'], figure['unit']):>9} ({runs}) "
              f"target {figure['target']}, model {_text(figure['model'], figure['unit'])}: {verdict}")  # fmt: skip
    for rate, entries in record.get("at_link_rates", {}).get("rates", {}).items():
        for key, entry in entries.items():
            print(
                f"  at {rate}: {key} {_text(entry['measured'], 'fraction')} (model {_text(entry['model'], 'fraction')})"
            )
    write_summary(args.out, "acceptance", record, command=args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Summarise the bench acceptance runs (profiling/bench_acceptance.sh) against their targets.

Reads the four JSON files that the script wrote and writes profiling/results/bench_acceptance.json
with each figure, its target, the model's figure and whether it was met, plus the runs' headers
(command line, machine, date, load average, verified shaping).

Example::

    python profiling/bench_acceptance_summary.py profiling/results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _rows(path: Path) -> tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]:
    data = json.loads(path.read_text())
    return data["header"], {(r["scenario"], r["algorithm"]): r for r in data["rows"]}


def _figure(name: str, measured: float, target: str, met: bool, model: float | None) -> dict[str, Any]:
    return {"figure": name, "measured": measured, "target": target, "met": met, "model": model}


def summarise(results: Path) -> dict[str, Any]:
    figures = []
    headers = {}
    header, rows = _rows(results / "bench_straggler.json")
    headers["straggler"] = header
    gloo, ours = rows[("straggler", "gloo")], rows[("straggler", "stragglar")]
    ratio = gloo["time_from_straggler_s"] / ours["time_from_straggler_s"]
    model = gloo["predicted_s"] / ours["predicted_s"]
    figures.append(_figure("StragglAR vs gloo, from the straggler's arrival", ratio, ">= 1.25x", ratio >= 1.25, model))
    ratio = gloo["time_from_first_arrival_s"] / ours["time_from_first_arrival_s"]
    model = gloo["predicted_from_first_arrival_s"] / ours["predicted_from_first_arrival_s"]
    figures.append(_figure("StragglAR vs gloo, from the first arrival", ratio, ">= 1.15x", ratio >= 1.15, model))

    header, rows = _rows(results / "bench_degraded_l2.json")
    headers["degraded_l2"] = header
    gloo, ours = rows[("degraded", "gloo")], rows[("degraded", "optcc")]
    ratio = gloo["time_s"] / ours["time_s"]
    model = gloo["predicted_s"] / ours["predicted_s"]
    figures.append(
        _figure(
            "OptCC vs gloo, one host at 1/2", ratio, ">= 1.5x", ratio >= 1.5, gloo["predicted_s"] / ours["predicted_s"]
        )
    )
    over = ours["time_s"] / ours["lower_bound_s"] - 1.0
    figures.append(
        _figure(
            "OptCC above the lower bound l*S/B, one host at 1/2",
            over,
            "<= 15%",
            over <= 0.15,
            ours["predicted_s"] / ours["lower_bound_s"] - 1.0,
        )
    )

    header, rows = _rows(results / "bench_degraded_l8_7.json")
    headers["degraded_l8_7"] = header
    healthy, ours = rows[("none", "gloo")], rows[("degraded", "optcc")]
    over = ours["time_s"] / healthy["time_s"] - 1.0
    figures.append(
        _figure(
            "OptCC (one host at 7/8) over gloo on the fault-free cluster",
            over,
            "<= 8%",
            over <= 0.08,
            ours["predicted_s"] / healthy["predicted_s"] - 1.0,
        )
    )

    header, rows = _rows(results / "bench_no_fault.json")
    headers["no_fault"] = header
    gloo, ours = rows[("none", "gloo")], rows[("none", "ring")]
    over = ours["time_s"] / gloo["time_s"] - 1.0
    figures.append(_figure("our ring over gloo, no fault", over, "<= 5%", over <= 0.05, 0.0))
    return {"figures": figures, "runs": headers}


def main() -> int:
    results = Path(sys.argv[1] if len(sys.argv) > 1 else "profiling/results")
    summary = summarise(results)
    for figure in summary["figures"]:
        model = "-" if figure["model"] is None else f"{figure['model']:.3f}"
        verdict = "met" if figure["met"] else "NOT MET"
        print(f"{figure['figure']:<62} {figure['measured']:8.3f} (target {figure['target']}, model {model}) {verdict}")
    out = results / "bench_acceptance.json"
    out.write_text(json.dumps(summary, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The acceptance figures with the kernel's TCP send buffer and with 256 KiB, side by side.

Every file in profiling/results/send_buffer/ is one ``stragglerkit bench`` run of
profiling/bench_send_buffer.sh (its command, with ``--tcp-send-buffer`` or without, in the
header). Prints, per scenario and send buffer, the acceptance figure of every run and the median,
with gloo's and our algorithm's times and the critical path's wire time, its ideal and how much of
it the path's links spent on other messages; writes summary.json beside the runs.

Example::

    python profiling/send_buffer_summary.py profiling/results/send_buffer
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

OURS = {"straggler": "stragglar", "degraded_l2": "optcc", "degraded_l8_7": "optcc"}


def _figure(scenario: str, rows: dict[tuple[str, str], dict[str, Any]]) -> dict[str, float]:
    """The acceptance figures of one run (bench_acceptance_summary.py's definitions)."""
    if scenario == "straggler":
        gloo, ours = rows[("straggler", "gloo")], rows[("straggler", "stragglar")]
        return {
            "from_straggler_x": gloo["time_from_straggler_s"] / ours["time_from_straggler_s"],
            "from_first_x": gloo["time_from_first_arrival_s"] / ours["time_from_first_arrival_s"],
        }
    gloo, ours = rows[("degraded", "gloo")], rows[("degraded", "optcc")]
    if scenario == "degraded_l2":
        return {"vs_gloo_x": gloo["time_s"] / ours["time_s"], "over_bound": ours["time_s"] / ours["lower_bound_s"] - 1}
    return {"over_fault_free_gloo": ours["time_s"] / rows[("none", "gloo")]["time_s"] - 1}


def summarise(folder: Path) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*_run*.json")):
        data = json.loads(path.read_text())
        rows = {(r["scenario"], r["algorithm"]): r for r in data["rows"]}
        scenario, buffer = path.stem.rsplit("_run", 1)[0].rsplit("_", 1)
        group = groups.setdefault(f"{scenario} {buffer}", {"runs": []})
        ours = next(r for r in data["rows"] if r["algorithm"] == OURS[scenario])
        path_figures = ours.get("critical_path") or {}
        group["runs"].append(
            {
                "file": path.name,
                "command": data["header"]["command"],
                "date": data["header"]["date"],
                "gloo_ms": round(next(r for r in data["rows"] if r["algorithm"] == "gloo")["time_s"] * 1e3, 1),
                "ours_ms": round(ours["time_s"] * 1e3, 1),
                **{k: round(v, 4) for k, v in _figure(scenario, rows).items()},
                "path_wire_ms": round(path_figures.get("wire_s", float("nan")) * 1e3, 1),
                "path_wire_ideal_ms": round((path_figures.get("wire_ideal_s") or float("nan")) * 1e3, 1),
                "path_wire_link_busy_ms": round((path_figures.get("wire_link_busy_s") or float("nan")) * 1e3, 1),
            }
        )
    for group in groups.values():
        keys = [k for k in group["runs"][0] if k.endswith("_x") or k.startswith("over_") or k.endswith("_ms")]
        group["median"] = {k: statistics.median(run[k] for run in group["runs"]) for k in keys}
    return groups


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "profiling/results/send_buffer")
    groups = summarise(folder)
    for name, group in groups.items():
        median = group["median"]
        figures = ", ".join(f"{k} {v:.3f}" for k, v in median.items() if k.endswith("_x") or k.startswith("over_"))
        print(
            f"{name:<26} {len(group['runs'])} runs, medians: {figures}; gloo {median['gloo_ms']:.1f} ms, ours "
            f"{median['ours_ms']:.1f} ms"
        )
    (folder / "summary.json").write_text(json.dumps(groups, indent=1))
    print(f"wrote {folder / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

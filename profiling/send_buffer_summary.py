"""The acceptance figures with the kernel's TCP send buffer and with 256 KiB, side by side.

Every file in profiling/results/send_buffer/ is one ``stragglerkit bench`` run of
profiling/bench_send_buffer.sh (its command, with ``--tcp-send-buffer`` or without, in the
header); any folder of ``<scenario>_<variant>_run<i>.json`` files reads the same way
(profiling/bench_fair_queueing.sh: variants ``fifo`` and ``fair``). Prints, per scenario and
send buffer, the acceptance figure of every run and the median,
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_acceptance_summary import (  # the acceptance figures, defined once
    OURS,
    Rows,
    _optcc_over_bound,
    _optcc_over_healthy,
    _optcc_speedup,
    _straggler_from_arrival,
    _straggler_from_first,
)

FIGURES = {
    "straggler": {"from_straggler_x": _straggler_from_arrival, "from_first_x": _straggler_from_first},
    "degraded_l2": {"vs_gloo_x": _optcc_speedup, "over_bound": _optcc_over_bound},
    "degraded_l8_7": {"over_fault_free_gloo": _optcc_over_healthy},
}
"""Per scenario, the acceptance figures of one run (bench_acceptance_summary.py's measures)."""


def _figure(scenario: str, rows: Rows) -> dict[str, float]:
    return {name: measure(rows)[0] for name, measure in FIGURES[scenario].items()}


def summarise(folder: Path) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*_run*.json")):
        data = json.loads(path.read_text())
        rows = {(r["scenario"], r["algorithm"]): r for r in data["rows"]}
        scenario, buffer = path.stem.rsplit("_run", 1)[0].rsplit("_", 1)
        group = groups.setdefault(f"{scenario} {buffer}", {"runs": []})
        ours = rows[OURS[scenario]]
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

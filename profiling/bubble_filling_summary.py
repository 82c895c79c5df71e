"""Summary of ``profiling/bench_bubble_filling.sh``: OptCC at l = 8/7 with the runtime's bubble-filling
choice (``auto``), with fills (``on``) and without (``off``), per bandwidth and segment count (files
named ``l8_7_<bandwidth>[_k<segments>]_<auto|on|off>_run<i>.json``; without ``_k``: the runtime's count),
as the excess over gloo on the fault-free cluster measured in the same launch; the median over the
launches and each launch.

Example::

    python profiling/bubble_filling_summary.py profiling/results/bubble_filling
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import write_result
from bench_acceptance_summary import _optcc_over_healthy, _rows  # the acceptance figure, defined once

_NAME = re.compile(r"l8_7_(?P<bandwidth>[^_]+)(?:_k(?P<segments>\d+))?_(?P<filling>auto|on|off)_run(?P<run>\d+)\.json$")


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "profiling/results/bubble_filling")
    runs: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("l8_7_*_run*.json")):
        match = _NAME.search(path.name)
        if match is None:
            continue
        _, rows = _rows(path)
        over, model_over, _ = _optcc_over_healthy(rows)
        optcc, healthy = rows[("degraded", "optcc")], rows[("none", "gloo")]
        segments = match["segments"] or "default"
        runs[(match["bandwidth"], segments, match["filling"])].append(
            {
                "file": path.name,
                "optcc_s": optcc["time_s"],
                "optcc_predicted_s": optcc["predicted_s"],
                "gloo_fault_free_s": healthy["time_s"],
                "gloo_degraded_s": rows[("degraded", "gloo")]["time_s"],
                "over_fault_free_gloo": over,
                "model_over_fault_free_gloo": model_over,
            }
        )
    if not runs:
        print(f"bubble_filling_summary: no l8_7_*_run*.json in {folder}", file=sys.stderr)
        return 1
    summary = []
    for (bandwidth, segments, filling), launches in sorted(runs.items()):
        median = statistics.median(r["over_fault_free_gloo"] for r in launches)
        model = statistics.median(r["model_over_fault_free_gloo"] for r in launches)
        each = ", ".join(f"{100 * r['over_fault_free_gloo']:.1f} %" for r in launches)
        print(
            f"{bandwidth:>8}  k {segments:<7}  fills {filling:<4}  OptCC over fault-free gloo "
            f"{100 * median:5.1f} % ({each}); model {100 * model:.1f} %"
        )
        summary.append(
            {"bandwidth": bandwidth, "segments": segments, "bubble_filling": filling,
             "median_over_fault_free_gloo": median, "model_over_fault_free_gloo": model, "launches": launches}
        )  # fmt: skip
    write_result(folder / "summary.json", {}, summary=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The summary of bench_calibrate.sh: the cost models' held-out errors, next to the paper's.

Reads the ``--json`` comparison of ``stragglerkit bench --mode calibrate`` and overwrites one
summary (default ``profiling/results/calibration.json``): the provenance, the measurement's own
command and commit, each model's errors overall, per algorithm, per scenario and per network, the
fitted parameters and what was folded, and the decisions. ``profiling/render_results.py`` renders
its table in docs/results.md.

Example::

    python profiling/_calibrate_summary.py /tmp/comparison.json --command "bash profiling/bench_calibrate.sh"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("comparison", help="the --json file of stragglerkit bench --mode calibrate")
    parser.add_argument("--command", help="the command to record (default: this one)")
    parser.add_argument("--out", default=str(RESULTS / "calibration.json"))
    args = parser.parse_args()
    summary = json.loads(Path(args.comparison).read_text(encoding="utf-8"))
    summary.pop("samples_file", None)
    write_summary(args.out, "calibration", summary, command=args.command)
    print("now: python profiling/render_results.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())

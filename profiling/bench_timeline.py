"""Print each rank's phase/round spans from a ``stragglerkit bench --json`` file (which op waited).

For every row with a timeline (the last timed iteration; executor algorithms only), one line per
rank: its finish and, per phase/round label, ``first post - last completion`` in milliseconds,
all relative to the straggler's arrival (or to the first arrival without a straggler).

Example::

    python profiling/bench_timeline.py profiling/results/bench_straggler.json --algorithm stragglar
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path")
    parser.add_argument("--algorithm", help="only rows of this algorithm")
    args = parser.parse_args()
    with open(args.path, encoding="utf-8") as handle:
        rows = json.load(handle)["rows"]
    for row in rows:
        if not any(row.get("timeline") or []) or (args.algorithm and row["algorithm"] != args.algorithm):
            continue
        arrival, finish = row["samples"]["arrival"][-1], row["samples"]["finish"][-1]
        straggler = row["straggler"]
        origin = arrival[straggler] if straggler is not None else min(arrival)
        print(
            f"{row['algorithm']} {row['scenario']} {row['size_bytes'] / 2**20:g} MiB (ms from "
            f"{'the straggler' if straggler is not None else 'the first'} arrival)"
        )
        for rank, spans in enumerate(row["timeline"]):
            shift = arrival[rank] - origin
            parts = [
                f"{label}: {(start + shift) * 1e3:.0f}-{(end + shift) * 1e3:.0f}"
                for label, (start, end) in sorted(spans.items(), key=lambda item: item[1][0])
            ]
            print(f"  rank {rank} finish {(finish[rank] - origin) * 1e3:.0f} | " + " | ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

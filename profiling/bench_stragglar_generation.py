"""How long StragglAR's schedule generator takes, and how many rounds its schedules have.

Writes two files under profiling/results/:

* ``stragglar_generation.json``: the median (and every sample) of ``--repeats`` timed calls of
  ``stragglar(n)`` for each n of ``--sizes``: wall-clock (``time.perf_counter``) and CPU
  (``time.process_time``) seconds, plus the full ``gc.collect()`` that follows each call; the
  paper reports 1.04 s for n = 256 (stragglar.txt §3.2). The machine's load average is recorded
  because a shared machine makes wall-clock times noisy.
* ``stragglar_rounds.json``: the matching-phase rounds of every even n in 4..64 plus 96, 128 and
  256, each schedule proved by the symbolic checker (and its one-shot generation CPU time), next to the closed forms
  ``n + log2(n) - 2`` (powers of two), the lower bound ``n + ceil(log2 n) - 2``, the paper's rough
  ``n + 2·log2(n) - 2`` for other even n (appendix C), and the reference generator's counts.

Run from the repository root::

    PYTHONPATH=$PWD python profiling/bench_stragglar_generation.py

It also prints the rounds as a Markdown table (the one in docs/stragglar.md).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from stragglerkit.schedules.check import check
from stragglerkit.schedules.stragglar import stragglar

RESULTS = Path(__file__).resolve().parent / "results"
TIMED_SIZES = [8, 16, 32, 64, 128, 256]
ROUND_SIZES = [*range(4, 65, 2), 96, 128, 256]  # 96: e.g. 12 servers of 8 GPUs
# Round counts of the paper's reference generator for even n that are not powers of two.
REFERENCE_ROUNDS = {6: 7, 10: 12, 12: 15, 14: 17, 24: 27}
PAPER_SECONDS_256 = 1.04


def machine() -> dict[str, Any]:
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    return {
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch_version,
        "load_average_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def time_generation(n: int, repeats: int) -> dict[str, Any]:
    """Time ``stragglar(n)``; separately, the garbage collection it leaves behind.

    The generator pauses Python's cyclic collector while it allocates the ops; the collector's
    first pass over them then happens later, in the caller. ``collect_after_s`` times an explicit
    full ``gc.collect()`` right after each call, an upper bound of that deferred cost.
    """
    wall: list[float] = []
    cpu: list[float] = []
    collect_after: list[float] = []
    rounds = num_ops = 0
    for _ in range(repeats):
        gc.collect()
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        sched = stragglar(n)
        cpu.append(time.process_time() - cpu_start)
        wall.append(time.perf_counter() - wall_start)
        collect_start = time.perf_counter()
        gc.collect()
        collect_after.append(time.perf_counter() - collect_start)
        rounds, num_ops = sched.rounds(), sched.num_ops()
        del sched  # freed outside the timed region
    return {
        "n": n,
        "rounds": rounds,
        "num_ops": num_ops,
        "wall_s_median": statistics.median(wall),
        "cpu_s_median": statistics.median(cpu),
        "collect_after_s_median": statistics.median(collect_after),
        "wall_s": wall,
        "cpu_s": cpu,
        "collect_after_s": collect_after,
    }


def is_power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def round_row(n: int) -> dict[str, Any]:
    cpu_start = time.process_time()
    sched = stragglar(n)
    cpu = time.process_time() - cpu_start
    check(sched)
    log_n = math.log2(n)
    return {
        "n": n,
        "rounds": sched.rounds(),
        "checked": True,
        "lower_bound": n + math.ceil(log_n) - 2,
        "n_plus_log2n_minus_2": n + int(log_n) - 2 if is_power_of_two(n) else None,
        "n_plus_2log2n_minus_2": round(n + 2 * log_n - 2, 2),
        "reference": REFERENCE_ROUNDS.get(n),
        "generation_cpu_s": round(cpu, 4),
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| n | rounds | n+log2(n)-2 (power of two) | lower bound n+⌈log2 n⌉-2 | n+2·log2(n)-2 | reference | "
        "generation CPU s |",
        "| --: | --: | --: | --: | --: | --: | --: |",
    ]
    for row in rows:
        exact = row["n_plus_log2n_minus_2"]
        ref = row["reference"]
        lines.append(
            f"| {row['n']} | {row['rounds']} | {'' if exact is None else exact} | {row['lower_bound']} | "
            f"{row['n_plus_2log2n_minus_2']:.2f} | {'' if ref is None else ref} | {row['generation_cpu_s']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per size (median reported; >= 5)")
    parser.add_argument("--sizes", type=int, nargs="+", default=TIMED_SIZES, help="world sizes to time")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON files go")
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error("--repeats must be at least 5 (the median of fewer runs is too noisy here)")

    command = shlex.join([Path(sys.executable).name, *sys.argv])
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    args.out_dir.mkdir(parents=True, exist_ok=True)

    timings = []
    for n in args.sizes:
        result = time_generation(n, args.repeats)
        timings.append(result)
        print(
            f"n={n:4d}  rounds={result['rounds']:4d}  ops={result['num_ops']:7d}  "
            f"wall median {result['wall_s_median']:.3f} s  cpu median {result['cpu_s_median']:.3f} s  "
            f"gc.collect() after {result['collect_after_s_median']:.3f} s",
            flush=True,
        )
    generation = {
        "what": "StragglAR schedule generation time, stragglar(n) incl. IR lowering",
        "command": command,
        "date": date,
        "machine": machine(),
        "repeats": args.repeats,
        "paper_seconds_n256": PAPER_SECONDS_256,
        "results": timings,
    }
    (args.out_dir / "stragglar_generation.json").write_text(json.dumps(generation, indent=2) + "\n")

    rows = [round_row(n) for n in ROUND_SIZES]
    rounds = {
        "what": "StragglAR matching-phase rounds (every schedule passed the symbolic checker)",
        "command": command,
        "date": date,
        "machine": machine(),
        "rows": rows,
    }
    (args.out_dir / "stragglar_rounds.json").write_text(json.dumps(rounds, indent=2) + "\n")
    print(markdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What rank 0's controller costs per stats exchange, measured alone (no processes, no network).

The DDP hook hands every exchange to ``Controller.observe`` on rank 0's background thread; on a
host whose cores are all busy (8 ranks on 2 cores here) that CPU time lengthens rank 0's step
and with it everybody's. This script feeds ``observe`` a synthetic fault-free run of the default
configuration: ``--world-size`` ranks, two buckets (6.7 MiB, 1.3 MiB, as in ``bench --mode
train``), the group's own all_reduce with a ring probe on the large bucket every ``probe_every``-th
step (the probe interval the controller ships is followed, so the probes back off as they do in a
run), AllReduce times with a little noise. It reports the median and mean wall-clock time per
``observe`` call over the exchanges after the warm-up, repeated ``--repeats`` times (median of
the repeats' medians).

Example::

    PYTHONPATH=$PWD python profiling/bench_controller_observe.py --json profiling/results/controller_observe.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import provenance

from stragglerkit.detect.controller import Controller, ControllerConfig, WindowStats

BUCKETS = [7_059_424, 1_356_960]
"""Bucket bytes of the MLP that ``bench --mode train`` trains (8 MiB of gradients)."""


def exchange(rng: random.Random, n: int, first: int, probe_every: int, buckets: int = 32) -> WindowStats:
    """Two steps of a fault-free run: every rank arrives within 0.5 ms, the AllReduce takes ~0.25 s."""
    steps = [first, first + 1]
    totals, spans, algorithms = [], [], []
    for step in steps:
        arrivals = np.array([rng.uniform(0.0, 0.0005) for _ in range(n)])
        tail = 0.25 * rng.uniform(0.95, 1.05)
        per_bucket = np.full((n, buckets), np.nan)
        per_bucket[:, 0] = arrivals.max() + 0.8 * tail - arrivals
        per_bucket[:, 1] = 0.2 * tail
        spans.append(per_bucket)
        totals.append(np.nansum(per_bucket, axis=1))
        probe = step > 0 and probe_every > 0 and step % probe_every == 0
        algorithms.append(["ring" if probe else "allreduce", "allreduce"] + [""] * (buckets - 2))
    probed = any(a[0] == "ring" for a in algorithms)
    rates = np.full((n, n), np.nan)
    if probed:
        for i in range(n):
            rates[i, (i + 1) % n] = 119.6e6 * rng.uniform(0.8, 1.0)
    tails = np.array([0.25] * len(steps))
    return WindowStats(
        steps=steps,
        totals=np.array(totals),
        bucket_spans=np.array(spans),
        bucket_bytes=BUCKETS,
        algorithms=algorithms,
        link_rates=rates,
        speeds=np.full(n, np.nan),
        hosts=list(range(n)),
        tails=tails,
        ends=np.array([0.3 * s for s in steps]),
    )


def run(n: int, steps: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    controller = Controller(n, 0, ControllerConfig())
    timings = []
    for first in range(0, steps, 2):
        stats = exchange(rng, n, first, controller.probe_every)
        start = time.perf_counter()
        decision = controller.observe(stats, first + 4)
        timings.append(time.perf_counter() - start)
        if decision is not None:
            controller.apply(decision)
    measured = timings[len(timings) // 10 :]
    return {
        "median_ms": 1e3 * statistics.median(measured),
        "mean_ms": 1e3 * statistics.fmean(measured),
        "exchanges": len(measured),
        "probe_every_at_end": controller.probe_every,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    repeats = [run(args.world_size, args.steps, seed) for seed in range(args.repeats)]
    result: dict[str, Any] = {
        **provenance(),
        "world_size": args.world_size,
        "steps": args.steps,
        "buckets_bytes": BUCKETS,
        "observe_median_ms": statistics.median(r["median_ms"] for r in repeats),
        "observe_mean_ms": statistics.median(r["mean_ms"] for r in repeats),
        "repeats": repeats,
    }
    print(
        f"Controller.observe, {args.world_size} ranks, fault-free, {args.repeats} repeats: median "
        f"{result['observe_median_ms']:.3f} ms, mean {result['observe_mean_ms']:.3f} ms per exchange",
        flush=True,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

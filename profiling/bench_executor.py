"""Executor vs gloo on loopback: our plan interpreter against torch.distributed.all_reduce.

Spawns ``--world-size`` gloo ranks on 127.0.0.1 and, for each bucket size, interleaves a gloo
``all_reduce``, a second gloo ``all_reduce`` (the A/A control: two identical copies, whose ratio
says how far this machine moves a figure by itself) and ``stragglerkit.all_reduce(algorithm=...)``
on the same data, ``--repeats`` times (the order rotates every repetition). A repetition's time is
the slowest rank's time between a barrier and the end of its call. Reported the nccl-tests way:
size, count, median time, algbw, busbw (GB = 1e9, busbw = algbw·2(n-1)/n), #wrong (results that
differ from gloo's by more than the float32 rounding bound), plus the ratio of medians ours/gloo,
the control's gloo/gloo and p10/p90.

Overwrites ``profiling/results/bench_executor.json`` (``--out``). Targets: 64 MiB at most 1.25x
gloo's time, 1 KiB at most 2x gloo's latency. About 4 minutes on a 2-core machine with the
defaults below, 12 with ``--repeats 101``.

Example::

    python profiling/bench_executor.py --world-size 4 --sizes 67108864,1024 --repeats 101 --warmup 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, ROOT, write_summary

COPIES = ("gloo", "gloo_control", "ours")
"""What each repetition runs, in rotating order: gloo, gloo again (the A/A control), ours."""


def _rank_main(rank: int, n: int, store_path: str, args: argparse.Namespace, queue: Any) -> None:
    sys.path.insert(0, str(ROOT))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, n), rank=rank, world_size=n)
    import stragglerkit

    stragglerkit.init()  # collective: every rank, once

    out: dict[str, Any] = {}
    for nbytes in args.sizes:
        numel = max(1, nbytes // 4)
        data = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        for algorithm in args.algorithms:
            times: dict[str, list[float]] = {copy: [] for copy in COPIES}
            wrong = 0
            for rep in range(args.warmup + args.repeats):
                order = COPIES[rep % 3 :] + COPIES[: rep % 3]
                results: dict[str, torch.Tensor] = {}
                for which in order:
                    x = data.clone()
                    dist.barrier()
                    start = time.perf_counter()
                    if which == "ours":
                        stragglerkit.all_reduce(x, algorithm=algorithm)
                    else:
                        dist.all_reduce(x)
                    elapsed = time.perf_counter() - start
                    results[which] = x
                    if rep >= args.warmup:
                        times[which].append(elapsed)
                bound = 2 * n * torch.finfo(torch.float32).eps * (data.abs().max().item() * n) + 1e-30
                if rep >= args.warmup and (results["gloo"] - results["ours"]).abs().max().item() > bound:
                    wrong += 1
            out[f"{nbytes}/{algorithm}"] = {**times, "wrong": wrong}
    queue.put((rank, out))
    dist.barrier()


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_s": statistics.median(ordered),
        "p10_s": ordered[len(ordered) // 10],
        "p90_s": ordered[(len(ordered) * 9) // 10],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--sizes", default="67108864,1024", help="bucket sizes in bytes (float32), comma-separated")
    parser.add_argument("--algorithms", default="ring", help="stragglerkit algorithms, comma-separated")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default=str(RESULTS / "bench_executor.json"))
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.algorithms = args.algorithms.split(",")
    n = args.world_size

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank_main, args=(r, n, store, args, queue)) for r in range(n)]
        for p in procs:
            p.start()
        per_rank = dict(queue.get(timeout=1800) for _ in range(n))
        for p in procs:
            p.join()

    rows = []
    for key in per_rank[0]:
        nbytes_text, algorithm = key.split("/")
        nbytes = int(nbytes_text)
        reps = len(per_rank[0][key]["gloo"])
        # a repetition takes as long as its slowest rank
        slowest = {copy: [max(per_rank[r][key][copy][i] for r in range(n)) for i in range(reps)] for copy in COPIES}
        g, c, o = (_summary(slowest[copy]) for copy in COPIES)
        algbw = nbytes / o["median_s"] / 1e9
        rows.append(
            {
                "size_bytes": nbytes,
                "count": max(1, nbytes // 4),
                "algorithm": algorithm,
                "gloo": g,
                "ours": o,
                "gloo_control": c,
                "ratio_of_medians": o["median_s"] / g["median_s"],
                "control_ratio_of_medians": c["median_s"] / g["median_s"],
                "ours_algbw_GBps": algbw,
                "ours_busbw_GBps": algbw * 2 * (n - 1) / n,
                "gloo_algbw_GBps": nbytes / g["median_s"] / 1e9,
                "wrong": sum(per_rank[r][key]["wrong"] for r in range(n)),
                "repeats": reps,
            }
        )
    result = {
        "world_size": n,
        "transport": "gloo over loopback (127.0.0.1), one process per rank",
        "targets": {"64MiB_ratio_max": 1.25, "1KiB_ratio_max": 2.0},
        "rows": rows,
    }
    write_summary(args.out, "executor_loopback", result)
    columns = ("size", "alg", "gloo med", "ours med", "ratio", "A/A", "busbw", "wrong")
    print(" ".join(f"{c:>{w}}" for c, w in zip(columns, (10, 8, 10, 10, 6, 6, 7, 5), strict=True)))
    for row in rows:
        print(
            f"{row['size_bytes']:>10} {row['algorithm']:>8} {row['gloo']['median_s'] * 1e3:>9.3f}m "
            f"{row['ours']['median_s'] * 1e3:>9.3f}m {row['ratio_of_medians']:>6.2f} "
            f"{row['control_ratio_of_medians']:>6.2f} {row['ours_busbw_GBps']:>7.2f} "
            f"{row['wrong']:>5}"
        )


if __name__ == "__main__":
    main()

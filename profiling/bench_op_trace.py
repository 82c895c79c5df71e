"""Per-op timings of one algorithm on the emulated cluster: which message waited, and how long.

Runs ``--world-size`` ranks at ``--bandwidth`` (optionally one degraded host and/or a late
straggler), ``--iters`` AllReduces of ``--size`` bytes, and keeps the executor's per-op timings
(post and completion of every send/receive) of the last iteration. Prints, per rank and phase,
the number of messages, their median post-to-completion time and the ideal time of one such
message on that rank's link; writes everything to ``--out`` (JSON).

Example::

    python profiling/bench_op_trace.py --algorithm optcc --degrade 3:2 --size 33554432
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "profiling"))


def _rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import stragglerkit
    from stragglerkit.testbed.inject import sleep_precisely

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    slowdowns = {args.degraded: args.slowdown} if args.degraded is not None else None
    x = torch.ones(args.size // 4)
    trace = []
    for _ in range(args.iters):
        dist.barrier()
        if rank == args.straggler:
            sleep_precisely(args.delay)
        entered = time.monotonic_ns()
        record = stragglerkit.all_reduce(x, algorithm=args.algorithm, straggler=args.straggler, slowdowns=slowdowns)
        left = time.monotonic_ns()
        trace = [
            [label, t.kind, t.peer, t.nbytes, (t.start_ns - entered) / 1e9, (t.end_ns - entered) / 1e9]
            for label, t in record.labelled_timings()
        ]
        trace_info = {"entered_ns": entered, "left_ns": left}
    gathered: list[object] = [None] * n
    dist.all_gather_object(gathered, {"ops": trace, **trace_info})
    if rank == 0:
        Path(args.rank_out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="optcc")
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--bandwidth", default="1Gbit")
    parser.add_argument("--size", type=int, default=32 * 2**20)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--degrade", default=None, help="RANK:L")
    parser.add_argument("--straggler", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds")
    parser.add_argument("--out", default=None)
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.degraded, args.slowdown = (None, 1.0)
    if args.degrade:
        rank_text, slow_text = args.degrade.split(":")
        args.degraded, args.slowdown = int(rank_text), float(slow_text)
    if args.rank_out:
        _rank_main(args)
        return 0

    from _env import emulated_cluster_ready, run_on_hosts, write_result

    from stragglerkit.testbed import EmulatedCluster
    from stragglerkit.units import parse_bandwidth

    if not emulated_cluster_ready():
        return 1
    slowdowns = {args.degraded: args.slowdown} if args.degraded is not None else {}
    config = EmulatedCluster.Config(
        hosts=args.world_size, bandwidth=parse_bandwidth(args.bandwidth), slowdowns=slowdowns
    )
    with EmulatedCluster(config) as cluster:
        ranks = run_on_hosts(cluster, __file__, sys.argv[1:], args.world_size)
        payload = [cluster.expected_payload_rate(h) for h in range(args.world_size)]
        description = cluster.describe()
    summary = []
    for rank, data in enumerate(ranks):
        phases: dict[str, list[list[float]]] = {}
        for label, _kind, peer, nbytes, start, end in data["ops"]:
            phase = label.split(" round")[0]
            ideal = nbytes / min(payload[rank], payload[peer])
            phases.setdefault(phase, []).append([end - start, ideal])
        total = (data["left_ns"] - data["entered_ns"]) / 1e9
        for phase, items in phases.items():
            median = statistics.median(i[0] for i in items)
            ideal = statistics.median(i[1] for i in items)
            summary.append({"rank": rank, "phase": phase, "messages": len(items), "median_s": median, "ideal_s": ideal})
            print(
                f"rank {rank} ({total * 1e3:6.0f} ms) {phase:15s} {len(items):4d} messages, median "
                f"{median * 1e3:7.2f} ms, ideal {ideal * 1e3:6.2f} ms"
            )
    out = args.out or str(ROOT / f"profiling/results/bench_op_trace_{args.algorithm}.json")
    write_result(out, description, indent=None, summary=summary, ranks=ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())

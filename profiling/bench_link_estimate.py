"""How well the NIC-health estimate reads a degraded NIC: ``l`` per rank from single ring runs.

Runs ``--world-size`` ranks on the emulated cluster at ``--bandwidth`` with one host degraded
(``--degrade RANK:L``), and ``--iters`` ring AllReduces of ``--size`` bytes (the first one is
left out: connections are set up). With ``--concurrent BYTES`` every rank also starts the process
group's own all_reduce of that many bytes ``--concurrent-after`` seconds into each ring run, as
DDP does with its other bucket while the hook probes the largest one. For every run it prints the
``l`` per rank of two estimators:

* ``busy``: what the DDP hook uses, each message charged its busy period
  (:func:`stragglerkit.detect.nic_health.message_link_rates`);
* ``first``: the estimate it replaced, each link's first message only, its transfer taken from the
  later of the two ranks' entries (computed here, for comparison).

and overwrites ``--json`` (default ``profiling/results/bench_link_estimate.json``) with the
summary and every run. Needs root (the emulated cluster); about 2 minutes on a 2-core machine.

Example::

    python profiling/bench_link_estimate.py --degrade 3:2 --size 7059424 --concurrent 1356960 \\
        --concurrent-after 0.005
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "profiling"))


def _rank_main(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import stragglerkit

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    stragglerkit.init()  # collective: every rank, once
    rank, n = dist.get_rank(), dist.get_world_size()
    ring_buffer = torch.ones(args.size // 4)
    other = torch.ones(args.concurrent // 4) if args.concurrent else None
    runs = []
    for _ in range(args.iters):
        dist.barrier()
        ring = stragglerkit.all_reduce(ring_buffer, async_op=True, algorithm="ring")
        assert ring is not None
        work = None
        if other is not None:
            time.sleep(args.concurrent_after)
            work = dist.all_reduce(other, async_op=True)
        ring.wait(120)
        record = ring.result()
        if work is not None:
            work.wait()
        ops = [[t.kind, t.peer, t.nbytes, t.start_ns, t.end_ns] for t in record.timings.records()]
        runs.append(ops)
    gathered: list[object] = [None] * n
    dist.all_gather_object(gathered, runs)
    if rank == 0:
        Path(args.rank_out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def _estimates(ranks: list[list[list[list[int | str]]]], run: int) -> tuple[np.ndarray, np.ndarray]:
    """(busy-period l, first-message l) of one run; all ranks share this machine's monotonic clock."""
    from stragglerkit.detect.nic_health import message_link_rates, ring_link_messages, slowdowns_from_links
    from stragglerkit.runtime.executor import OpTiming

    n = len(ranks)
    timings = [
        [OpTiming(0, int(peer), int(size), str(kind), int(s), int(e)) for kind, peer, size, s, e in ranks[r][run]]
        for r in range(n)
    ]
    starts_ns = [min(t.start_ns for t in ops) for ops in timings]
    base = min(starts_ns)
    starts = np.array([[(s - base) / 1e9 for s in starts_ns]])
    links = [[ring_link_messages(timings[r], starts_ns[r]) for r in range(n)]]
    busy = slowdowns_from_links(message_link_rates(starts, links))
    first = np.full((n, n), np.nan)  # [src, dst] bytes/s of each link's first message
    for dst in range(n):
        firsts = [t for t in timings[dst] if t.kind != "send"]
        if not firsts:
            continue
        message = min(firsts, key=lambda t: t.start_ns)
        src = message.peer
        transfer = (message.end_ns - max(starts_ns[src], starts_ns[dst])) / 1e9
        if transfer > 0 and message.nbytes >= 32 * 1024:
            first[src, dst] = message.nbytes / transfer
    return busy, slowdowns_from_links(first)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--bandwidth", default="1Gbit")
    parser.add_argument("--size", type=int, default=30658144, help="ring bytes (default: the 32 MiB model's bucket)")
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--degrade", default="3:2", help="RANK:L")
    parser.add_argument("--concurrent", type=int, default=0, help="bytes of a concurrent gloo all_reduce (0: none)")
    parser.add_argument("--concurrent-after", type=float, default=0.02, help="seconds into each ring run")
    parser.add_argument(
        "--json", default=None, help="summary file (default profiling/results/bench_link_estimate.json)"
    )
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_out:
        _rank_main(args)
        return 0

    from _env import RESULTS, emulated_cluster_ready, run_on_hosts, write_summary

    from stragglerkit.testbed import EmulatedCluster
    from stragglerkit.units import parse_bandwidth

    if not emulated_cluster_ready():
        return 1
    if args.iters < 2:
        parser.error("--iters must be at least 2 (the first run is left out)")
    degraded, slowdown = args.degrade.split(":")
    config = EmulatedCluster.Config(
        hosts=args.world_size,
        bandwidth=parse_bandwidth(args.bandwidth),
        slowdowns={int(degraded): float(slowdown)},
    )
    with EmulatedCluster(config) as cluster:
        ranks = run_on_hosts(cluster, __file__, sys.argv[1:], args.world_size)
        description = cluster.describe()
    rows = []
    np.set_printoptions(precision=2, suppress=True, linewidth=160)
    for run in range(1, args.iters):
        busy, first = _estimates(ranks, run)
        rows.append({"run": run, "busy": busy.round(4).tolist(), "first": first.round(4).tolist()})
        print(f"run {run}: busy {busy}  first {first}")
    bad = int(degraded)
    summary = {}
    for name in ("busy", "first"):
        own = [r[name][bad] for r in rows]
        others = [v for r in rows for i, v in enumerate(r[name]) if i != bad and v is not None]
        summary[name] = {
            "degraded_min": min(own),
            "degraded_median": statistics.median(own),
            "degraded_max": max(own),
            "others_max": max(others),
        }
        print(
            f"{name:5s}: rank {bad} reads {min(own):.2f}-{max(own):.2f} (median {statistics.median(own):.2f}), "
            f"every other rank at most {max(others):.2f}"
        )
    out = args.json or RESULTS / "bench_link_estimate.json"
    write_summary(out, "link_estimate", {"cluster": description, "summary": summary, "runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

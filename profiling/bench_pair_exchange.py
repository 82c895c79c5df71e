"""Is a gloo pair full duplex? Exchange vs one-way transfers on the emulated cluster.

StragglAR's matching rounds are swaps: two ranks send each other a chunk at the same time, over
the one TCP connection that gloo keeps per pair of ranks. The cost model counts a swap as one
chunk time (each NIC direction carries one chunk). This script measures, on 3 emulated hosts at
``--bandwidth``, the median time of:

* ``oneway``: host 0 sends ``size`` bytes to host 1;
* ``swap``: hosts 0 and 1 send each other ``size`` bytes at once (isend + irecv, one gloo pair);
* ``swap_two_groups``: the same swap, each direction over a different process group (two sockets);
* ``ring3``: each of the 3 hosts sends to the next and receives from the previous one at once.

The ideal for all four is ``size`` / payload rate. Writes profiling/results/bench_pair_exchange.json.

Example::

    python profiling/bench_pair_exchange.py --sizes 1198372,4793490 --repeats 15
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

MODES = ("oneway", "swap", "swap_two_groups", "ring3")


def _rank_main(sizes: list[int], repeats: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    second = dist.new_group(list(range(n)))
    results: dict[str, dict[str, float]] = {}
    for size in sizes:
        x = torch.zeros(size // 4)
        y = torch.empty_like(x)
        for mode in MODES:
            times = []
            for _ in range(repeats + 2):
                dist.barrier()
                start = time.perf_counter()
                works = []
                if mode == "oneway" and rank < 2:
                    works = [dist.isend(x, 1) if rank == 0 else dist.irecv(y, 0)]
                elif mode == "swap" and rank < 2:
                    works = [dist.isend(x, 1 - rank), dist.irecv(y, 1 - rank)]
                elif mode == "swap_two_groups" and rank < 2:
                    send_group, recv_group = (None, second) if rank == 0 else (second, None)
                    works = [dist.isend(x, 1 - rank, group=send_group), dist.irecv(y, 1 - rank, group=recv_group)]
                elif mode == "ring3":
                    works = [dist.isend(x, (rank + 1) % n), dist.irecv(y, (rank - 1) % n)]
                for work in works:
                    work.wait()
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                times.append(float(elapsed.item()))
            results[f"{size}/{mode}"] = {"median_s": statistics.median(times[2:]), "min_s": min(times[2:])}
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1198372,4793490", help="bytes, comma-separated")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--bandwidth", default="1Gbit")
    parser.add_argument("--out", default=str(ROOT / "profiling/results/bench_pair_exchange.json"))
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.rank_out:
        _rank_main(sizes, args.repeats, args.rank_out)
        return 0

    from _env import emulated_cluster_ready, run_on_hosts, write_result

    from stragglerkit.testbed import EmulatedCluster
    from stragglerkit.units import parse_bandwidth

    if not emulated_cluster_ready():
        return 1
    config = EmulatedCluster.Config(hosts=3, bandwidth=parse_bandwidth(args.bandwidth))
    with EmulatedCluster(config) as cluster:
        measured = run_on_hosts(cluster, __file__, ["--sizes", args.sizes, "--repeats", str(args.repeats)], 3)
        payload = cluster.expected_payload_rate(0)
        description = cluster.describe()
    rows = []
    for key, value in measured.items():
        size_text, mode = key.split("/")
        ideal = int(size_text) / payload
        rows.append({"size_bytes": int(size_text), "mode": mode, **value, "ideal_s": ideal})
        print(
            f"{int(size_text) / 2**20:7.2f} MiB {mode:16s} median {value['median_s'] * 1e3:8.2f} ms "
            f"({value['median_s'] / ideal:.2f}x the ideal {ideal * 1e3:.2f} ms)"
        )
    write_result(args.out, description, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

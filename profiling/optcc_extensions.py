"""OptCC with several stragglers (App. D) and several GPUs per server (App. E), in the simulator.

Bandwidth only (alpha = 0), k = 64, times in units of n (buffer / healthy NIC bandwidth).

* several stragglers: simulated time vs the paper's App. D.3 closed form and Theorem 2's bound;
* several GPUs per server: the simulator has one NIC per rank and no NVLink, so the schedule is
  timed through :func:`~stragglerkit.schedules.optcc_servers.nic_projection` (NVLink taken as
  free), vs App. E.4 and Theorems 3 and 13.

    PYTHONPATH=$PWD python profiling/optcc_extensions.py

Writes profiling/results/optcc_extensions.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import provenance

from stragglerkit.schedules.optcc import optcc
from stragglerkit.schedules.optcc_servers import nic_projection
from stragglerkit.sim import optcc_bounds as ob
from stragglerkit.sim.simulator import Network, simulate

K = 64
MULTI = [
    (16, [8 / 7, 8 / 7]),
    (16, [1.5, 2.0]),
    (32, [2.0, 2.0]),
    (32, [1.33, 1.33, 1.33]),
    (32, [3.0, 1.5]),
    (64, [2.0, 1.5, 1.14]),
    (64, [4.0, 4.0]),
]
SERVERS = [(32, 4, 8 / 7), (32, 4, 2.0), (64, 8, 1.5), (64, 8, 2.0), (64, 2, 3.0), (64, 4, 4.0)]


def _multi(p: int, slowdowns: list[float]) -> dict[str, Any]:
    degraded = {i * (p // len(slowdowns)): slowdown for i, slowdown in enumerate(slowdowns)}
    time = simulate(optcc(p, degraded, segments=K), 1.0, Network.uniform(p, 0.0, 1.0, degraded)).makespan
    paper = ob.optcc_multi_time(p, slowdowns, K)
    bound = ob.theorem2_bound(p, slowdowns)
    return {
        "p": p,
        "slowdowns": slowdowns,
        "optcc": time,
        "paper_d3": paper,
        "theorem2_bound": bound,
        "ring_degraded": ob.ring_degraded_time(p, slowdowns),
        "optcc_over_d3": time / paper,
        "optcc_over_bound": time / bound,
    }


def _servers(p: int, g: int, slowdown: float) -> dict[str, Any]:
    degraded = {r: slowdown for r in range(g, 2 * g)}  # every GPU of server 1
    sched = nic_projection(optcc(p, degraded, segments=K, gpus_per_server=g), g)
    time = simulate(sched, 1.0, Network.uniform(p, 0.0, 1.0, degraded)).makespan
    paper = ob.optcc_multigpu_time(p, g, slowdown, K)
    return {
        "p": p,
        "gpus_per_server": g,
        "slowdown": slowdown,
        "optcc_nic_only": time,
        "paper_e4": paper,
        "theorem13_bound": ob.theorem13_bound(p, g, slowdown),
        "theorem3_bound": ob.theorem3_bound(p, g, slowdown),
        "fault_free": ob.fault_free_time(p, 1.0, g),
        "optcc_over_e4": time / paper,
        "optcc_over_theorem13": time / ob.theorem13_bound(p, g, slowdown),
    }


def main() -> None:
    multi = [_multi(p, ls) for p, ls in MULTI]
    servers = [_servers(p, g, sl) for p, g, sl in SERVERS]
    for row in multi:
        print(f"p={row['p']} l={row['slowdowns']}: /D.3 {row['optcc_over_d3']:.3f} /Thm2 {row['optcc_over_bound']:.3f}")
    for row in servers:
        print(
            f"p={row['p']} g={row['gpus_per_server']} l={row['slowdown']:.3g}: /E.4 {row['optcc_over_e4']:.3f} "
            f"/Thm13 {row['optcc_over_theorem13']:.3f}"
        )
    out = {
        **provenance(),
        "units": "times in n = buffer bytes / healthy NIC bandwidth; alpha = 0; k = 64",
        "multi_straggler": multi,
        "multi_gpu_nic_only": servers,
    }
    (Path(__file__).resolve().parent / "results" / "optcc_extensions.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

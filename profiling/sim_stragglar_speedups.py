"""StragglAR versus ring and RHD in the flow-level simulator, with the paper's parameters.

stragglar.txt §4.3 / Fig. 6(b): alpha = 3 us, beta = 1 / 450 GB/s, a 1 GiB (2^30 bytes) buffer, the
straggler (rank n-1) arriving exactly when the punctual ranks finish StragglAR's reduce-scatter
pre-phase (``auto_delay``), times measured from the straggler's arrival. Every algorithm sees the
same arrivals. Next to each simulated time: the closed form of Table 1 and the GenModel prediction
computed from the schedule's IR (pre-phase hidden for StragglAR), and the paper's speedups.

    PYTHONPATH=$PWD python profiling/sim_stragglar_speedups.py   # writes profiling/results/sim_stragglar_speedups.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
from _env import command_line, machine_info, utc_now

from stragglerkit.schedules import rhd, ring
from stragglerkit.schedules.stragglar import stragglar
from stragglerkit.sim import CostModel, Network, auto_delay, simulate

ALPHA, BANDWIDTH, SIZE = 3e-6, 450e9, 2**30
PAPER_SPEEDUP_OVER_RING = {4: 1.13, 8: 1.36, 16: 1.57, 256: 1.94}


def _closed_forms(n: int) -> dict[str, float | None]:
    beta_s = SIZE / BANDWIDTH
    ring_time = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * beta_s
    out: dict[str, float | None] = {"ring": ring_time, "rhd": None, "stragglar": None}
    if n & (n - 1) == 0:
        log_n = int(math.log2(n))
        out["rhd"] = 2 * log_n * ALPHA + 2 * (n - 1) / n * beta_s
        rounds = n + log_n - 2
        out["stragglar"] = rounds * ALPHA + rounds / (n - 1) * beta_s
    return out


def _row(n: int) -> dict[str, Any]:
    start = time.perf_counter()
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BANDWIDTH)
    model = CostModel(CostModel.Config(alpha=ALPHA, beta=1 / BANDWIDTH))
    schedules = {"stragglar": stragglar(n), "ring": ring(n), "rhd": rhd(n)}
    straggler = int(schedules["stragglar"].params["straggler"])
    delay = auto_delay(schedules["stragglar"], SIZE, net)
    arrivals = np.zeros(n)
    arrivals[straggler] = delay
    simulated = {
        name: simulate(sched, SIZE, net, arrivals=arrivals).time_from_last_arrival for name, sched in schedules.items()
    }
    predicted = {
        "stragglar": model.predict(schedules["stragglar"], SIZE, hidden_phases=("reduce_scatter",)),
        "ring": model.predict(schedules["ring"], SIZE),
        "rhd": model.predict(schedules["rhd"], SIZE),
    }
    closed = _closed_forms(n)
    row = {
        "world_size": n,
        "straggler_delay_s": delay,
        "simulated_s": simulated,
        "cost_model_s": predicted,
        "table1_closed_form_s": closed,
        "speedup_over_ring": simulated["ring"] / simulated["stragglar"],
        "speedup_over_rhd": simulated["rhd"] / simulated["stragglar"],
        "paper_speedup_over_ring": PAPER_SPEEDUP_OVER_RING.get(n),
        "seconds_to_compute": round(time.perf_counter() - start, 2),
    }
    print(
        f"n={n:4d}  stragglar {simulated['stragglar'] * 1e3:.4f} ms  ring {simulated['ring'] * 1e3:.4f} ms  "
        f"rhd {simulated['rhd'] * 1e3:.4f} ms  speedup vs ring {row['speedup_over_ring']:.3f}"
        f" (paper {row['paper_speedup_over_ring']})  vs rhd {row['speedup_over_rhd']:.3f}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--out", type=Path, default=Path("profiling/results/sim_stragglar_speedups.json"))
    args = parser.parse_args(argv)
    rows = [_row(n) for n in args.sizes]
    report = {
        "command": command_line(),
        "date": utc_now(),
        "machine": machine_info(),
        "parameters": {
            "alpha_s": ALPHA,
            "bandwidth_Bps": BANDWIDTH,
            "size_bytes": SIZE,
            "straggler_arrival": "auto_delay: when the punctual ranks finish StragglAR's reduce_scatter",
            "times": "from the straggler's arrival (time_from_last_arrival)",
        },
        "paper": "stragglar.txt §4.3, Fig. 6(b): StragglAR over ring 1.13x (n=4), 1.36x (8), 1.57x (16), 1.94x (256)",
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()

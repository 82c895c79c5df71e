"""How exactly the emulated cluster's shaped NICs deliver the configured bandwidth.

For each bandwidth, builds a cluster of --hosts hosts (one degraded by --slowdown), measures every
host's send and receive rate alone and all hosts sending at once around a ring, --repeats times,
and writes the medians of measured / expected payload rate to profiling/results/testbed_shaping.json
with the command line, the machine and the date. Needs root and iproute2.

    sudo python profiling/testbed_shaping.py --bandwidths 200Mbit,1Gbit,2Gbit --hosts 4 --repeats 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from stragglerkit.testbed.netns import EmulatedCluster
from stragglerkit.units import parse_bandwidth

RESULTS = Path(__file__).resolve().parent / "results" / "testbed_shaping.json"


def _machine() -> dict[str, object]:
    # The load average matters here: the shapers are exact, but a busy CPU slows the transfers.
    return {
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kernel": platform.release(),
        "load_average_1_5_15min": os.getloadavg(),
    }


def run(bandwidth_text: str, hosts: int, slowdown: float, repeats: int) -> dict[str, object]:
    bandwidth = parse_bandwidth(bandwidth_text)
    config = EmulatedCluster.Config(hosts=hosts, bandwidth=bandwidth, slowdowns={hosts - 1: slowdown}, verify=False)
    ratios: dict[str, list[float]] = {"send": [], "recv": [], "ring": []}
    worst = 0.0
    start = time.perf_counter()
    with EmulatedCluster(config) as cluster:
        congestion = cluster.run(
            0, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], capture_output=True, text=True
        ).stdout.strip()
        for _ in range(repeats):
            report = cluster.measure()
            for link in report.links:
                # first attempt only: the figure without the retries that verify() allows
                ratios[link.direction].append(link.attempts[0] / link.expected)
                worst = max(worst, abs(link.attempts[0] / link.expected - 1))
    return {
        "bandwidth": bandwidth_text,
        "bandwidth_Bps": bandwidth,
        "hosts": hosts,
        "degraded": {str(hosts - 1): slowdown},
        "tcp_congestion_control": congestion,
        "median_measured_over_expected": {d: statistics.median(r) for d, r in ratios.items()},
        "min_measured_over_expected": {d: min(r) for d, r in ratios.items()},
        "max_measured_over_expected": {d: max(r) for d, r in ratios.items()},
        "worst_first_attempt_relative_error": worst,
        "seconds": time.perf_counter() - start,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bandwidths", default="200Mbit,1Gbit,2Gbit")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--slowdown", type=float, default=2.0, help="slowdown l of the last host")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    ok, reason = EmulatedCluster.available()
    if not ok:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    rows = []
    for bandwidth in args.bandwidths.split(","):
        row = run(bandwidth, args.hosts, args.slowdown, args.repeats)
        rows.append(row)
        spans = [row[f"{k}_measured_over_expected"] for k in ("min", "median", "max")]
        text = "  ".join(
            f"{d} {'/'.join(f'{span[d]:.3f}' for span in spans)}"  # type: ignore[index]
            for d in ("send", "recv", "ring")
        )
        print(f"{bandwidth:>8}: measured/expected min/median/max  {text}")
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "note": "expected = configured rate * (mtu-52)/(mtu+14), the TCP payload share of each Ethernet frame",
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

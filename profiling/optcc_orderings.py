"""OptCC with one stage ordering (S1→S2→S3→S4) vs alternating it per segment with S3→S1→S4→S2.

Bandwidth only (alpha = 0), k = 64, one straggler, times in units of n (buffer / healthy NIC
bandwidth), against the paper's closed form (eq. (1)/(2)) and Theorem 6's bound.

    PYTHONPATH=$PWD python profiling/optcc_orderings.py

Writes profiling/results/optcc_orderings.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _meta import provenance

from stragglerkit.schedules.optcc import optcc
from stragglerkit.sim import optcc_bounds as ob
from stragglerkit.sim.simulator import Network, simulate

K = 64
CASES = [(p, slowdown) for p in (5, 8, 16, 32) for slowdown in (8 / 7, 1.5, 2.0, 3.0, 4.0)]


def _row(p: int, slowdown: float) -> dict[str, Any]:
    degraded = {p // 2: slowdown}
    net = Network.uniform(p, 0.0, 1.0, degraded)
    one, two = (simulate(optcc(p, degraded, segments=K, orderings=o), 1.0, net).makespan for o in (1, 2))
    closed = ob.optcc_single_time(p, slowdown, K)
    return {
        "p": p,
        "slowdown": slowdown,
        "one_ordering": one,
        "alternating": two,
        "alternating_over_one": two / one,
        "paper_closed_form": closed,
        "theorem6_bound": ob.theorem6_bound(p, slowdown),
        "one_over_closed_form": one / closed,
        "alternating_over_closed_form": two / closed,
    }


def main() -> None:
    rows = []
    for p, slowdown in CASES:
        row = _row(p, slowdown)
        rows.append(row)
        print(
            f"p={p} l={slowdown:.3g}: one {row['one_ordering']:.4f} alternating {row['alternating']:.4f} "
            f"(x{row['alternating_over_one']:.3f}) closed form {row['paper_closed_form']:.4f}",
            flush=True,
        )
    ratios = [r["alternating_over_one"] for r in rows]
    out = {
        **provenance(),
        "units": "times in n = buffer bytes / healthy NIC bandwidth; alpha = 0; k = 64; one straggler",
        "alternating_over_one_range": [round(min(ratios), 4), round(max(ratios), 4)],
        "rows": rows,
    }
    (Path(__file__).resolve().parent / "results" / "optcc_orderings.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""StragglAR's round schedule cut into pieces or kept whole: the experiment's runs side by side.

Every file in profiling/results/round_pieces/ is one ``stragglerkit bench`` run (8 ranks on the
emulated cluster, 32 MiB float32, straggler rank 7 with delay auto, gloo and StragglAR, median of
7 iterations; command, code version and environment in its header). File names say the link rate,
how StragglAR's chunks were cut and the batch. The variants:

* ``whole``: whole chunks (4.6 MiB), the default before and after the experiment;
* ``1MiB`` (and ``512KiB``, ``2MiB``): chunks cut into pieces of about that size, the round order
  kept piece by piece (piece j of a round waits for piece j of the previous round);
* ``1MiB_lookahead1``: 1 MiB pieces, piece j of a round waits for piece j + P - 2 of the previous
  one (at most one piece of overlap between rounds).

The pieces were set with temporary environment overrides (recorded in each header's
``environment``) that the code no longer has; ``1MiB`` is what the default was for one commit.
Prints, per link rate and variant, StragglAR's speedup over gloo from the straggler's arrival and
from the first arrival, run by run and the median, and writes summary.json beside the runs.

Example::

    python profiling/round_pieces_summary.py profiling/results/round_pieces
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def summarise(folder: Path) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        if path.name == "summary.json":
            continue
        data = json.loads(path.read_text())
        rows = {r["algorithm"]: r for r in data["rows"]}
        rate, _, rest = path.stem.partition("_")
        variant = rest.split("_batch")[0].split("_run")[0].split("_acceptance")[0]
        group = groups.setdefault(f"{rate} {variant}", {"from_straggler": [], "from_first": [], "runs": []})
        ours = rows["stragglar"]
        group["from_straggler"].append(round(ours["speedup_vs_gloo"], 4))
        group["from_first"].append(round(ours["speedup_from_first_vs_gloo"], 4))
        group["runs"].append(
            {
                "file": path.name,
                "command": data["header"]["command"],
                "environment": data["header"].get("environment", {}),
                "date": data["header"]["date"],
                "stragglar_ms": round(ours["time_s"] * 1e3, 2),
                "gloo_ms": round(rows["gloo"]["time_s"] * 1e3, 2),
                "cpu_busy": ours.get("cpu_busy"),
            }
        )
    for group in groups.values():
        group["median_from_straggler"] = statistics.median(group["from_straggler"])
        group["median_from_first"] = statistics.median(group["from_first"])
    return groups


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "profiling/results/round_pieces")
    groups = summarise(folder)
    for name, group in groups.items():
        runs = ", ".join(f"{v:.2f}x" for v in group["from_straggler"])
        print(
            f"{name:<28} from the straggler's arrival: {runs} (median {group['median_from_straggler']:.3f}x); "
            f"from the first: median {group['median_from_first']:.3f}x"
        )
    (folder / "summary.json").write_text(json.dumps(groups, indent=1))
    print(f"wrote {folder / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

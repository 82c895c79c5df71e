"""``stragglerkit bench``: how much faster is it on this cluster?

Runs the AllReduce algorithms (and the process group's own ``all_reduce``, the baseline) on real
ranks: under torchrun on real machines, or on the emulated cluster on this machine (one network
namespace per rank with a NIC shaped to a chosen bandwidth), or over loopback. Prints an
nccl-tests-style table with the model's prediction next to each measurement; see docs/bench.md.

Example::

    from stragglerkit.bench import BenchConfig, run
    rows = run(BenchConfig(world_size=4, sizes=[2**20], algorithms=["gloo", "ring"], mode="loopback"))
"""

from __future__ import annotations

import sys
from typing import Any

from stragglerkit.bench.config import BenchConfig, parse_algorithms, parse_degrade, parse_delay_option, parse_sizes
from stragglerkit.bench.launch import LaunchResult, detect_mode, launch
from stragglerkit.bench.results import header_record, plot_rows, print_table, rows_from_cases, write_json

__all__ = [
    "BenchConfig",
    "LaunchResult",
    "detect_mode",
    "parse_algorithms",
    "parse_degrade",
    "parse_delay_option",
    "parse_sizes",
    "run",
]


def run(
    config: BenchConfig,
    *,
    why: str = "",
    argv: list[str] | None = None,
    json_path: str | None = None,
    plot_path: str | None = None,
    out: Any = None,
) -> list[dict[str, Any]] | None:
    """Run the benchmark, print the table (to ``out``), write JSON/plot; the rows (None on torchrun ranks > 0)."""
    launched = launch(config, why)
    if not launched.is_reporter:
        return None
    rows = rows_from_cases(config, launched)
    header = header_record(config, launched, list(argv or []))
    print_table(rows, header, out=out)
    stream = out if out is not None else sys.stdout
    if json_path:
        write_json(json_path, header, rows)
        print(f"wrote {json_path}", file=stream)
    if plot_path and rows:
        plot_rows(rows, plot_path)
        print(f"wrote {plot_path}", file=stream)
    return rows

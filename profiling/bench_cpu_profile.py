"""Where the cores go during a bench case's timed iterations: a system-wide ``perf`` profile.

Runs ``stragglerkit bench`` with the given options under ``perf record -a`` (every process of the
machine: the ranks, their gloo threads, the kernel's networking and the shapers), finds the window
of the timed iterations from the bench's progress lines (``iteration 1/N`` to ``iteration N/N``, so
iterations 2..N), and reports which symbols the samples in that window fall in: their share of all
samples, idle included, and grouped (idle, kernel, torch's comparison ``cpu_equal``, torch's copy
kernels, gloo, stragglerkit's executor, Python).

Give one algorithm only (plus ``--no-fault-free-baseline`` with ``--degrade``), so that the window
holds that algorithm's iterations and no other's. Needs root (network namespaces) and ``perf``.

Example::

    python profiling/bench_cpu_profile.py --json profiling/results/bench_cpu_profile_optcc_l2.json -- \\
        --world-size 8 --bandwidth 1Gbit --sizes 32MiB --iters 15 --warmup 2 \\
        --algorithms optcc --degrade 3:2 --no-fault-free-baseline
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _env import write_result

FREQUENCY_HZ = 499
GROUPS: list[tuple[str, re.Pattern[str]]] = [
    ("idle", re.compile(r"pv_native_safe_halt|default_idle|cpu_idle|intel_idle|poll_idle|acpi_idle")),
    ("torch cpu_equal (the bench's check)", re.compile(r"cpu_equal")),
    ("torch copy kernels", re.compile(r"copy_kernel")),
    ("gloo", re.compile(r"gloo::")),
    ("stragglerkit executor", re.compile(r"stragglerkit::")),
    ("python interpreter", re.compile(r"^_?Py|PyEval")),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", required=True, help="write the profile here")
    parser.add_argument("--top", type=int, default=30, help="symbols to list (default 30)")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- then the options of stragglerkit bench")
    args = parser.parse_args()
    bench = [a for a in args.bench if a != "--"]
    if shutil.which("perf") is None:
        print("bench_cpu_profile: needs perf (linux-perf)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="stragglerkit-perf-") as tmp:
        data = Path(tmp) / "perf.data"
        bench_json = Path(tmp) / "bench.json"
        command = [
            "perf", "record", "-a", "-F", str(FREQUENCY_HZ), "-k", "CLOCK_MONOTONIC", "-o", str(data), "--",
            sys.executable, "-m", "stragglerkit.cli", "bench", *bench, "--json", str(bench_json),
        ]  # fmt: skip
        first: float | None = None
        last: float | None = None
        table: list[str] = []
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            now = time.monotonic()
            match = re.search(r"iteration (\d+)/(\d+)", line)
            if match and match.group(1) == "1":
                first = now
            elif match and match.group(1) == match.group(2):
                last = now
            elif re.match(r"^\s+\d", line) or line.startswith("# scenario"):
                table.append(line.rstrip())
            print(line, end="", file=sys.stderr)
        if process.wait() != 0:
            print(f"bench_cpu_profile: the bench failed (exit {process.returncode})", file=sys.stderr)
            return 1
        if first is None or last is None or last <= first:
            print("bench_cpu_profile: no window of timed iterations in the bench's output", file=sys.stderr)
            return 1
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--time", f"{first:.6f},{last:.6f}", "--no-children",
             "--sort", "sym", "--stdio", "-q"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        header = json.loads(bench_json.read_text())["header"]
    symbols: list[tuple[str, float]] = []
    for row in report.splitlines():
        match = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*)$", row)
        if match:
            symbols.append(
                (("kernel: " if match.group(2) == "k" else "") + match.group(3)[:160], float(match.group(1)))
            )
    groups: Counter[str] = Counter()
    for name, share in symbols:
        group = next((g for g, pattern in GROUPS if pattern.search(name)), None)
        if group is None:
            group = "kernel (other)" if name.startswith("kernel: ") else "other user code"
        groups[group] += share
    result: dict[str, Any] = {
        "bench_options": bench,
        "window_s": last - first,
        "sample_frequency_hz": FREQUENCY_HZ,
        "groups_percent_of_samples": {g: round(v, 2) for g, v in groups.most_common()},
        "top_symbols_percent_of_samples": [[name, share] for name, share in symbols[: args.top]],
        "bench_table": table,
    }
    write_result(args.json, header.get("cluster", {}), bench_header=header, **result)
    for group, share in groups.most_common():
        print(f"{share:6.2f}%  {group}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

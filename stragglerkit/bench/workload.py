"""Moved out of the installed package: training workloads are part of the repository's benchmarks."""

raise ImportError(
    "stragglerkit.bench.workload left the installed package: the Workload protocol is in the repository's "
    "benchmarks now, profiling/lab/workload.py (from the root of a checkout: import profiling.lab.workload; "
    "docs/bench.md)."
)

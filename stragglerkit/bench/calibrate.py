"""``stragglerkit bench --mode calibrate``: measure every algorithm on a grid, fit the cost models.

What it measures. Every algorithm of the registry (ring, rhd, direct, StragglAR, OptCC, the
balanced ring), through the real executor on real ranks, over a grid of

* testbeds: the emulated cluster (one network namespace per rank, its NIC shaped by ``tc``) at
  each of ``--bandwidths`` (default 250 Mbit/s, 1 Gbit/s, 2 Gbit/s), and loopback (unshaped:
  the kernel's TCP and the CPUs set the pace);
* world sizes (``--world-sizes``, default 4, 6, 8);
* buffer sizes (``--sizes``, default 4 KiB to 64 MiB, every factor of 4);
* scenarios (:data:`ALGORITHMS` names which algorithms run in each): no fault; the last rank a
  persistent straggler (its delay the others' StragglAR
  pre-phase time, measured per size, as ``--delay auto``); rank 1's NIC at ``1/--slowdown``
  (emulated cluster only: loopback has no NIC to degrade).

Each case runs ``--warmup`` untimed and ``--iters`` timed iterations (the allreduce bench's worker,
:mod:`stragglerkit.bench.worker`: every result compared with the exact sum; a wrong element stops
the run). A *sample* is one case: its median time from the last rank's arrival (the time the
cost models predict), the ranks' median arrival offsets, the scenario's straggler and slowdowns.
The samples are written after every cluster (``--samples``), so an interrupted run keeps what it
measured; ``--from-samples`` fits again without measuring.

What it reports. :func:`stragglerkit.detect.model_comparison.compare` fits each cost model per
network on a training part of the samples and reports its relative prediction error on the held
out part, per algorithm and overall, and the algorithm each model would choose in each measured
setting with what that choice measured (see that module).

Example::

    stragglerkit bench --mode calibrate --world-sizes 4 --bandwidths 1Gbit --sizes 64KiB,4MiB --iters 2
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stragglerkit.bench.config import BenchConfig, parse_sizes
from stragglerkit.bench.launch import launch, launch_emulated_together
from stragglerkit.bench.results import source_revision
from stragglerkit.units import format_bytes, parse_bandwidth

__all__ = ["CalibrateConfig", "measure", "run_calibrate", "samples_from_cases"]

SCENARIOS = ("none", "straggler", "degraded")
ALGORITHMS = {
    "none": ["ring", "rhd", "direct", "balanced_ring"],
    "straggler": ["ring", "rhd", "direct", "stragglar"],
    "degraded": ["ring", "rhd", "optcc", "balanced_ring"],
}
"""Per scenario: the baselines and the algorithms made for it (every algorithm of the registry is
measured somewhere; four per scenario keep the default grid near 40 minutes)."""
TESTBEDS = ("emulated", "loopback")


@dataclass(kw_only=True, slots=True)
class CalibrateConfig:
    """The grid one calibration run measures (defaults: the issue's ranges, about 40 minutes here)."""

    testbeds: list[str] = field(default_factory=lambda: list(TESTBEDS))
    """``emulated`` (shaped NICs, needs root and iproute2) and/or ``loopback``."""
    world_sizes: list[int] = field(default_factory=lambda: [4, 6, 8])
    bandwidths: list[float] = field(default_factory=lambda: [parse_bandwidth(b) for b in ("250Mbit", "1Gbit", "2Gbit")])
    """NIC rates of the emulated cluster, bytes/s (loopback is unshaped)."""
    sizes: list[int] = field(default_factory=lambda: parse_sizes("4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB"))
    scenarios: list[str] = field(default_factory=lambda: list(SCENARIOS))
    slowdown: float = 2.0
    """The degraded scenario: rank 1's NIC at 1/slowdown of the others' rate."""
    iters: int = 3
    warmup: int = 1
    timeout: float = 1800.0
    """Seconds the launcher waits for one group of ranks."""

    def __post_init__(self) -> None:
        bad = [t for t in self.testbeds if t not in TESTBEDS]
        if bad or not self.testbeds:
            raise ValueError(f"--testbeds must name some of {', '.join(TESTBEDS)}, got {self.testbeds!r}")
        odd = [n for n in self.world_sizes if n < 3 or n % 2]
        if odd or not self.world_sizes:
            raise ValueError(
                f"--world-sizes must be even numbers >= 4 (the straggler's delay is StragglAR's measured "
                f"pre-phase, which needs an even world), got {self.world_sizes!r}"
            )
        if not self.bandwidths or any(not b > 0 for b in self.bandwidths):
            raise ValueError("--bandwidths must be positive rates, e.g. 250Mbit,1Gbit,2Gbit")
        if not self.sizes or any(s <= 0 for s in self.sizes):
            raise ValueError("--sizes must be positive sizes, e.g. 4KiB..64MiB")
        bad = [s for s in self.scenarios if s not in SCENARIOS]
        if bad or not self.scenarios:
            raise ValueError(f"--scenarios must name some of {', '.join(SCENARIOS)}, got {self.scenarios!r}")
        if not self.slowdown > 1.0:
            raise ValueError(f"--slowdown must be > 1 (the degraded NIC runs at 1/slowdown), got {self.slowdown}")
        if self.iters < 1 or self.warmup < 0:
            raise ValueError(f"--iters must be >= 1 and --warmup >= 0, got {self.iters} and {self.warmup}")

    def bench_config(self, testbed: str, world_size: int, bandwidth: float | None, scenario: str) -> BenchConfig:
        """The allreduce bench's configuration for one (testbed, world size, rate, scenario)."""
        return BenchConfig(
            world_size=world_size,
            bandwidth=bandwidth,
            sizes=list(self.sizes),
            iters=self.iters,
            warmup=self.warmup,
            algorithms=list(ALGORITHMS[scenario]),
            straggler=world_size - 1 if scenario == "straggler" else None,
            degrade={1: self.slowdown} if scenario == "degraded" else {},
            mode=testbed,
            fault_free_baseline=False,
            timeout=self.timeout,
        )

    def clusters(self) -> list[tuple[str, int, float | None, list[str]]]:
        """(testbed, world size, rate, scenarios) of every cluster the run builds, in order."""
        out: list[tuple[str, int, float | None, list[str]]] = []
        for testbed in self.testbeds:
            rates: list[float | None] = list(self.bandwidths) if testbed == "emulated" else [None]
            scenarios = [s for s in self.scenarios if testbed == "emulated" or s != "degraded"]
            if not scenarios:
                continue
            for rate in rates:
                for n in self.world_sizes:
                    out.append((testbed, n, rate, scenarios))
        return out


def network_label(testbed: str, bandwidth: float | None) -> str:
    """``emulated 1 Gbit/s`` or ``loopback``: the network a sample was measured on (one fit each)."""
    if testbed != "emulated" or bandwidth is None:
        return testbed
    bits = bandwidth * 8
    return f"emulated {bits / 1e9:g} Gbit/s" if bits >= 1e9 else f"emulated {bits / 1e6:g} Mbit/s"


def samples_from_cases(
    cases: list[dict[str, Any]], testbed: str, bandwidth: float | None, alpha_ping: float | None
) -> list[dict[str, Any]]:
    """One sample per case (see the module docstring); raises when any iteration summed wrong."""
    samples = []
    for case in cases:
        if case["wrong"]:
            raise RuntimeError(
                f"{case['algorithm']} on {case['world_size']} ranks, {format_bytes(case['size_bytes'])} "
                f"({case['scenario']}): {case['wrong']} elements differ from the exact sum; not a sample"
            )
        arrivals, finishes = case["arrival"], case["finish"]
        from_last = [max(f) - max(a) for a, f in zip(arrivals, finishes, strict=True)]
        offsets = [[t - min(a) for t in a] for a in arrivals]
        n = case["world_size"]
        samples.append(
            {
                "network": network_label(testbed, bandwidth),
                "testbed": testbed,
                "bandwidth_Bps": bandwidth,
                "alpha_ping_s": alpha_ping,
                "algorithm": case["ran"],
                "world_size": n,
                "size_bytes": case["size_bytes"],
                "scenario": case["scenario"],
                "straggler": case["straggler"],
                "slowdowns": {str(k): v for k, v in case["slowdowns"].items()},
                "delay_s": case["delay_s"],
                "time_s": statistics.median(from_last),
                "times_s": [round(t, 7) for t in from_last],
                "arrivals_s": [round(statistics.median(o[r] for o in offsets), 7) for r in range(n)],
            }
        )
    return samples


def measure(
    config: CalibrateConfig, samples_path: Path, argv: list[str], out: Any = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Measure the grid; write the samples to ``samples_path`` after every cluster; return the
    file's header and the samples."""
    stream = out if out is not None else sys.stderr
    clusters = config.clusters()
    header = {
        "command": "stragglerkit bench " + " ".join(argv),
        "config": asdict(config),
        "source": source_revision(),
        "machine": {"cpus": os.cpu_count(), "platform": sys.platform},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    samples: list[dict[str, Any]] = []
    begin = time.monotonic()
    for index, (testbed, n, rate, scenarios) in enumerate(clusters):
        where = network_label(testbed, rate)
        elapsed = time.monotonic() - begin
        eta = "" if index == 0 else f", about {elapsed / index * (len(clusters) - index) / 60:.0f} min left"
        print(
            f"calibrate [{index + 1}/{len(clusters)}] {where}, {n} ranks: {', '.join(scenarios)} "
            f"x {len(config.sizes)} sizes{eta}",
            file=stream,
            flush=True,
        )
        configs = [config.bench_config(testbed, n, rate, s) for s in scenarios]
        if testbed == "emulated":
            with tempfile.TemporaryDirectory(prefix="stragglerkit-calibrate-") as tmp:
                launched = launch_emulated_together(configs, Path(tmp))
            samples.extend(samples_from_cases(launched.cases, testbed, rate, launched.alpha))
        else:
            for each in configs:
                launched = launch(each)
                samples.extend(samples_from_cases(launched.cases, testbed, rate, None))
        write_samples(samples_path, header, samples)
    print(f"calibrate: {len(samples)} samples in {(time.monotonic() - begin) / 60:.1f} min", file=stream)
    return header, samples


def write_samples(path: Path, header: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    """The samples as JSON (one sample per line inside the list, so that diffs stay readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = ",\n".join(json.dumps(s, separators=(",", ":")) for s in samples)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(f'{{"header": {json.dumps(header)},\n"samples": [\n{body}\n]}}\n', encoding="utf-8")
    os.replace(tmp, path)


def read_samples(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, samples) of a file :func:`write_samples` wrote; a clear error for anything else."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"--from-samples {path}: no such file (run stragglerkit bench --mode calibrate first)"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--from-samples {path}: not JSON ({err})") from None
    if not (isinstance(data, dict) and isinstance(data.get("samples"), list)):
        raise ValueError(f"--from-samples {path}: not a calibration samples file (no 'samples' list)")
    return data.get("header", {}), data["samples"]


def run_calibrate(
    config: CalibrateConfig | None,
    samples_path: Path,
    summary_path: Path | None,
    argv: list[str],
    out: Any = None,
) -> dict[str, Any]:
    """Measure (unless ``config`` is None: read ``samples_path``), fit and compare, print the table."""
    from stragglerkit.detect.model_comparison import compare, format_comparison

    stream = out if out is not None else sys.stdout
    if config is None:
        header, samples = read_samples(samples_path)
    else:
        header, samples = measure(config, samples_path, argv)
        print(f"wrote {samples_path}", file=stream)
    summary = compare(samples)
    summary["samples_file"] = str(samples_path)
    summary["measured"] = {k: header.get(k) for k in ("command", "source", "machine", "started")}
    summary["fitted_by"] = "stragglerkit bench " + " ".join(argv)
    print(format_comparison(summary), file=stream)
    if summary_path is not None:
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {summary_path}", file=stream)
    return summary


CALIBRATE_ONLY = (
    "--world-sizes",
    "--bandwidths",
    "--testbeds",
    "--scenarios",
    "--slowdown",
    "--samples",
    "--from-samples",
)
"""Options of ``--mode calibrate`` alone."""
_DEFAULT_SAMPLES = "calibration_samples.json"


def _list_of(parse: Any) -> Any:
    def run(text: str) -> list[Any]:
        return [parse(part.strip()) for part in text.split(",") if part.strip()]

    return run


def add_calibrate_arguments(bench: Any) -> None:
    """The ``--mode calibrate`` options of ``stragglerkit bench``."""
    from stragglerkit.bench.config import argument_type

    group = bench.add_argument_group(
        "--mode calibrate",
        "every algorithm on a grid of networks, world sizes, sizes and scenarios; then GenModel and the "
        "alpha-beta-gamma model fitted and compared on held-out samples (docs/bench.md)",
    )
    group.add_argument(
        "--world-sizes", type=argument_type(_list_of(int)), help="comma list of even world sizes (default 4,6,8)"
    )
    group.add_argument(
        "--bandwidths",
        type=argument_type(_list_of(parse_bandwidth)),
        help="comma list of emulated NIC rates (default 250Mbit,1Gbit,2Gbit)",
    )
    group.add_argument(
        "--testbeds", type=argument_type(_list_of(str)), help="comma list: emulated, loopback (default both)"
    )
    group.add_argument(
        "--scenarios", type=argument_type(_list_of(str)), help="comma list: none, straggler, degraded (default all)"
    )
    group.add_argument(
        "--slowdown", type=float, help="degraded scenario: rank 1's NIC at 1/SLOWDOWN of the rate (default 2)"
    )
    group.add_argument(
        "--samples",
        metavar="FILE",
        help=f"where the measured samples go (default {_DEFAULT_SAMPLES}; with --from-samples, read from)",
    )
    group.add_argument(
        "--from-samples",
        action="store_true",
        help="do not measure: fit and compare the models on the samples of --samples FILE",
    )


def cmd_calibrate(args: Any, argv: list[str]) -> int:
    """``stragglerkit bench --mode calibrate``: measure (or read) the samples, fit, compare, report."""
    from stragglerkit.bench.config import given_options

    wrong = given_options(argv, ("--algorithms", "--straggler", "--degrade", "--delay", "--dtype"))
    if wrong:
        raise ValueError(
            f"{', '.join(wrong)}: not for --mode calibrate, which measures its own grid of algorithms and "
            "scenarios (--world-sizes, --bandwidths, --testbeds, --scenarios, --slowdown, --sizes, --iters)"
        )
    samples_path = Path(args.samples or _DEFAULT_SAMPLES)
    summary_path = Path(args.json) if args.json else None
    if args.from_samples:
        measuring = given_options(argv, ("--world-sizes", "--bandwidths", "--testbeds", "--scenarios", "--sizes"))
        if measuring:
            raise ValueError(f"{', '.join(measuring)}: --from-samples measures nothing; leave them out")
        run_calibrate(None, samples_path, summary_path, list(argv))
        return 0
    given = given_options(argv, ("--sizes", "--iters", "--warmup", "--timeout"))
    chosen: dict[str, Any] = {
        name: getattr(args, name)
        for name in ("world_sizes", "bandwidths", "testbeds", "scenarios", "slowdown")
        if getattr(args, name) is not None
    }
    chosen.update({opt[2:]: getattr(args, opt[2:]) for opt in given})
    config = CalibrateConfig(**chosen)
    if "emulated" in config.testbeds:
        from stragglerkit.testbed import EmulatedCluster

        ok, reason = EmulatedCluster.available()
        if not ok:
            raise ValueError(
                f"the emulated cluster is not available here ({reason}); run as root with iproute2, or "
                "pass --testbeds loopback"
            )
    run_calibrate(config, samples_path, summary_path, list(argv))
    return 0

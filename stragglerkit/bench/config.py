"""What one ``stragglerkit bench`` run measures: :class:`BenchConfig` and its option parsers.

The configuration travels as JSON from the launcher to every rank (``to_json``/``from_json``), so
every field is a plain value. Validation happens here, before any rank starts, with messages that
say what to change.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Self

from stragglerkit.schedules.registry import names
from stragglerkit.units import parse_size, parse_time

__all__ = [
    "BASELINE",
    "DTYPES",
    "MODES",
    "BenchConfig",
    "JsonConfig",
    "argument_type",
    "check_setting",
    "check_slowdowns",
    "given_options",
    "parse_algorithms",
    "parse_degrade",
    "parse_delay_option",
    "parse_sizes",
    "scenario_of",
]

BASELINE = "gloo"
"""The process group's own ``all_reduce`` (gloo on CPU, NCCL on GPU): what every speedup is against."""
DTYPES = ("float32", "float64", "bfloat16", "float16", "int32", "int64")
MODES = ("emulated", "loopback", "torchrun", "horovodrun")
"""Where the ranks run; ``horovodrun``: this process is one of ``horovodrun``'s ranks (only the
fine-tuning bench runs that way: python -m profiling.lab.finetune, from a checkout)."""
_MAX_RANGE_STEPS = 40


def given_options(argv: Sequence[str], options: Sequence[str]) -> list[str]:
    """Which of ``options`` appear in ``argv``, as ``--opt`` or ``--opt=value``.

    Whole names only: the bench parser takes no abbreviations.

    Example::

        given_options(["--sizes=1MiB", "--iters", "3"], ("--sizes", "--world-sizes"))    # ["--sizes"]
    """
    found = []
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if name in options and name not in found:
            found.append(name)
    return found


def argument_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type``: its ``ValueError`` becomes argparse's usage error."""

    def run(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return run


def parse_sizes(text: str) -> list[int]:
    """``"1MiB..256MiB"`` (doubling), ``"32MiB"`` or ``"1MiB,4MiB,1000"`` -> sizes in bytes.

    Example::

        parse_sizes("1MiB..8MiB")   # [1048576, 2097152, 4194304, 8388608]
    """
    text = text.strip()
    if ".." in text:
        low_text, high_text = text.split("..", 1)
        low, high = parse_size(low_text), parse_size(high_text)
        if low <= 0 or high < low:
            raise ValueError(f"a size range LOW..HIGH needs 0 < LOW <= HIGH, got {text!r}")
        sizes = [low]
        while sizes[-1] * 2 <= high:
            sizes.append(sizes[-1] * 2)
            if len(sizes) > _MAX_RANGE_STEPS:
                raise ValueError(f"size range {text!r} has more than {_MAX_RANGE_STEPS} steps")
        return sizes
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError("--sizes needs at least one size, e.g. 32MiB, 1MiB..256MiB or 1MiB,4MiB")
    bad = [s for s in sizes if s <= 0]
    if bad:
        raise ValueError(f"sizes must be positive byte counts, got {bad[0]}")
    return sizes


def parse_algorithms(text: str) -> list[str]:
    """``"gloo,ring,stragglar"`` -> the list, checked against the registry (plus gloo and auto)."""
    chosen = [a.strip() for a in text.split(",") if a.strip()]
    known = [BASELINE, *names(), "auto"]
    unknown = [a for a in chosen if a not in known]
    if unknown or not chosen:
        raise ValueError(f"unknown algorithm(s) {unknown or text!r}; choose from {', '.join(known)}")
    return list(dict.fromkeys(chosen))


def parse_degrade(text: str) -> tuple[int, float]:
    """``"3:2"`` -> (3, 2.0): rank 3's NIC at 1/2 of the bandwidth; ``"3:8/7"`` is allowed too."""
    try:
        rank_text, slow_text = text.split(":")
        rank = int(rank_text)
        if "/" in slow_text:
            top, bottom = slow_text.split("/")
            slowdown = float(top) / float(bottom)
        else:
            slowdown = float(slow_text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"--degrade takes RANK:L (e.g. 3:2 = rank 3's NIC at half bandwidth), got {text!r}") from None
    if not (slowdown >= 1.0 and math.isfinite(slowdown)):
        raise ValueError(f"--degrade slowdown L must be a finite number >= 1 (1/L of the bandwidth), got {text!r}")
    return rank, slowdown


def parse_delay_option(text: str) -> float | None:
    """``"auto"`` -> None (measured in the run); ``"50"`` -> 0.05 (plain numbers are ms); ``"2ms"``."""
    text = text.strip()
    if text == "auto":
        return None
    try:
        seconds = float(text) / 1e3
    except ValueError:
        seconds = parse_time(text)
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"--delay must be 'auto' or a time >= 0 (e.g. 50 = 50 ms, 2ms), got {text!r}")
    return seconds


def scenario_of(straggler: int | None, degrade: dict[int, float]) -> str:
    """The fault scenario of a run: ``straggler``, ``degraded`` or ``none``."""
    if straggler is not None:
        return "straggler"
    return "degraded" if degrade else "none"


def check_slowdowns(option: str, slowdowns: dict[int, float], world_size: int) -> None:
    """Every rank of ``slowdowns`` (rank -> l) is one of the world's and every l a finite number >= 1."""
    bad = [r for r in slowdowns if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"{option} names rank {bad[0]}, which is not a rank of 0..{world_size - 1}")
    slow = [r for r, slowdown in slowdowns.items() if not (slowdown >= 1.0 and math.isfinite(slowdown))]
    if slow:
        raise ValueError(f"{option} slowdown of rank {slow[0]} must be a finite number >= 1")


def check_setting(
    world_size: int,
    mode: str,
    bandwidth: float | None,
    straggler: int | None,
    delay: float | None,
    degrade: dict[int, float],
) -> None:
    """The checks both benches (:class:`BenchConfig`, the training bench's ``TrainConfig`` in profiling/lab)
    make: the ranks, the mode, the NIC rate, and one fault scenario on ranks of the world."""
    n = world_size
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"--world-size must be an integer >= 2, got {n!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if bandwidth is not None and not (bandwidth > 0 and math.isfinite(bandwidth)):
        raise ValueError(f"--bandwidth must be a positive rate like 1Gbit, got {bandwidth!r}")
    if straggler is not None and not 0 <= straggler < n:
        raise ValueError(f"--straggler {straggler} is not a rank of 0..{n - 1} (--world-size {n})")
    if straggler is None and delay is not None:
        raise ValueError("--delay needs --straggler RANK (which rank is late)")
    check_slowdowns("--degrade", degrade, n)
    if straggler is not None and degrade:
        raise ValueError("give either --straggler or --degrade in one run, not both (one scenario per run)")


class JsonConfig:
    """To and from JSON, for the launcher to hand a configuration to its ranks; the fields named
    in ``RANK_KEYED`` are dicts keyed by rank (JSON turns their keys into strings)."""

    __slots__ = ()

    RANK_KEYED: ClassVar[tuple[str, ...]] = ("degrade",)

    def to_json(self) -> str:
        return json.dumps(asdict(self))  # type: ignore[call-overload]

    @classmethod
    def from_json(cls, text: str) -> Self:
        data: dict[str, Any] = json.loads(text)
        for name in cls.RANK_KEYED:
            data[name] = {int(k): v for k, v in data.get(name, {}).items()}
        return cls(**data)


@dataclass(kw_only=True, slots=True)
class BenchConfig(JsonConfig):
    """One benchmark: which algorithms, on which buffers, in which fault scenario."""

    world_size: int = 8
    """Number of ranks (one per emulated host); under torchrun, WORLD_SIZE."""
    bandwidth: float | None = 125e6
    """NIC rate in bytes/s (whole frames). Shapes the emulated hosts; elsewhere only for the model."""
    sizes: list[int] = field(default_factory=lambda: parse_sizes("1MiB..32MiB"))
    """Buffer sizes in bytes."""
    dtype: str = "float32"
    """Element type of the buffer."""
    iters: int = 5
    """Timed iterations per (size, algorithm); the table shows their median."""
    warmup: int = 2
    """Untimed iterations per (size, algorithm) first (plans built, connections warm)."""
    algorithms: list[str] = field(default_factory=lambda: [BASELINE, "ring", "rhd", "stragglar", "optcc"])
    """Algorithms to run; ``gloo`` is the group's own all_reduce, ``auto`` lets the runtime choose."""
    straggler: int | None = None
    """Rank that enters every AllReduce late (persistent straggler scenario)."""
    delay: float | None = None
    """The straggler's delay in seconds; None = auto (the others' measured pre-phase time)."""
    degrade: dict[int, float] = field(default_factory=dict)
    """Degraded ranks: rank -> l (its NIC at bandwidth / l)."""
    mode: str = "emulated"
    """``emulated`` (namespaces with shaped NICs), ``loopback`` or ``torchrun``."""
    alpha: float | None = None
    """Per-message latency for the model; None = measured (emulated) or 50 us."""
    tcp_send_buffer: int | None = None
    """Emulated cluster: every host's largest TCP send buffer in bytes (EmulatedCluster.Config);
    None keeps the kernel's."""
    tcp_congestion_control: str | None = None
    """Emulated cluster: every host's TCP congestion control (EmulatedCluster.Config); None keeps
    what new namespaces inherit from this machine."""
    tcp_slow_start_after_idle: bool | None = None
    """Emulated cluster: whether idle TCP connections restart from a small window
    (EmulatedCluster.Config); None keeps the kernel's."""
    fair_queueing: bool = False
    """Emulated cluster: one queue per peer on every link, served in turn (EmulatedCluster.Config);
    False: one FIFO per link direction."""
    fault_free_baseline: bool = True
    """With --degrade on the emulated cluster, also run gloo with every NIC healthy."""
    timeout: float = 600.0
    """Seconds the launcher waits for one group of ranks."""

    def __post_init__(self) -> None:
        self.degrade = {int(k): float(v) for k, v in self.degrade.items()}
        self.validate()

    def validate(self) -> None:
        n = self.world_size
        check_setting(n, self.mode, self.bandwidth, self.straggler, self.delay, self.degrade)
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        if self.iters < 1:
            raise ValueError(f"--iters must be >= 1, got {self.iters}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if not self.sizes or any(s <= 0 for s in self.sizes):
            raise ValueError("--sizes must name positive sizes, e.g. 32MiB or 1MiB..256MiB")
        parse_algorithms(",".join(self.algorithms))
        if self.straggler is not None and self.delay is None and n % 2:
            raise ValueError(
                f"--delay auto times StragglAR's pre-phase, which needs an even world size (got {n}); "
                "give --delay MS instead"
            )
        if self.degrade and self.mode == "loopback":
            raise ValueError(
                "--degrade reshapes a host's NIC, which needs the emulated cluster (root and iproute2); "
                "over loopback there is no NIC to degrade"
            )
        if self.tcp_send_buffer is not None:
            if self.mode != "emulated":
                raise ValueError(
                    "--tcp-send-buffer sets the emulated hosts' TCP send buffer; it needs the emulated cluster "
                    f"(root and iproute2), not {self.mode}"
                )
            if self.tcp_send_buffer < 8192:
                raise ValueError(f"--tcp-send-buffer must be at least 8KiB, got {self.tcp_send_buffer} bytes")
        if self.tcp_congestion_control is not None and self.mode != "emulated":
            raise ValueError(
                "--tcp-congestion-control sets the emulated hosts' TCP congestion control; it needs the emulated "
                f"cluster (root and iproute2), not {self.mode}"
            )
        if self.tcp_slow_start_after_idle is not None and self.mode != "emulated":
            raise ValueError(
                "--tcp-slow-start-after-idle sets the emulated hosts' TCP; it needs the emulated cluster "
                f"(root and iproute2), not {self.mode}"
            )
        if self.fair_queueing and self.mode != "emulated":
            raise ValueError(
                "--fair-queueing gives the emulated links one queue per peer; it needs the emulated cluster "
                f"(root and iproute2), not {self.mode}"
            )
        if self.alpha is not None and not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0 seconds, got {self.alpha!r}")

    @property
    def scenario(self) -> str:
        """``straggler``, ``degraded`` or ``none``."""
        return scenario_of(self.straggler, self.degrade)

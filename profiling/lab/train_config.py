"""What one training bench run (``python -m profiling.lab.train``) does: :class:`TrainConfig` and its option parsers.

The configuration travels as JSON from the launcher to every rank (``to_json``/``from_json``), so
every field is a plain value. Validation happens here, before any rank starts, with messages that
say what to change (the command line turns them into exit status 2).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from stragglerkit.bench.config import JsonConfig, check_setting, check_slowdowns, scenario_of
from stragglerkit.config import CLEAR_DEGRADED
from stragglerkit.schedules.registry import Situation, why_not
from stragglerkit.units import parse_time

__all__ = ["COPIES", "DEFAULT_BATCH", "FRAMEWORKS", "SLOWDOWNS", "TrainConfig", "parse_jitter"]

FRAMEWORKS = ("ddp", "horovod", "megatron")
"""What ``--framework`` trains with: the plain framework against it with stragglerkit."""
COPIES = ("plain", "control", "hooked")
"""The copies of the model: the plain framework; ``control``, a second plain copy, identical to the
first (the A/A control: how far two copies of the same thing land apart in one launch is the noise
any comparison here must beat); the framework with stragglerkit."""
DEFAULT_BATCH = {"ddp": 16, "horovod": 16, "megatron": 1}
"""Samples per rank and step when ``batch`` is 0: 16 rows of the MLP; 1 sequence of the GPT
(:mod:`profiling.lab.train_megatron` says why so few)."""
SLOWDOWNS = ("sleep", "backward")
"""How the straggler is late: ``sleep``, its whole delay between forward and backward; ``backward``,
the delay spread over its backward pass as on a throttled GPU
(:class:`profiling.lab.workload.ComputeSlowdown`)."""

_MIN_MODEL_BYTES = 64 * 1024
_MAX_MODEL_BYTES = 2**30


def parse_jitter(text: str) -> float:
    """``"20"`` -> 0.02 (plain numbers are ms); ``"5ms"`` -> 0.005: the most a rank is late per step.

    Example::

        parse_jitter("20")    # 0.02
    """
    text = text.strip()
    try:
        seconds = float(text) / 1e3
    except ValueError:
        try:
            seconds = parse_time(text)
        except ValueError:
            raise ValueError(f"--jitter takes a time >= 0 (e.g. 20 = 20 ms, 5ms), got {text!r}") from None
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"--jitter takes a time >= 0 (e.g. 20 = 20 ms, 5ms), got {text!r}")
    return seconds


@dataclass(kw_only=True, slots=True)
class TrainConfig(JsonConfig):
    """A short training, with the plain framework and with stragglerkit, in one fault scenario.

    Example::

        config = TrainConfig(world_size=4, mode="loopback", steps=40, straggler=3, delay=0.03, from_step=2)
    """

    world_size: int = 8
    """Number of ranks (one per emulated host); under torchrun, WORLD_SIZE."""
    bandwidth: float | None = 125e6
    """NIC rate in bytes/s (whole frames): shapes the emulated hosts; elsewhere only recorded."""
    mode: str = "emulated"
    """``emulated`` (namespaces with shaped NICs), ``loopback``, ``torchrun``, or ``horovodrun`` (a workload
    under ``horovodrun``, :mod:`profiling.lab.finetune`)."""
    framework: str = "ddp"
    """``ddp``: plain DDP against DDP with ``stragglerkit.ddp_hook``; ``horovod``:
    ``hvd.DistributedOptimizer`` against ``stragglerkit.straggler_aware``, the ranks started as
    ``horovodrun --gloo`` starts them (emulated cluster or loopback); ``megatron``: a small GPT on
    megatron-core, its ``DistributedDataParallel`` plain against it with
    ``stragglerkit.megatron.install`` (:mod:`profiling.lab.train_megatron`)."""
    steps: int = 120
    """Training steps; each step runs plain DDP and the hooked DDP once."""
    straggler: int | None = None
    """Rank that sleeps ``delay`` before its backward (its AllReduce) every step from ``from_step``."""
    delay: float | None = None
    """The straggler's delay in seconds; None = auto: ``auto_delay_scale`` x StragglAR's pre-phase time."""
    auto_delay_scale: float = 2.0
    """With ``delay=None``: the delay is this times the punctual ranks' measured pre-phase time."""
    moves: list[tuple[int, int]] = field(default_factory=list)
    """``(step, rank)``: from that step on, that rank is the straggler instead (ascending steps)."""
    degrade: dict[int, float] = field(default_factory=dict)
    """Degraded ranks, rank -> l: from ``from_step`` their emulated NIC runs at bandwidth / l."""
    jitter: float = 0.0
    """Every rank sleeps uniform[0, jitter] seconds before its backward each step from ``from_step``."""
    from_step: int = 0
    """First step with the fault (straggler, degraded NICs, jitter)."""
    reshape_at: int | None = None
    """With ``degrade``: at this step the NICs change again, to ``reshape_to`` (``--reshape-at``), or
    back to the full bandwidth when that is empty (``--recover-at``)."""
    reshape_to: dict[int, float] = field(default_factory=dict)
    """rank -> l from ``reshape_at`` on (l = 1: full bandwidth); empty: every degraded rank recovers."""
    seed: int = 0
    """Seeds the model, the data and the jitter (every rank computes the same figures)."""
    model_bytes: int = 8 * 2**20
    """Gradient size of the model (float32); the MLP's hidden width, or the GPT's hidden size, is
    chosen to match."""
    batch: int = 0
    """Samples per rank and step (GPT: sequences, one micro-batch); 0 = the framework's default,
    :data:`DEFAULT_BATCH` (set when the config is made, so the JSON holds the number)."""
    hook_warmup: int | None = None
    """The hook's warm-up steps (Config.detection.warmup_steps); None = its default."""
    degraded_threshold: float | None = None
    """The hook's NIC-health threshold (DetectorConfig.degraded_threshold; its clear threshold
    becomes the midpoint between 1 and it); None = the default 1.5. Below 1.5 the detector also
    acts on a NIC near full rate, where the balanced ring is the plan."""
    lr: float = 0.01
    """SGD learning rate of both models."""
    gradient_as_bucket_view: bool = True
    """Both DDP copies with ``gradient_as_bucket_view=True`` and gradients zeroed in place
    (``zero_grad(set_to_none=False)``), so that they stay views of DDP's buckets. Without a hook DDP
    divides each gradient while copying it into its bucket; with any comm hook it only copies and the
    hook divides in a pass of its own. With bucket views there is no copy, and DDP without a hook
    divides in a pass too: the two copies do the same work apart from the hook (docs/detection.md)."""
    steps_per_block: int = 10
    """The two copies take turns in blocks of this many steps (the order alternating from block to
    block). The ranks meet at a barrier only when a block starts; within a block they run free, as
    in training, where no barrier lines the ranks up before each step. 1 = lockstep: a barrier
    before every step, so every step starts with all ranks together (the figures of the runs before
    this option)."""
    timeout: float = 600.0
    """Seconds the launcher waits for the ranks."""
    workload: str | None = None
    """``FILE.py:FACTORY`` or ``module:FACTORY``: the model, data, loss, optimizer and held-out
    evaluation to train instead of the MLP (:mod:`profiling.lab.workload`); ``None``: the MLP
    (or the GPT with ``framework="megatron"``). ``model_bytes`` and ``lr`` are then not used. With
    ``framework="megatron"`` it must be a :class:`~profiling.lab.workload.MegatronWorkload`."""
    workload_options: dict[str, Any] = field(default_factory=dict)
    """Given to the workload's factory on every rank (plain JSON values)."""
    slowdown: str = "sleep"
    """Where the straggler's delay goes: ``sleep`` (before its backward) or ``backward`` (spread
    over its backward, as on a throttled GPU; :data:`SLOWDOWNS`)."""
    target_loss: float | None = None
    """A loss to reach: the summary then says when each copy reached it (``profiling.lab.finetune``)."""
    copies: list[str] = field(default_factory=lambda: list(COPIES))
    """Which copies each rank trains: all three (the side-by-side comparison with its A/A control),
    ``plain`` and ``hooked`` (the comparison without a control, ``--no-control``), or only ``plain``
    or only ``hooked`` (``--stragglerkit off|on`` of the fine-tuning examples: one model in memory,
    as a user's real run has; no comparison is made)."""
    event_log: str | None = None
    """A folder: the hooked copy's loop writes ``events.rank{rank}.jsonl`` there on every rank
    (docs/event_log.md), for ``stragglerkit report FOLDER``; ``None``: no event log."""

    RANK_KEYED: ClassVar[tuple[str, ...]] = ("degrade", "reshape_to")

    def __post_init__(self) -> None:
        if self.batch == 0 and self.framework in DEFAULT_BATCH:
            self.batch = DEFAULT_BATCH[self.framework]
        self.degrade = {int(k): float(v) for k, v in self.degrade.items()}
        self.moves = [(int(s), int(r)) for s, r in self.moves]
        self.validate()

    def validate(self) -> None:
        check_setting(self.world_size, self.mode, self.bandwidth, self.straggler, self.delay, self.degrade)
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"--framework must be one of {', '.join(FRAMEWORKS)}, got {self.framework!r}")
        if self.slowdown not in SLOWDOWNS:
            raise ValueError(f"slowdown must be one of {', '.join(SLOWDOWNS)}, got {self.slowdown!r}")
        if self.target_loss is not None and not math.isfinite(self.target_loss):
            raise ValueError(f"--target-loss must be a finite number, got {self.target_loss!r}")
        if self.mode == "horovodrun" and self.framework != "horovod":
            raise ValueError("under horovodrun use --framework horovod (torchrun starts the DDP ranks)")
        if self.framework == "horovod" and self.mode == "torchrun":
            raise ValueError(
                "--framework horovod starts its own Horovod ranks (on the emulated cluster or over loopback); "
                "under torchrun use --framework ddp"
            )
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"--steps must be an integer >= 1, got {self.steps!r}")
        if not _MIN_MODEL_BYTES <= self.model_bytes <= _MAX_MODEL_BYTES:
            raise ValueError(f"--model-size must be between 64KiB and 1GiB of gradients, got {self.model_bytes} bytes")
        if not isinstance(self.steps_per_block, int) or self.steps_per_block < 1:
            raise ValueError(f"--steps-per-block must be an integer >= 1 (1 = lockstep), got {self.steps_per_block!r}")
        if not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"--batch must be an integer >= 1, got {self.batch!r}")
        if self.hook_warmup is not None and self.hook_warmup < 0:
            raise ValueError(f"--hook-warmup must be >= 0 steps, got {self.hook_warmup}")
        if self.degraded_threshold is not None and not (1.0 < self.degraded_threshold < math.inf):
            raise ValueError(f"--degraded-threshold must be a slowdown l above 1, got {self.degraded_threshold}")
        if self.degraded_threshold is not None and self.framework != "ddp" and self.degraded_threshold < CLEAR_DEGRADED:
            raise ValueError(
                f"--framework {self.framework} gives --degraded-threshold to stragglerkit.Config's "
                f"detection.degraded_threshold, which must be at least {CLEAR_DEGRADED} (below it a NIC counts as "
                f"recovered), got {self.degraded_threshold}"
            )
        if not self.copies or len(set(self.copies)) != len(self.copies) or not set(self.copies) <= set(COPIES):
            raise ValueError(f"copies must be some of {', '.join(COPIES)}, each once; got {self.copies!r}")
        self.copies = [name for name in COPIES if name in self.copies]
        if "control" in self.copies and not self.compared:
            raise ValueError("the control copy controls a comparison: train it with both plain and hooked")
        if not self.compared and self.framework == "megatron":
            raise ValueError(
                "--framework megatron trains plain and hooked side by side; one copy alone is for ddp or horovod"
            )
        if self.event_log is not None and not (isinstance(self.event_log, str) and self.event_log):
            raise ValueError(f"--event-log takes a folder, got {self.event_log!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        self._validate_faults()

    def _validate_faults(self) -> None:
        n = self.world_size
        if self.delay is not None and not (self.delay >= 0 and math.isfinite(self.delay)):
            raise ValueError(f"--delay must be a time >= 0, got {self.delay!r}")
        if not (self.auto_delay_scale > 0 and math.isfinite(self.auto_delay_scale)):
            raise ValueError(f"auto_delay_scale must be a positive number, got {self.auto_delay_scale!r}")
        if self.moves and self.straggler is None:
            raise ValueError("--move-straggler-at needs --straggler RANK (the rank that is late first)")
        previous_step, previous_rank = self.from_step, self.straggler
        for step, rank in self.moves:
            if not 0 <= rank < n:
                raise ValueError(f"--move-straggler-at {step} {rank}: {rank} is not a rank of 0..{n - 1}")
            if step <= previous_step or step >= self.steps:
                raise ValueError(
                    f"--move-straggler-at {step} {rank}: the step must come after --from-step {self.from_step} "
                    f"and the previous move, and before --steps {self.steps}"
                )
            if rank == previous_rank:
                raise ValueError(f"--move-straggler-at {step} {rank}: rank {rank} is already the straggler then")
            previous_step, previous_rank = step, rank
        if self.degrade and self.mode != "emulated":
            where = "over loopback there is no NIC" if self.mode == "loopback" else "under torchrun nothing is"
            raise ValueError(
                f"--degrade reshapes a host's NIC during the run, which needs the emulated cluster (root and "
                f"iproute2); {where} to reshape (on real machines the hook finds a slow NIC by itself)"
            )
        option = "--reshape-at" if self.reshape_to else "--recover-at"
        if self.reshape_to and self.reshape_at is None:
            raise ValueError(
                "reshape_to needs reshape_at: the step at which the NICs change (--reshape-at STEP RANK:L)"
            )
        if self.reshape_at is not None:
            if not self.degrade:
                raise ValueError(f"{option} changes degraded NICs during the run: give --degrade RANK:L with it")
            if not isinstance(self.reshape_at, int) or not self.from_step < self.reshape_at < self.steps:
                raise ValueError(
                    f"{option} {self.reshape_at} must come after --from-step {self.from_step} and before "
                    f"--steps {self.steps}"
                )
            check_slowdowns("--reshape-at", self.reshape_to, n)
        if not (self.jitter >= 0 and math.isfinite(self.jitter)):
            raise ValueError(f"--jitter must be a time >= 0, got {self.jitter!r}")
        if not isinstance(self.from_step, int) or self.from_step < 0:
            raise ValueError(f"--from-step must be an integer >= 0, got {self.from_step!r}")
        if self.scenario == "none" and self.from_step:
            raise ValueError("--from-step says when a fault starts: give --straggler, --degrade or --jitter with it")
        if self.scenario != "none" and self.from_step >= self.steps:
            raise ValueError(f"--from-step {self.from_step} must be below --steps {self.steps} (no fault would run)")
        if self.straggler is not None and self.delay is None:
            reason = why_not("stragglar", Situation(world_size=n, straggler=self.straggler))
            if reason is not None:
                raise ValueError(
                    f"--delay auto times StragglAR's pre-phase, which does not apply here (it {reason}); "
                    "give --delay MS instead"
                )

    @property
    def scenario(self) -> str:
        """``straggler``, ``degraded``, ``jitter`` (jitter alone) or ``none``."""
        scenario = scenario_of(self.straggler, self.degrade)
        return "jitter" if scenario == "none" and self.jitter > 0 else scenario

    @property
    def compared(self) -> bool:
        """Whether the run compares: it trains both the plain and the hooked copy."""
        return {"plain", "hooked"} <= set(self.copies)

    @property
    def reshaped(self) -> dict[int, float]:
        """What the second link change (at ``reshape_at``) sets: ``reshape_to``, or every degraded
        rank back to l = 1 (``--recover-at``)."""
        return dict(self.reshape_to) or dict.fromkeys(self.degrade, 1.0)

    def late_rank(self, step: int) -> int | None:
        """The straggler at ``step`` (None before ``from_step`` or without one)."""
        if self.straggler is None or step < self.from_step:
            return None
        rank = self.straggler
        for move_step, move_rank in self.moves:
            if step >= move_step:
                rank = move_rank
        return rank

    def blocks(self) -> list[range]:
        """The steps of each block, in order: every ``steps_per_block`` steps, and a block also
        starts where the links change (``from_step`` with ``degrade``, ``reshape_at``), so that both
        copies train every step on the same links.

        Example::

            TrainConfig(steps=25, steps_per_block=10).blocks()    # [range(0, 10), range(10, 20), range(20, 25)]
        """
        starts = set(range(0, self.steps, self.steps_per_block))
        if self.degrade:
            starts.add(self.from_step)
        if self.reshape_at is not None:
            starts.add(self.reshape_at)
        ordered = [*sorted(starts), self.steps]
        return [range(first, stop) for first, stop in itertools.pairwise(ordered)]

"""The pieces of one copy of the model that a rank of the training bench trains (:mod:`.train_worker`).

The bench's own model (an MLP 256-H-H-16 on random batches, :func:`build_model`, :func:`batch_generator`),
:class:`Run` (one copy: the module, its optimizer, this rank's step times; the framework's way of
waiting for the reduced gradients), the stragglerkit settings of the hooked copy
(:func:`hook_settings`), the launcher's link-change protocol (:func:`control_files`) and the
one-line description of a loop event (:func:`describe_event`).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from profiling.lab.train_config import TrainConfig
from profiling.lab.workload import ComputeSlowdown, Workload
from stragglerkit.config import Config
from stragglerkit.loop.loop import StragglerLoop
from stragglerkit.testbed.inject import sleep_precisely

__all__ = [
    "INPUTS",
    "OUTPUTS",
    "RESHAPE",
    "RESHAPE_AGAIN",
    "Run",
    "batch_generator",
    "build_model",
    "control_files",
    "describe_event",
    "hidden_width",
    "hook_settings",
    "loop_of",
    "mlp_batch",
    "nothing",
    "to_device",
    "turns",
    "with_event_log",
]

T = TypeVar("T")

INPUTS, OUTPUTS = 256, 16
RESHAPE, RESHAPE_AGAIN = "reshape", "reshape-again"
"""The launcher's two link changes: degrade the NICs (at ``from_step``), change them again
(``reshape_at``: restore them, or to ``reshape_to``)."""


def control_files(phase: str) -> tuple[str, str, str]:
    """The control folder's file names of one link change: (request, done, failed)."""
    return f"{phase}.request", f"{phase}.done", f"{phase}.failed"


def hidden_width(model_bytes: int) -> int:
    """Hidden width H of the MLP 256 -> H -> H -> 16 whose float32 gradient is about ``model_bytes``.

    Example::

        hidden_width(8 * 2**20)    # 1320: 2.1M parameters
    """
    numel = model_bytes / 4  # H^2 + (256 + 16 + 2) H + 16 parameters
    b = INPUTS + OUTPUTS + 2
    width = (-b + math.sqrt(b * b + 4 * max(numel - OUTPUTS, 1))) / 2
    return max(8, round(width / 8) * 8)


def build_model(config: TrainConfig) -> nn.Module:
    """The MLP of the run, initialised from ``config.seed`` (the same on every rank and for both runs)."""
    width = hidden_width(config.model_bytes)
    torch.manual_seed(config.seed)
    return nn.Sequential(
        nn.Linear(INPUTS, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, OUTPUTS)
    )


def batch_generator(config: TrainConfig, step: int, rank: int) -> torch.Generator:
    """The generator of ``rank``'s batch at ``step``: the same for both copies, another for every rank and step."""
    return torch.Generator().manual_seed(config.seed * 1_000_003 + step * 1009 + rank)


def mlp_batch(config: TrainConfig, step: int, rank: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = batch_generator(config, step, rank)
    x, y = torch.randn(config.batch, INPUTS, generator=g), torch.randn(config.batch, OUTPUTS, generator=g)
    return x.to(device), y.to(device)


class Run:
    """One of the two models: the module, its optimizer, and this rank's step times.

    Under DDP the AllReduce runs inside ``backward()``; under Horovod the backward starts it and the
    optimizer's ``synchronize()`` waits for it, so :meth:`backward` includes that wait and
    :meth:`step` skips the synchronisation, as a Horovod script that clips gradients does.
    megatron-core's GPT: :class:`profiling.lab.train_megatron.MegatronRun`."""

    def __init__(self, name: str, model: nn.Module, opt: Any, framework: str, views: bool) -> None:
        self.name = name
        self.model = model
        self.opt = opt
        self.framework = framework
        self.views = views
        self.times: list[float] = []
        """Per step: this rank's own step time (from the end of its previous step in the block, or the barrier)."""
        self.ends: list[float] = []
        """Per step: when this rank finished it, in seconds from the barrier that started the block."""
        self.backward_s: list[float] = []
        self.losses: list[float] = []
        self.cpu: list[list[int] | None] = []
        """Per step: [busy, total] CPU ticks of this rank's host during the step (None: not measured)."""
        self.slowdown: ComputeSlowdown | None = None
        """With ``TrainConfig.slowdown="backward"``: spreads the straggler's delay over the backward."""
        self.workload: Workload | None = None
        """The workload whose loss this copy trains on (None: the MLP's mean squared error)."""

    def zero_grad(self) -> None:
        if self.framework == "ddp":
            # gradients set to None would be new tensors that DDP copies into its buckets again
            self.opt.zero_grad(set_to_none=not self.views)
        else:
            self.opt.zero_grad()

    @property
    def example_step(self) -> Callable[[nn.Module, Any, Any], float] | None:
        """The workload's own training step (the examples' ``train_step``: zero the gradients, loss,
        backward, update), which the copy then runs whole; None: the bench's step, in parts (also
        under megatron-core, whose schedule runs the step of the workload's megatron model)."""
        if self.workload is None or self.framework == "megatron":
            return None
        step: Callable[[nn.Module, Any, Any], float] | None = getattr(self.workload, "train_step", None)
        return step

    def forward_backward(self, batch: Any, late: float) -> tuple[torch.Tensor, float]:
        """Forward, ``late`` seconds of sleep, backward until the gradients are reduced; the loss and
        when the sleep ended (``time.perf_counter()``)."""
        if self.workload is not None:
            loss = self.workload.loss(self.model, batch)
        else:
            x, y = batch
            loss = nn.functional.mse_loss(self.model(x), y)
        if late > 0:
            sleep_precisely(late)
        arrived = time.perf_counter()
        self.backward(loss)
        return loss, arrived

    def backward(self, loss: torch.Tensor) -> None:
        """Backward and the gradients' AllReduce, until they are reduced."""
        loss.backward()
        if self.framework == "horovod":
            self.opt.synchronize()

    def step(self) -> None:
        if self.framework == "horovod":
            with self.opt.skip_synchronize():
                self.opt.step()
        else:
            self.opt.step()


def turns(copies: Sequence[T]) -> list[list[T]]:
    """The copies' order in each block, block after block (cycling): every permutation once before
    any repeats, so that over a cycle each copy runs first, last and right after each other copy
    equally often, and whatever one copy leaves running in the background (the hook's stats
    exchange, rank 0's controller) falls on the others alike.

    Example::

        turns(["plain", "hooked"])    # [['plain', 'hooked'], ['hooked', 'plain']]
    """
    return [list(order) for order in itertools.permutations(copies)]


def nothing() -> None:
    """Closes nothing (no hooked copy, so no loop)."""


def loop_of(runs: list[Run]) -> StragglerLoop | None:
    """The loop of the hooked Horovod copy among ``runs`` (None without one)."""
    for run in runs:
        if run.name == "hooked":
            loop: StragglerLoop = run.opt._stragglerkit.loop
            return loop
    return None


def to_device(batch: Any, device: torch.device) -> Any:
    """A workload's batch (a tensor, or tuples, lists and dicts of them) on ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch


def hook_settings(config: TrainConfig) -> Config:
    """stragglerkit's configuration for the hooked copy where it takes a ``Config`` (Horovod,
    megatron-core): the defaults with ``--hook-warmup``, ``--degraded-threshold`` and ``--event-log``."""
    detection: dict[str, Any] = {}
    if config.hook_warmup is not None:
        detection["warmup_steps"] = config.hook_warmup
    if config.degraded_threshold is not None:
        detection["degraded_threshold"] = config.degraded_threshold
    return with_event_log(Config().replace(detection=detection), config)


def with_event_log(settings: Config, config: TrainConfig) -> Config:
    """``settings`` with ``--event-log DIR``: every rank writes ``DIR/events.rank{rank}.jsonl``."""
    if config.event_log is None:
        return settings
    return settings.replace(report={"event_log": os.path.join(config.event_log, "events.rank{rank}.jsonl")})


def describe_event(event: dict[str, Any]) -> str:
    kind, evidence = event["kind"], event.get("evidence", {})
    if kind in ("detected_straggler", "detected_degraded"):
        ranks = ", ".join(f"rank {r} ({v:.3g})" for r, v in evidence.get("ranks", {}).items())
        unit = "median delay s" if kind == "detected_straggler" else "l"
        return f"{kind}: {ranks} [{unit}]"
    if kind == "switch":
        to = evidence.get("to", {})
        return f"switch to {event['algorithm']} (straggler {to.get('straggler')}, slowdowns {to.get('slowdowns')})"
    if kind in ("verified", "rollback") and "measured_after_s" in evidence:
        verdict = "kept" if kind == "verified" else f"rolled back, now {event['algorithm']}"
        measure = evidence.get("measure", "allreduce part")
        text = (
            f"{kind}: after the switch at step {evidence.get('switched_at_step')} the {measure} was "
            f"{1e3 * evidence['measured_after_s']:.1f} ms against {1e3 * evidence['measured_before_s']:.1f} ms before"
        )
        if measure != "allreduce part" and "allreduce_after_s" in evidence:
            text += (
                f" (allreduce part {1e3 * evidence['allreduce_after_s']:.1f} ms against "
                f"{1e3 * evidence['allreduce_before_s']:.1f} ms)"
            )
        return f"{text}: {verdict}"
    if kind == "probing" and "every" in evidence:
        return f"probing every {evidence['every']} steps: {evidence.get('reason', '')}"
    return f"{kind}, now {event['algorithm']}"

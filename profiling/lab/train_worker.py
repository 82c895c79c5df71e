"""One rank of the training bench (``python -m profiling.lab.train``): plain and stragglerkit, side by side.

Every rank builds copies of the same MLP (same seed, so the same initial parameters). With
``framework="ddp"`` two are wrapped in plain ``DistributedDataParallel`` (the process group's own
all_reduce: the baseline, ``plain``, and its A/A control, ``control``) and one with
``stragglerkit.DDPState`` + ``stragglerkit.ddp_hook``; with ``framework="horovod"`` two train with
``hvd.DistributedOptimizer`` and one with ``stragglerkit.straggler_aware`` (the "hooked" copy), all
broadcast from rank 0 as a Horovod script does; the backward's time then includes the optimizer's
``synchronize()``. With ``framework="megatron"`` the copies are a small GPT on megatron-core's DDP,
schedule and optimizer, the hooked one with ``stragglerkit.megatron.install``
(:mod:`profiling.lab.train_megatron`). ``TrainConfig.copies`` may leave out the control (or train
one copy alone). All train on the same batches (``torch.Generator`` seeded by (seed, step, rank)),
taking turns in blocks of ``steps_per_block`` steps (:meth:`TrainConfig.blocks`):

1. ``dist.barrier()``, then the block runs free, as training does: each step is forward, the
   injected lateness (the straggler's delay and/or this rank's jitter, the same figure for every
   copy), backward (the AllReduce), optimizer step, with no barrier between steps. A rank records
   when each of its steps ends, counted from the block's barrier; a step's time is how much later
   the *last* rank finished it than the last rank finished the step before (for a block's first
   step: than the barrier), so the steps of a block add up to its time. The backward alone (from
   the end of the lateness) is timed too: on the rank that arrives last it is that rank's backward
   compute plus the AllReduce from its arrival. With ``steps_per_block=1`` every step starts at a
   barrier (lockstep), and a step's time is the slowest rank's.
2. The order of the copies goes through every permutation in turn (with two copies: plain first in
   even blocks, hooked first in odd ones), so whatever one copy leaves running in the background
   (the hook's stats exchange, rank 0's controller thread) falls on the others alike, and so does
   any change of load on the machine. The control meets the same conditions as the plain copy, so
   the plain/control ratio is what the launch's noise alone makes of two identical copies.
3. After all: the largest absolute difference between the plain and the hooked model's parameters
   (both have trained the same steps then); every step of the block records it.

A :class:`~profiling.lab.workload.Workload` (``TrainConfig.workload``: the fine-tuning
examples) replaces the MLP, its random batches, its loss and its SGD, and adds a held-out
evaluation of every copy after the last step; torch's generator is then seeded by (seed, step,
rank) before each forward, so that dropout draws the same masks in every copy. Where the workload
has its own ``train_step`` (the examples' function: zero the gradients, loss, backward, update),
each copy runs that, whole, after the injected lateness; its time from the lateness's end is
then recorded as the step's ``backward_s`` (``example_step`` in the record). With
``TrainConfig.slowdown="backward"`` the straggler's delay is spread over its backward pass
(:class:`~profiling.lab.workload.ComputeSlowdown`) instead of slept before it. Every rank's
loss per step is gathered into the record (``loss_by_rank``).

With ``--degrade`` on the emulated cluster, rank 0 asks the launcher to reshape the degraded hosts'
links at ``from_step`` (a request file in the control folder) and every rank waits at a barrier
until that is done; with ``--recover-at`` likewise to restore them at that step. ``--delay
auto`` is measured before training: ``auto_delay_scale`` x the punctual ranks' StragglAR pre-phase
time on a buffer the size of the whole gradient.

:func:`main` (``argv``: CONFIG OUT [CONTROL], as the launcher starts it) runs one rank from the
environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; for Horovod the variables ``horovodrun``
sets, :mod:`profiling.lab.horovod_launch`) and writes rank 0's record to OUT (JSON).
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import stragglerkit
from profiling.lab.copies import (
    INPUTS,
    OUTPUTS,
    RESHAPE,
    RESHAPE_AGAIN,
    Run,
    build_model,
    control_files,
    describe_event,
    hidden_width,
    hook_settings,
    loop_of,
    mlp_batch,
    nothing,
    to_device,
    turns,
    with_event_log,
)
from profiling.lab.train_config import TrainConfig
from profiling.lab.workload import ComputeSlowdown, MegatronWorkload, load_workload
from stragglerkit.bench.cpu_load import CpuTimes
from stragglerkit.bench.progress import Progress
from stragglerkit.bench.worker import measure_pre_phase
from stragglerkit.config import Config
from stragglerkit.loop.loop import StragglerLoop
from stragglerkit.testbed.inject import JitterInjector, sleep_precisely

__all__ = ["main", "train"]


class _TrainRank:
    """This rank's state: the two runs, the hook's state, the injected lateness."""

    def __init__(self, config: TrainConfig, device: torch.device, control: Path | None) -> None:
        from stragglerkit.detect.settings import tuned

        self.config = config
        self.device = device
        self.control = control
        tuning = {}
        if config.degraded_threshold is not None:  # a NIC counts as recovered halfway back to full rate
            tuning["clear_degraded_threshold"] = (1.0 + config.degraded_threshold) / 2
        views = config.gradient_as_bucket_view
        self.loop: StragglerLoop | None = None
        """The hooked copy's loop (None when only the plain copy trains)."""
        self.runs: list[Run]
        """The copies this rank trains (``config.copies``: plain, control, hooked, in that order)."""
        self.close: Callable[[], None] = nothing
        """Ends the hooked copy's loop (every rank, after the last step)."""
        self.hidden = hidden_width(config.model_bytes)
        self.model_layers = f"{INPUTS}-{self.hidden}-{self.hidden}-{OUTPUTS} MLP"
        self.make_batch: Callable[[TrainConfig, int, int, torch.device], Any] = mlp_batch
        self.workload = load_workload(config.workload, config.workload_options) if config.workload else None
        if self.workload is not None:
            self.model_layers = self.workload.describe()
            self.hidden = 0
            self.make_batch = self._workload_batch
        if config.framework == "horovod":
            with tuned(**tuning):
                self.runs = self._horovod_runs(config, device)
            self.loop = loop_of(self.runs)
        elif config.framework == "megatron":
            from profiling.lab import train_megatron

            workload = self.workload
            if workload is not None and not isinstance(workload, MegatronWorkload):
                raise ValueError(
                    f"--framework megatron: the workload {config.workload} has no megatron-core model "
                    "(MegatronWorkload's megatron_* methods); use --framework ddp or horovod"
                )
            with tuned(**tuning):
                runs, megatron = train_megatron.megatron_runs(config, device, hook_settings(config), workload)
            assert megatron.loop is not None
            self.runs, self.loop, self.close = list(runs), megatron.loop, megatron.close
            if workload is not None:
                self.make_batch = self._megatron_workload_batch
            else:
                self.hidden = train_megatron.gpt_hidden_size(config.model_bytes)
                self.model_layers = train_megatron.describe(self.hidden)
                self.make_batch = train_megatron.gpt_batch
        else:
            self.runs = []
            for name in config.copies:
                model = DDP(self._new_model().to(device), gradient_as_bucket_view=views)
                self.runs.append(Run(name, model, self._new_optimizer(model), "ddp", views))
                if name == "hooked":
                    if not stragglerkit.is_initialized():
                        # collective: every rank builds its _TrainRank at the same point
                        stragglerkit.init(config=with_event_log(Config.from_env(), config))
                    with tuned(**tuning):
                        state = stragglerkit.DDPState(None, hook_settings(config))
                    model.register_comm_hook(state, stragglerkit.ddp_hook)
                    self.loop = state.loop
        if self.loop is not None and config.framework != "megatron":
            self.close = self.loop.close
        named = {run.name: run for run in self.runs}
        self.plain: Run | None = named.get("plain")
        self.hooked: Run | None = named.get("hooked")
        for run in self.runs:
            run.workload = self.workload
            if config.slowdown == "backward":
                run.slowdown = ComputeSlowdown(run.model)
        self.orders = turns(self.runs)
        """The copies' order in each block, cycling (:func:`~profiling.lab.copies.turns`)."""
        self.evaluation: dict[str, dict[str, float]] | None = None
        """Per copy, the workload's figures on its held-out split after the last step."""
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.reporter = self.rank == 0
        self.progress = Progress(config.steps, "train", enabled=self.reporter)
        """Rank 0 reports: a bar over the steps on a terminal, plain lines elsewhere."""
        self.jitter = JitterInjector(max_delay=config.jitter, seed=config.seed) if config.jitter > 0 else None
        self.numel = sum(p.numel() for p in self.runs[0].model.parameters())
        self.delay = config.delay or 0.0
        self.calibration: dict[str, Any] | None = None
        self.reshaped: dict[str, Any] | None = None
        self.algorithms: list[str] = []
        """Per step: the hooked run's algorithm after the step."""
        self.rank_maps: list[list[int]] = []
        """Per step: the hooked run's rank map (logical -> physical) after the step."""

    def _horovod_runs(self, config: TrainConfig, device: torch.device) -> list[Run]:
        """Plain ``hvd.DistributedOptimizer`` (the plain copy and the control) and
        ``stragglerkit.straggler_aware`` over copies of the model (``config.copies``), as a Horovod
        script sets them up (the wrap
        makes the torch.distributed group from Horovod's ranks, across the hosts); then Horovod's
        broadcasts of each."""
        import horovod.torch as hvd

        hook_config = hook_settings(config)
        runs = []
        for name in config.copies:
            model = self._new_model().to(device)
            sgd = self._new_optimizer(model)
            named = [(f"{name}.{key}", p) for key, p in model.named_parameters()]
            if name != "hooked":  # plain, and the control: a second plain copy
                opt = hvd.DistributedOptimizer(sgd, named_parameters=named)
            else:
                opt = stragglerkit.straggler_aware(sgd, named_parameters=named, config=hook_config)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            runs.append(Run(name, model, opt, "horovod", views=False))
        return runs

    def _new_model(self) -> nn.Module:
        """A copy of the model: the workload's, or the MLP (the same initial parameters every time)."""
        return self.workload.build_model() if self.workload is not None else build_model(self.config)

    def _new_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        if self.workload is not None:
            return self.workload.optimizer(list(model.parameters()))
        return torch.optim.SGD(model.parameters(), lr=self.config.lr)

    def _workload_batch(self, config: TrainConfig, step: int, rank: int, device: torch.device) -> Any:
        assert self.workload is not None
        return to_device(self.workload.batch(step, rank, dist.get_world_size()), device)

    def _megatron_workload_batch(self, config: TrainConfig, step: int, rank: int, device: torch.device) -> Any:
        assert isinstance(self.workload, MegatronWorkload)
        return to_device(self.workload.megatron_batch(step, rank, dist.get_world_size()), device)

    def evaluate(self) -> None:
        """Each copy on the workload's held-out split: every rank its share, the sums added up."""
        if self.workload is None:
            return
        self.evaluation = {}
        for run in self.runs:
            wrapped = isinstance(run.model, DDP) or run.framework == "megatron"  # megatron-core's DDP too
            module = cast(nn.Module, run.model.module) if wrapped else run.model
            module.eval()
            with torch.no_grad():
                if run.framework == "megatron":
                    from examples.megatron.cpu_shim import cuda_calls_on_cpu

                    assert isinstance(self.workload, MegatronWorkload)
                    with cuda_calls_on_cpu():
                        sums = self.workload.megatron_evaluate(module, self.rank, self.world_size)
                else:
                    sums = self.workload.evaluate(module, self.rank, self.world_size)
            module.train()
            keys = sorted(sums)
            totals = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64)
            dist.all_reduce(totals)
            self.evaluation[run.name] = self.workload.metrics(dict(zip(keys, totals.tolist(), strict=True)))
            self.progress.note(
                f"held-out evaluation, {run.name}: "
                + ", ".join(f"{k} {v:.4g}" for k, v in self.evaluation[run.name].items())
            )

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def calibrate(self) -> None:
        """``--delay auto``: ``auto_delay_scale`` x StragglAR's pre-phase on the gradient's size."""
        config = self.config
        if config.straggler is None or config.delay is not None:
            return
        if not stragglerkit.is_initialized():
            # collective; with megatron-core only its data-parallel group has a session so far
            stragglerkit.init()
        x = torch.ones(self.numel, device=self.device)
        measured = measure_pre_phase(x, x.clone(), config.straggler, config.bandwidth, self.synchronize)
        self.delay = config.auto_delay_scale * measured["delay_s"]
        self.calibration = dict(measured, scale=config.auto_delay_scale, numel=self.numel)
        self.progress.note(
            f"delay auto = {config.auto_delay_scale:g} x pre-phase {measured['delay_s'] * 1e3:.1f} ms "
            f"= {self.delay * 1e3:.1f} ms",
        )

    def lateness(self, step: int) -> float:
        """Seconds this rank sleeps before its backward at ``step`` (the same for both runs)."""
        seconds = 0.0
        if self.config.late_rank(step) == self.rank and self.config.slowdown == "sleep":
            seconds += self.delay
        if self.jitter is not None and step >= self.config.from_step:
            seconds += self.jitter.delay_for(step, self.rank)
        return seconds

    def reshape(self, phase: str, step: int) -> None:
        """Rank 0 asks the launcher to change the NICs (``RESHAPE``: degrade them, ``RESHAPE_AGAIN``:
        restore them or set them to ``reshape_to``) and waits; then every rank meets at a barrier."""
        if self.reporter:
            assert self.control is not None
            if phase == RESHAPE:
                what = "reshaping the degraded hosts' links"
            elif self.config.reshape_to:
                what = (
                    "reshaping the links again ("
                    + ", ".join(f"rank {r} l={v:g}" for r, v in sorted(self.config.reshape_to.items()))
                    + ")"
                )
            else:
                what = "restoring the degraded hosts' links"
            self.progress.note(f"step {step}: {what}")
            request, done, failed = (self.control / name for name in control_files(phase))
            request.write_text(str(step), encoding="utf-8")
            deadline = time.monotonic() + self.config.timeout
            while not done.exists():
                if failed.exists():
                    raise RuntimeError(f"{what} failed: {failed.read_text(encoding='utf-8')}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the launcher did not finish {what} in time")
                time.sleep(0.05)
            answer = json.loads(done.read_text(encoding="utf-8"))
            self.reshaped = {**(self.reshaped or {}), **answer}
        dist.barrier()

    def run_block(self, run: Run, block: range, batches: list[Any]) -> None:
        """``run`` trains the steps of ``block`` from one barrier, without a barrier between steps."""
        lateness = [self.lateness(step) for step in block]
        dist.barrier()
        block_start = previous_end = time.perf_counter()
        for step, batch, late in zip(block, batches, lateness, strict=True):
            cpu_before = CpuTimes.read()
            if run.slowdown is not None:
                run.slowdown.reset(self.delay if self.config.late_rank(step) == self.rank else 0.0)
            if run.workload is not None:  # dropout draws the same masks in every copy
                torch.manual_seed(self.config.seed * 1_000_003 + step * 1009 + self.rank)
            example_step = run.example_step
            if example_step is not None:  # the example's own step, whole: timed from the lateness's end
                if late > 0:
                    sleep_precisely(late)
                arrived = time.perf_counter()
                loss = torch.tensor(example_step(run.model, run.opt, batch))
                self.synchronize()
                run.backward_s.append(time.perf_counter() - arrived)
            else:
                run.zero_grad()
                loss, arrived = run.forward_backward(batch, late)
                self.synchronize()
                run.backward_s.append(time.perf_counter() - arrived)
                run.step()
                self.synchronize()
            end = time.perf_counter()
            run.times.append(end - previous_end)
            run.ends.append(end - block_start)
            previous_end = end
            cpu_after = CpuTimes.read()
            used = cpu_after - cpu_before if cpu_after is not None and cpu_before is not None else None
            run.cpu.append(None if used is None else [used.busy, used.total])
            run.losses.append(float(loss.detach()))
            if run is self.hooked and self.loop is not None:
                self.algorithms.append(self.loop.algorithm)
                self.rank_maps.append(self.loop.rank_map)

    def max_param_diff(self) -> float:
        """The largest difference between the two copies' parameters (0 with one copy)."""
        if self.plain is None or self.hooked is None:
            return 0.0
        with torch.no_grad():
            pairs = zip(self.plain.model.parameters(), self.hooked.model.parameters(), strict=True)
            return max(float((a - b).abs().max()) for a, b in pairs)

    def train(self) -> dict[str, Any]:
        config = self.config
        reshape = bool(config.degrade) and self.control is not None
        diffs: list[float] = []
        seen_events = 0
        every = max(1, config.steps // 12)
        for index, block in enumerate(config.blocks()):
            if reshape and block.start == config.from_step:
                self.reshape(RESHAPE, block.start)
            if reshape and block.start == config.reshape_at:
                self.reshape(RESHAPE_AGAIN, block.start)
            batches = [self.make_batch(config, step, self.rank, self.device) for step in block]
            for run in self.orders[index % len(self.orders)]:
                self.run_block(run, block, batches)
            diffs += [self.max_param_diff()] * len(block)
            events = self.loop.events if self.loop is not None else []
            for event in events[seen_events:]:
                self.progress.note(f"step {event['step']}: {describe_event(event)}")
            seen_events = len(events)
            done = block.stop
            due = done // every > block.start // every or done == config.steps
            status = None
            if self.reporter and (due or self.progress.drawing):  # a bar shows it every block
                recent = slice(max(0, done - every), done)
                times = ", ".join(
                    f"{run.name} {statistics.median(run.times[recent]) * 1e3:.1f} ms" for run in self.runs
                )
                hook = "" if self.loop is None else f", hook: {self.loop.algorithm}"
                status = f"{times}{hook}"
                if not self.progress.drawing:
                    status = (
                        f"step {done}/{config.steps}: {times} (rank 0's own, median of the last "
                        f"{len(self.runs[0].times[recent])}){hook}"
                    )
            self.progress.advance(len(block), status)
        self.progress.close()
        self.close()
        self.evaluate()
        return self._record(diffs)

    def _record(self, diffs: list[float]) -> dict[str, Any]:
        names = [run.name for run in self.runs]
        with torch.no_grad():
            flat = {
                run.name: torch.cat([p.detach().flatten() for p in run.model.parameters()]).double().cpu()
                for run in self.runs
            }
        weights = torch.arange(self.numel, dtype=torch.float64) % 7 + 1
        series = ("s", "end_s", "backward_s", "cpu")
        own = {
            **{f"{run.name}_{key}": getattr(run, _RUN_SERIES[key]) for run in self.runs for key in series},
            "diffs": diffs,
            "losses": {run.name: run.losses for run in self.runs},
            "checksums": {name: float((v * weights).sum()) for name, v in flat.items()},
            "scale": float(flat[names[0]].abs().max()),
        }
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, own)

        def by_step(key: str) -> list[list[Any]]:
            """``key`` of every rank, as [step][rank]."""
            return [list(t) for t in zip(*(g[key] for g in gathered), strict=True)]

        loop = self.loop
        last = loop.step - 1 if loop is not None else 0
        return {
            "copies": names,
            "world_size": self.world_size,
            "device": str(self.device),
            "backend": dist.get_backend(),
            "hidden": self.hidden,
            "model_layers": self.model_layers,
            "parameters": self.numel,
            "gradient_bytes": 4 * self.numel,
            "buckets_bytes": (
                [t.nbytes for t in sorted(loop.profiler.buckets(last), key=lambda t: t.bucket)] if loop else []
            ),
            "delay_s": self.delay if self.config.straggler is not None else None,
            "delay_calibration": self.calibration,
            "hook_config": _flat(loop.settings.header()) if loop else None,
            "reshaped": self.reshaped,
            # [step][rank]: each copy's step ends, step times, backward times, and [busy, total] CPU
            # ticks of the rank's host during its step (None: unknown)
            **{f"{name}_{key}": by_step(f"{name}_{key}") for name in names for key in series},
            "block_starts": [block.start for block in self.config.blocks()],
            "param_diff": [max(ranks) for ranks in by_step("diffs")],
            "param_scale": max(g["scale"] for g in gathered),
            "checksums": {name: [g["checksums"][name] for g in gathered] for name in names},
            "loss": {run.name: run.losses for run in self.runs},
            # [step][rank]: every rank's own batch loss
            "loss_by_rank": {
                name: [list(t) for t in zip(*(g["losses"][name] for g in gathered), strict=True)] for name in names
            },
            "evaluation": self.evaluation,
            "slowdown": self.config.slowdown,
            # the copies ran the workload's own train_step whole: backward_s is then that step from the
            # end of the lateness (forward, backward, update), not the backward alone
            "example_step": any(run.example_step is not None for run in self.runs),
            "algorithms": self.algorithms,
            "rank_maps": self.rank_maps,
            "events": loop.events if loop else [],
            "final_plan": loop.controller.plan.describe() if loop else None,
            # rank 0 decides: its detector's latest evaluation and its fitted cost model, as evidence
            "detector_evidence": loop.controller.detector.last_evidence if loop else None,
            "cost_model": dict(loop.controller.model.fit_info) if loop else None,
        }


_RUN_SERIES = {"s": "times", "end_s": "ends", "backward_s": "backward_s", "cpu": "cpu"}
"""The record's per-copy series (``plain_s``, ``hooked_end_s``, ...) and the :class:`Run` lists they come from."""


def _flat(header: dict[str, Any]) -> dict[str, Any]:
    """The loop's settings as one level: the detection fields beside the internal ones."""
    return {**header["detection"], **{key: value for key, value in header.items() if key != "detection"}}


def train(config: TrainConfig, device: torch.device, control: Path | None = None) -> dict[str, Any]:
    """Run the training on this rank of the initialised default group; the record (the same on every rank)."""
    state = _TrainRank(config, device, control)
    state.progress.note(
        f"{state.world_size} ranks, {state.model_layers}: {state.numel / 1e6:.2f}M parameters "
        f"({4 * state.numel / 2**20:.1f} MiB of gradients), {config.steps} steps, scenario {config.scenario}",
    )
    state.calibrate()
    return state.train()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3):
        print("usage: python -m profiling.lab.train_worker CONFIG.json OUT.json [CONTROL_DIR]", file=sys.stderr)
        return 2
    config = TrainConfig.from_json(Path(args[0]).read_text(encoding="utf-8"))
    control = Path(args[2]) if len(args) == 3 else None
    torch.set_num_threads(1)
    if config.framework == "horovod":
        import horovod.torch as hvd

        hvd.init()  # from the variables the launcher set, as horovodrun sets them; the torch group comes later
    else:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=config.timeout))
    try:
        record = train(config, torch.device("cpu"), control)
        if dist.get_rank() == 0:
            _write_atomically(args[1], record)
        dist.barrier()
    finally:
        if config.framework == "horovod":
            hvd.shutdown()
        if config.framework == "megatron":
            from megatron.core import parallel_state

            parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def _write_atomically(path: str, record: dict[str, Any]) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())

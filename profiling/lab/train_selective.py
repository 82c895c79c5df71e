"""``python -m profiling.lab.train --sync selective``: selective reduce, partial reduce and all-reduce
training the same model on real ranks, with the paper's heterogeneous NICs and compute times.

Source: "Progress and Bandwidth Aware Partial Model Synchronization With Selective Reduce",
Section IV-A, scaled to the emulated cluster: each rank's NIC runs at ``u x --bandwidth`` with
``u ~ U[0.05, 1]`` (the paper: ``round(20u, 3)`` Gbit/s), drawn once per run from ``--seed``; each
iteration's compute time is drawn from the paper's Figure 1 stand-ins
(:data:`stragglerkit.sim.selective.WORKLOADS`, ``--compute``) and the rank sleeps out whatever of
it its real forward and backward did not use. ``p = round(0.3 n)``, ``eta = 0.3``, ``theta = 1``.

**What trains.** Every rank trains its own copy of an MLP (``--model-size`` of parameters) with
local SGD on a regression task that can be learnt: the targets are a fixed random "teacher" MLP's
outputs on Gaussian inputs (each rank and iteration its own batch). Whenever the coordinator puts
a rank in a group, the group replaces its members' models by their weighted average
(:func:`~stragglerkit.selective.weighted_group_all_reduce`; weights: relative iteration counts).
This is *model averaging*, not gradient summing: it changes what training computes, which is why
selective reduce is opt-in (docs/selective.md says what it means for convergence).

**The three methods**, one after the other from the same initial model, each for ``--duration``
seconds of training, on the same links, with the same compute-time draws:

* ``selective``: :class:`~stragglerkit.selective.SelectiveReduceController` (BAG, BPAWR,
  Algorithm 3) with the NIC rates the testbed measured when it shaped them and a warm-start
  progress model (the compute-time distribution known, Eq. (4) as the paper writes it unless
  ``progress="conditional"``);
* ``partial``: :class:`~stragglerkit.selective.PartialReduceController`, the queue of ``p``;
* ``allreduce``: the same queue with ``p = n``: every rank waits for the slowest each round.

**Figures** (per method, Section IV-A's metrics measured on the ranks): average sync time (per
synchronisation, the longest of its members' AllReduce calls), average sync scale (group size),
total syncs, total iterations, the mean wait from ready to the group's start, and the training
loss against wall-clock time (every rank's batch loss, binned by time since the method started),
and the held-out loss of every rank's final model.

Example::

    python -m profiling.lab.train --sync selective --world-size 8 --duration 60 --json out.json
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from stragglerkit.bench.config import JsonConfig

__all__ = ["METHODS", "SelectiveTrainConfig", "draw_rates", "run_selective_train", "summarise"]

METHODS = ("selective", "partial", "allreduce")
"""The synchronisation schemes compared, in the order they run."""
_INPUTS, _OUTPUTS = 64, 8
_MIN_U = 0.05


@dataclass(kw_only=True, slots=True)
class SelectiveTrainConfig(JsonConfig):
    """One comparison run (module docstring); validated on creation."""

    world_size: int = 8
    bandwidth: float | None = 125e6
    """The fastest NIC's rate in bytes/s; each rank's is ``u`` times it."""
    mode: str = "emulated"
    """``emulated`` (NICs shaped per rank) or ``loopback`` (no shaping: the rates only inform the
    selective controller, so the comparison shows the controllers' logic, not the links)."""
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    duration: float = 60.0
    """Seconds of training per method."""
    model_bytes: int = 4 * 2**20
    compute: str = "transformer"
    """Compute-time distribution (:data:`stragglerkit.sim.selective.WORKLOADS`)."""
    compute_scale: float = 1.0
    """Multiplies every drawn compute time."""
    p_fraction: float = 0.3
    eta: float = 0.3
    theta: float = 1.0
    dt: float = 0.01
    progress: str = "paper"
    """Eq. (4) as the paper writes it, ``F(t + dt)`` (``paper``, as the simulation's default), or the
    conditional probability (``conditional``, the library's default; docs/selective.md says how the
    two differ). Warm start either way: the model is given 10,000 draws of the compute-time
    distribution, as the paper's main results assume the distribution known."""
    lr: float = 0.05
    batch: int = 32
    seed: int = 0
    timeout: float = 300.0

    RANK_KEYED: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        from stragglerkit.sim.selective import WORKLOADS

        if not isinstance(self.world_size, int) or self.world_size < 2:
            raise ValueError(f"--world-size must be 2 or more ranks for partial synchronisation, got {self.world_size}")
        if self.mode not in ("emulated", "loopback"):
            raise ValueError(
                f"--sync selective runs its ranks on the emulated cluster or over loopback, not {self.mode!r}"
            )
        if self.mode == "emulated" and not (self.bandwidth or 0) > 0:
            raise ValueError("--sync selective on the emulated cluster needs --bandwidth (the fastest NIC's rate)")
        if not self.methods or not set(self.methods) <= set(METHODS) or len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods must be some of {', '.join(METHODS)}, each once; got {self.methods!r}")
        if not (self.duration > 0 and math.isfinite(self.duration)):
            raise ValueError(f"--duration must be a positive number of seconds, got {self.duration!r}")
        if self.compute not in WORKLOADS:
            raise ValueError(f"--compute must be one of {', '.join(WORKLOADS)}, got {self.compute!r}")
        if not (self.compute_scale > 0 and math.isfinite(self.compute_scale)):
            raise ValueError(f"compute_scale must be a positive number, got {self.compute_scale!r}")
        if self.progress not in ("paper", "conditional"):
            raise ValueError(f"progress must be 'paper' or 'conditional', got {self.progress!r}")
        if not 0 < self.p_fraction <= 1:
            raise ValueError(f"p_fraction must be in (0, 1] (p = p_fraction x n), got {self.p_fraction!r}")
        if not 1024 <= self.model_bytes <= 2**30:
            raise ValueError(f"--model-size must be between 1KiB and 1GiB, got {self.model_bytes} bytes")

    @property
    def p(self) -> int:
        """The smallest group: ``round(p_fraction x n)``, at least 2 (a group of one averages nothing)."""
        return min(self.world_size, max(2, round(self.p_fraction * self.world_size)))


def draw_rates(config: SelectiveTrainConfig) -> dict[int, float]:
    """Each rank's NIC rate in bytes/s: ``u x bandwidth``, ``u ~ U[0.05, 1]`` from ``seed``."""
    rng = random.Random(f"selective-rates-{config.seed}-{config.world_size}")
    top = config.bandwidth or 125e6
    return {rank: top * rng.uniform(_MIN_U, 1.0) for rank in range(config.world_size)}


def _hidden(model_bytes: int) -> int:
    # H^2 + (INPUTS + OUTPUTS + 2) H + OUTPUTS parameters of 4 bytes
    b = _INPUTS + _OUTPUTS + 2
    numel = model_bytes / 4
    return max(8, round((-b + math.sqrt(b * b + 4 * numel)) / 2))


def _mlp(width: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(_INPUTS, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, _OUTPUTS)
    )


# --------------------------------------------------------------------------- one rank


def _run_method(config: SelectiveTrainConfig, method: str, rates: dict[int, float]) -> dict[str, Any]:
    """Train with ``method`` for ``config.duration`` seconds on this rank; its figures (rank 0: with
    the coordinator's record of every synchronisation)."""
    import numpy as np

    from stragglerkit.selective import (
        PartialReduceController,
        ProgressModel,
        SelectiveConfig,
        SelectiveReduceController,
    )
    from stragglerkit.selective.coordinator import RankSync, SyncCoordinator, run_store
    from stragglerkit.sim.selective import WORKLOADS

    rank, n = dist.get_rank(), dist.get_world_size()
    width = _hidden(config.model_bytes)
    model, teacher = _mlp(width, config.seed), _mlp(width // 4 + 8, config.seed + 1)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr)
    params = list(model.parameters())
    buffer = torch.nn.utils.parameters_to_vector(params).detach().clone()
    store = run_store(method)  # each launch has a store of its own
    sync = RankSync(store, rank, n, buffer, timeout=config.timeout)
    sampler, _ = WORKLOADS[config.compute]
    draws = sampler(np.random.default_rng((config.seed, rank)), (1, 100_000))[0] * config.compute_scale
    coordinator = None
    if rank == 0:
        model_bytes = 4 * buffer.numel()
        if method == "selective":
            settings = SelectiveConfig(
                p=config.p,
                eta=config.eta,
                theta=config.theta,
                dt=config.dt,
                model_bytes=model_bytes,
                worker_timeout=config.timeout,
            )
            known = sampler(np.random.default_rng((config.seed, n, 1)), (1, 10_000))[0] * config.compute_scale
            progress = ProgressModel.warm(known.tolist(), formula=config.progress)  # type: ignore[arg-type]
            controller: Any = SelectiveReduceController(settings, n, rates, progress)
        else:
            p = n if method == "allreduce" else config.p
            controller = PartialReduceController(n, p, worker_timeout=config.timeout)
        coordinator = SyncCoordinator(store, controller, config.duration)
    held_out = torch.Generator().manual_seed(config.seed + 999)
    x_test = torch.randn(1024, _INPUTS, generator=held_out)
    with torch.no_grad():
        y_test = teacher(x_test)
    dist.barrier()
    if coordinator is not None:
        coordinator.start()
    start = time.perf_counter()
    losses: list[tuple[float, float]] = []
    waits: list[float] = []
    iterations = 0
    while True:
        began = time.perf_counter()
        g = torch.Generator().manual_seed(config.seed * 1_000_003 + iterations * 1009 + rank)
        x = torch.randn(config.batch, _INPUTS, generator=g)
        with torch.no_grad():
            y = teacher(x)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        rest = float(draws[iterations % len(draws)]) - (time.perf_counter() - began)
        if rest > 0:
            time.sleep(rest)
        iterations += 1
        losses.append((time.perf_counter() - start, float(loss.detach())))
        with torch.no_grad():
            buffer.copy_(torch.nn.utils.parameters_to_vector(params))
        ready = time.perf_counter()
        done = sync.ready(iterations)
        if done is None:
            break
        waits.append(time.perf_counter() - ready - done.seconds)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(buffer, params)
    sync.close(timeout=config.timeout)
    records: list[dict[str, Any]] = []
    holds = 0
    if coordinator is not None:
        coordinator.join(timeout=config.timeout)
        if coordinator.error is not None:
            raise coordinator.error
        records = [
            {"id": r.id, "members": list(r.members), "weights": list(r.weights), "done_s": r.done_s}
            for r in coordinator.records
        ]
        holds = coordinator.holds
    with torch.no_grad():
        test_loss = float(nn.functional.mse_loss(model(x_test), y_test))
    return {
        "iterations": iterations,
        "losses": losses,
        "waits": waits,
        "sync_s": sync.sync_s,
        "test_loss": test_loss,
        "records": records,
        "holds": holds,
        "parameters": buffer.numel(),
    }


def train_rank(config: SelectiveTrainConfig, rates: dict[int, float]) -> dict[str, Any] | None:
    """Every method on this rank of the initialised default group; rank 0 gets every rank's figures."""
    import stragglerkit

    if not stragglerkit.is_initialized():
        # --sync selective is the explicit opt-in to partial synchronisation
        stragglerkit.init(config=stragglerkit.Config.from_env().replace(sync={"partial": True}))
    results: dict[str, Any] = {}
    for method in config.methods:
        if dist.get_rank() == 0:
            print(f"stragglerkit bench --sync selective: {method} for {config.duration:g} s", file=sys.stderr)
        own = _run_method(config, method, rates)
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, own)
        results[method] = gathered
    return results if dist.get_rank() == 0 else None


def main(argv: list[str] | None = None) -> int:
    """One rank, as the launcher starts it: ``CONFIG.json RATES.json OUT.json``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m profiling.lab.train_selective CONFIG.json RATES.json OUT.json", file=sys.stderr)
        return 2
    config = SelectiveTrainConfig.from_json(Path(args[0]).read_text(encoding="utf-8"))
    rates = {int(k): float(v) for k, v in json.loads(Path(args[1]).read_text(encoding="utf-8")).items()}
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=config.timeout))
    try:
        results = train_rank(config, rates)
        if results is not None:
            Path(args[2] + ".tmp").write_text(json.dumps(results), encoding="utf-8")
            os.replace(args[2] + ".tmp", args[2])
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- launching and figures


def run_selective_train(config: SelectiveTrainConfig) -> dict[str, Any]:
    """Shape the NICs (emulated cluster), run every rank, and return the summary (:func:`summarise`)."""
    import tempfile

    from stragglerkit.bench.launch import cluster_ranks, loopback_ranks, run_ranks

    rates = draw_rates(config)
    cluster_description: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="stragglerkit-selective-") as tmp:
        workdir = Path(tmp)
        config_path, rates_path, out_path = workdir / "config.json", workdir / "rates.json", workdir / "out.json"
        config_path.write_text(config.to_json(), encoding="utf-8")
        args = [str(config_path), str(rates_path), str(out_path)]
        module = "profiling.lab.train_selective"
        with contextlib.ExitStack() as stack:
            if config.mode == "emulated":
                from stragglerkit.testbed import EmulatedCluster, NicDegradation

                assert config.bandwidth is not None
                cluster = stack.enter_context(
                    EmulatedCluster(EmulatedCluster.Config(hosts=config.world_size, bandwidth=config.bandwidth))
                )
                cluster_description = cluster.describe()
                slowdowns = {rank: config.bandwidth / rate for rank, rate in rates.items()}
                measured = stack.enter_context(NicDegradation(slowdowns).applied(cluster, verify=True))
                rates = _measured_rates(rates, measured)
                cluster_description["shaped_links"] = [
                    [link.to_dict() for link in pair] for pair in measured if isinstance(pair, tuple)
                ]
                ranks = cluster_ranks(cluster, port=29700)
            else:
                ranks = loopback_ranks(config.world_size)
            rates_path.write_text(json.dumps(rates), encoding="utf-8")
            timeout = config.timeout + len(config.methods) * (config.duration + 60)
            run_ranks(config.world_size, timeout, module, args, ranks, workdir / "selective", "selective")
        results = json.loads(out_path.read_text(encoding="utf-8"))
    summary = summarise(config, results)
    summary["rates_Bps"] = rates
    summary["cluster"] = cluster_description
    return summary


def _measured_rates(configured: dict[int, float], measured: Sequence[object]) -> dict[int, float]:
    """Each rank's payload rate as the shaping's check measured it (the slower direction), where it did."""
    rates = dict(configured)
    for pair in measured:
        if isinstance(pair, tuple) and pair:
            host = pair[0].host
            values = [link.measured for link in pair if getattr(link, "measured", None)]
            if values:
                rates[host] = float(min(values))
    return rates


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarise(config: SelectiveTrainConfig, results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per method, the paper's figures from every rank's record; and selective's ratios to partial."""
    methods: dict[str, Any] = {}
    for method, ranks in results.items():
        records = ranks[0]["records"]
        call_s: dict[int, float] = {}
        for rank in ranks:
            for sync_id, seconds in rank["sync_s"]:
                call_s[sync_id] = max(seconds, call_s.get(sync_id, 0.0))
        finished = [r for r in records if r["done_s"] is not None and r["id"] in call_s]
        bins = max(1, round(config.duration))
        curve: list[list[float]] = [[] for _ in range(bins)]
        for rank in ranks:
            for at, loss in rank["losses"]:
                curve[min(bins - 1, int(at / config.duration * bins))].append(loss)
        methods[method] = {
            "avg_sync_time_s": _mean([call_s[r["id"]] for r in finished]),
            "avg_sync_scale": _mean([len(r["members"]) for r in finished]),
            "total_sync": len(finished),
            "total_iterations": sum(rank["iterations"] for rank in ranks),
            "mean_wait_s": _mean([w for rank in ranks for w in rank["waits"]]),
            "holds": ranks[0].get("holds", 0),
            "test_loss": _mean([rank["test_loss"] for rank in ranks]),
            "test_loss_by_rank": [rank["test_loss"] for rank in ranks],
            "loss_vs_time": [
                {"t_s": (i + 0.5) * config.duration / bins, "loss": _mean(v)} for i, v in enumerate(curve) if v
            ],
            "parameters": ranks[0]["parameters"],
        }
    ratios: dict[str, float | None] = {}
    if "selective" in methods and "partial" in methods:
        sel, par = methods["selective"], methods["partial"]
        ratios = {
            "sync_time_partial_over_selective": _ratio(par["avg_sync_time_s"], sel["avg_sync_time_s"]),
            "sync_scale_selective_over_partial": _ratio(sel["avg_sync_scale"], par["avg_sync_scale"]),
            "iterations_selective_over_partial": _ratio(sel["total_iterations"], par["total_iterations"]),
        }
    return {"config": json.loads(config.to_json()), "p": config.p, "methods": methods, "ratios": ratios}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def print_summary(summary: dict[str, Any], out: Any = None) -> None:
    """The table of the paper's metrics per method, and selective's ratios to partial reduce."""
    stream = out if out is not None else sys.stdout
    config = summary["config"]
    rates = summary["rates_Bps"]
    print(
        f"# --sync selective: {config['world_size']} ranks, {config['mode']}, p = {summary['p']}, "
        f"eta {config['eta']:g}, theta {config['theta']:g}; {config['duration']:g} s per method; "
        f"compute {config['compute']} x {config['compute_scale']:g}",
        file=stream,
    )
    print(
        "# NIC rates (Mbit/s): "
        + ", ".join(f"{r}: {float(v) * 8 / 1e6:.0f}" for r, v in sorted(rates.items(), key=lambda kv: int(kv[0]))),
        file=stream,
    )
    print(
        f"# {'method':>10} {'sync(s)':>8} {'scale':>6} {'syncs':>6} {'iters':>6} {'wait(s)':>8} {'holds':>6} "
        f"{'test loss':>10}",
        file=stream,
    )
    for method, m in summary["methods"].items():

        def f(value: float | None, spec: str) -> str:
            return "-" if value is None else format(value, spec)

        print(
            f"  {method:>10} {f(m['avg_sync_time_s'], '8.3f')} {f(m['avg_sync_scale'], '6.2f')} {m['total_sync']:>6} "
            f"{m['total_iterations']:>6} {f(m['mean_wait_s'], '8.3f')} {m['holds']:>6} {f(m['test_loss'], '10.4g')}",
            file=stream,
        )
    for name, value in summary["ratios"].items():
        print(f"# {name}: {'-' if value is None else f'{value:.2f}x'}", file=stream)


def plot(summary: dict[str, Any], path: str) -> None:
    """Training loss against wall-clock time, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for method, m in summary["methods"].items():
        points = m["loss_vs_time"]
        axis.plot([q["t_s"] for q in points], [q["loss"] for q in points], label=method)
    axis.set_xlabel("wall-clock time since the method started (s)")
    axis.set_ylabel("training loss (mean over ranks, per second)")
    axis.set_yscale("log")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())

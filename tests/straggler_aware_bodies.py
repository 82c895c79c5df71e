"""Per-rank bodies of tests/test_straggler_aware_torch.py: ``straggler_aware`` without Horovod, on
a gloo group over loopback, next to data parallelism written by hand (imported by the spawned ranks)."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from ddp_bodies import _batch, _model
from torch import nn

DETECTION = {"warmup_steps": 3, "min_gain": 0.0, "degraded_threshold": 1e9}
"""Switches soon; loopback has no NICs, so its links are never believed degraded (under load its
ring probes would time the ranks' CPU)."""


class Float64Compression:
    """Duck-typed compression that widens the bucket to float64 (exact: the reference stays exact)."""

    calls = 0

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        Float64Compression.calls += 1
        return tensor.to(torch.float64), tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype) -> torch.Tensor:
        return tensor.to(ctx)


class Float16Compression:
    """Duck-typed compression to float16, as Horovod's ``Compression.fp16`` does."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        return tensor.to(torch.float16), tensor.dtype

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: torch.dtype) -> torch.Tensor:
        return tensor.to(ctx)


class _SparseModel(nn.Module):
    """An embedding with sparse gradients, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(50, 16, sparse=True)
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        indices = (x[:, :4].abs() * 10).long() % 50
        return self.head(self.embedding(indices).mean(1))


class _NormFirst(nn.Module):
    """Registers its norm last but applies it first, as a transformer block does its input norm:
    the norm's gradients come last in a backward pass, not first as reverse registration order guesses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(64, 192)
        self.down = nn.Linear(192, 8)
        self.norm = nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


SMALL_BUCKET_BYTES = 256
"""Buckets of one or two parameters each, so that the order of the parameters decides when each starts."""


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _config(**executor: Any) -> Any:
    import stragglerkit

    config = stragglerkit.Config().replace(detection=DETECTION)
    return config.replace(executor=executor) if executor else config


def _reference_step(model: nn.Module, opt: torch.optim.Optimizer, n: int, average: bool, clip: bool) -> None:
    """Data parallelism by hand: each gradient all-reduced on its own, then divided."""
    for p in model.parameters():
        assert p.grad is not None
        grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
        dist.all_reduce(grad)
        if average:
            grad.div_(n)
        if p.grad.is_sparse:
            p.grad = grad.to_sparse()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    opt.zero_grad()


def _make_ours(model: nn.Module, lr: float, form: str, options: dict[str, Any], config: Any) -> Any:
    import stragglerkit

    if form == "instance":
        return stragglerkit.straggler_aware(
            torch.optim.SGD(model.parameters(), lr=lr),
            named_parameters=model.named_parameters(),
            config=config,
            **options,
        )
    if form == "class":

        @stragglerkit.straggler_aware(config=config, **options)
        class MySGD(torch.optim.SGD):
            pass

        return MySGD(model.parameters(), lr=lr, named_parameters=model.named_parameters())

    @stragglerkit.straggler_aware(config=config, named_parameters=model.named_parameters(), **options)
    def make(built: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(built.parameters(), lr=lr)

    return make(model)


def train_side_by_side(
    rank: int,
    n: int,
    steps: int,
    case: dict[str, Any],
    late_rank: int = -1,
    late_s: float = 0.0,
) -> dict[str, Any]:
    """One model trained by hand (reference) and one with ``straggler_aware``, on the same data.
    ``case``: ``form`` (instance/class/function), ``passes``, ``clip``, ``op``, ``predivide``,
    ``compression``, ``sparse``, ``in_place_zero``; ``late_rank`` sleeps ``late_s`` before its
    backward (our copy) from step 5 on."""
    passes = case.get("passes", 1)
    op = {"sum": "sum", "ReduceOp.SUM": dist.ReduceOp.SUM, "ReduceOp.AVG": dist.ReduceOp.AVG}.get(case.get("op", ""))
    average = case.get("op", "avg") != "sum" and case.get("op") != "ReduceOp.SUM"
    options: dict[str, Any] = {"backward_passes_per_step": passes}
    if op is not None:
        options["op"] = op
    if "predivide" in case:
        options["gradient_predivide_factor"] = case["predivide"]
    compression = {"float64": Float64Compression, "fp16": Float16Compression}.get(case.get("compression", ""))
    if compression is not None:
        options["compression"] = compression
    Float64Compression.calls = 0
    if case.get("sparse"):
        reference, ours = _SparseModel(), _SparseModel()
    elif case.get("norm_first"):
        reference, ours = _NormFirst(), _NormFirst()
    else:
        reference, ours = _model(0), _model(0)
    lr = 0.05 if average else 0.05 / n
    opt_reference = torch.optim.SGD(reference.parameters(), lr=lr)
    opt_ours = _make_ours(ours, lr, case.get("form", "instance"), options, _config())
    sync = opt_ours._stragglerkit
    names = {p: name for name, p in ours.named_parameters()}
    if case.get("norm_first"):
        from stragglerkit.integrations.optimizer_buckets import GradientBuckets

        assert sync.buckets is not None
        sync.buckets = GradientBuckets(list(ours.parameters()), sync.buckets.loop, bucket_bytes=SMALL_BUCKET_BYTES)
    layouts = []  # per step: the buckets, as parameter names, that the step ran with
    ran: set[str] = set()
    diffs = []
    for step in range(steps):
        for micro in range(passes):
            x, y = _batch(rank, passes * step + micro)
            nn.functional.mse_loss(reference(x), y).backward()
        _reference_step(reference, opt_reference, n, average, bool(case.get("clip")))
        for micro in range(passes):
            x, y = _batch(rank, passes * step + micro)
            loss = nn.functional.mse_loss(ours(x), y)
            if rank == late_rank and step >= 5 and micro == 0:
                time.sleep(late_s)
            loss.backward()
        if case.get("clip"):  # synchronize, clip, step without synchronizing again
            opt_ours.synchronize()
            torch.nn.utils.clip_grad_norm_(ours.parameters(), 0.5)
            with opt_ours.skip_synchronize():
                opt_ours.step()
        else:
            opt_ours.step()
        opt_ours.zero_grad(set_to_none=not case.get("in_place_zero", False))
        if sync.buckets is not None and step < 3:
            layouts.append([[names[p] for p in bucket] for bucket in sync.buckets.buckets])
        diffs.append(float((_flat(reference) - _flat(ours)).abs().max()))
        ran.update(t.algorithm for t in sync.loop.profiler.buckets(step))
    sync.loop.close()
    return {
        "diffs": diffs,
        "scale": float(_flat(reference).abs().max()),
        "ours": _flat(ours).numpy().tobytes(),
        "ran": sorted(ran),
        "events": [(e["step"], e["kind"], e["algorithm"]) for e in sync.loop.events],
        "class": type(opt_ours).__name__,
        "is_sgd": isinstance(opt_ours, torch.optim.SGD),
        "compress_calls": Float64Compression.calls,
        "layouts": layouts,
    }


def cases_side_by_side(rank: int, n: int, steps: int, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """:func:`train_side_by_side` for each case in turn, on one group."""
    return {name: train_side_by_side(rank, n, steps, case) for name, case in cases.items()}


def _error(make: Any) -> str:
    try:
        make()
    except Exception as err:  # the test reads type and text
        return f"{type(err).__name__}: {err}"
    return "no error"


def bad_input(rank: int, n: int) -> dict[str, str]:
    """What a user gets wrong, every rank alike; then a good optimizer must still train."""
    import stragglerkit

    model = _model(0)

    def sgd() -> torch.optim.SGD:
        return torch.optim.SGD(model.parameters(), lr=0.05)

    def wrap(**kwargs: Any) -> Any:
        return stragglerkit.straggler_aware(sgd(), config=_config(), **kwargs)

    errors: dict[str, str] = {}
    wrapped = wrap(named_parameters=model.named_parameters())
    errors["twice"] = _error(lambda: stragglerkit.straggler_aware(wrapped))
    errors["not_an_optimizer"] = _error(lambda: stragglerkit.straggler_aware(42))
    named = list(model.named_parameters())
    errors["duplicate_names"] = _error(lambda: wrap(named_parameters=[("same", p) for _, p in named]))
    errors["not_pairs"] = _error(lambda: wrap(named_parameters=[p for _, p in named]))
    errors["unnamed"] = _error(lambda: wrap(named_parameters=named[:2]))
    errors["passes"] = _error(lambda: wrap(backward_passes_per_step=0))
    errors["op"] = _error(lambda: wrap(op="max"))
    errors["predivide_with_sum"] = _error(lambda: wrap(op="sum", gradient_predivide_factor=2.0))
    errors["process_set"] = _error(lambda: wrap(process_set=object()))
    errors["groups"] = _error(lambda: wrap(groups=2))
    errors["num_groups"] = _error(lambda: wrap(num_groups=2))
    errors["compression"] = _error(lambda: wrap(compression=object()))
    # the wrap above: a backward pass, then zero_grad before step
    x, y = _batch(rank, 0)
    nn.functional.mse_loss(model(x), y).backward()
    errors["zero_grad_in_flight"] = _error(wrapped.zero_grad)
    wrapped.step()
    wrapped.zero_grad()
    # two backward passes where backward_passes_per_step is 1
    nn.functional.mse_loss(model(x), y).backward()
    errors["too_many_passes"] = _error(lambda: nn.functional.mse_loss(model(x), y).backward())
    wrapped.step()
    wrapped.zero_grad()
    wrapped._stragglerkit.loop.close()
    # a rank alone with a bad argument: every rank names it, none waits for it
    start = time.monotonic()
    errors["one_rank_duplicates"] = _error(
        lambda: wrap(named_parameters=[("same", p) for _, p in named] if rank == 1 else named)
    )
    errors["one_rank_seconds"] = f"{time.monotonic() - start:.3f}"
    return errors


def mismatched_parameters(rank: int, n: int) -> dict[str, str]:
    """Rank 1 (and 2, where noted) builds another model than rank 0; each case's error on this rank.
    ``values``: same shapes, other values (legitimate before broadcast_parameters)."""
    import stragglerkit

    def build(kind: str) -> nn.Module:
        if kind == "values":
            torch.manual_seed(rank)
            return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 8))
        if kind == "shape" and rank == 1:
            return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 9))
        if kind == "dtype" and rank == 1:
            return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 8)).double()
        if kind == "count" and rank in (1, 2):
            return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 8), nn.Linear(8, 8))
        return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 8))

    errors = {}
    for kind in ("values", "shape", "dtype", "count"):
        model = build(kind)
        try:
            distributed = stragglerkit.straggler_aware(
                torch.optim.SGD(model.parameters(), lr=0.05),
                named_parameters=model.named_parameters(),
                config=_config(),
            )
            distributed._stragglerkit.loop.close()
            errors[kind] = "no error"
        except Exception as err:  # the test reads type and text
            errors[kind] = f"{type(err).__name__}: {err}"
    return errors


def faulty_rank(rank: int, n: int, fault: str, fault_step: int, timeout: float) -> dict[str, Any]:
    """Rank 2 exits (``dies``) or sleeps three timeouts (``stalls``) before its backward at
    ``fault_step``; what every other rank raised, and when."""
    import stragglerkit

    model = _model(0)
    opt = stragglerkit.straggler_aware(
        torch.optim.SGD(model.parameters(), lr=0.05),
        named_parameters=model.named_parameters(),
        config=_config(timeout=timeout),
    )
    start = time.monotonic()
    try:
        for step in range(fault_step + 5):
            x, y = _batch(rank, step)
            loss = nn.functional.mse_loss(model(x), y)
            if rank == 2 and step == fault_step:
                if fault == "dies":
                    os._exit(0)
                time.sleep(3 * timeout)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step == fault_step - 1:
                start = time.monotonic()
        outcome: dict[str, Any] = {"error": None}
    except Exception as err:  # the test reads type, peer and text
        outcome = {"error": type(err).__name__, "peer": getattr(err, "peer", None), "message": str(err)}
    outcome["seconds"] = time.monotonic() - start
    return outcome


def one_rank(rank: int, n: int) -> dict[str, Any]:
    """A world of one rank: nothing to reduce, no hooks; steps exactly like the plain optimizer."""
    import stragglerkit

    plain, ours = _model(0), _model(0)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9)
    opt_ours = stragglerkit.straggler_aware(
        torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9), named_parameters=ours.named_parameters()
    )
    for step in range(4):
        for model, opt in ((plain, opt_plain), (ours, opt_ours)):
            x, y = _batch(rank, step)
            nn.functional.mse_loss(model(x), y).backward()
            if step % 2:
                opt.step()
            else:  # Horovod's pattern works too (a plain optimizer has no synchronize)
                getattr(opt, "synchronize", lambda: None)()
                with getattr(opt, "skip_synchronize", contextlib.nullcontext)():
                    opt.step()
            opt.zero_grad()
    return {
        "equal": bool(torch.equal(_flat(plain), _flat(ours))),
        "loop": opt_ours._stragglerkit.loop is None,
        "state_dict_keys": sorted(opt_ours.state_dict()["state"]) == sorted(opt_plain.state_dict()["state"]),
    }


def close_writes_the_last_records(rank: int, n: int, folder: str) -> dict[str, Any]:
    """Eight steps with an event log per rank, then ``optimizer.close()`` twice: the loop's thread
    was running and is stopped, and rank 0's log holds the windows of the exchanges."""
    import json

    import stragglerkit

    model = _model(0)
    config = _config().replace(report={"event_log": f"{folder}/events.rank{{rank}}.jsonl"})
    opt = stragglerkit.straggler_aware(
        torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(), config=config
    )
    for step in range(8):
        x, y = _batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    loop = opt._stragglerkit.loop
    running = loop.exchange._observer is not None
    opt.close()
    opt.close()
    with open(f"{folder}/events.rank{rank}.jsonl", encoding="utf-8") as log:
        kinds = [json.loads(line)["kind"] for line in log]
    windows = []
    if rank == 0:
        with open(f"{folder}/events.rank0.jsonl", encoding="utf-8") as log:
            windows = [record["steps"] for record in map(json.loads, log) if record["kind"] == "window"]
    return {"kinds": kinds, "windows": windows, "running": running, "stopped": loop.exchange._observer is None}

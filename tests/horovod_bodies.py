"""Per-rank bodies of the Horovod tests, run under ``horovodrun --gloo`` by tests/test_horovod.py:
``python tests/horovod_bodies.py CASE OUT.json [ARGS as JSON]``; rank 0 writes every rank's result."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import horovod.torch as hvd
import torch
from ddp_bodies import _batch, _model
from torch import nn


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def side_by_side(args: dict[str, Any]) -> dict[str, Any]:
    """The same model trained with ``hvd.DistributedOptimizer`` and with stragglerkit's, same data;
    ``late_rank`` sleeps ``late_s`` before its backward (stragglerkit's copy) from step 5 on.
    ``form``: how stragglerkit's optimizer is made (drop-in, instance, class or function decorator)."""
    import stragglerkit
    import stragglerkit.horovod

    steps, late_rank, late_s = args["steps"], args.get("late_rank", -1), args.get("late_s", 0.0)
    compression = hvd.Compression.fp16 if args.get("fp16") else hvd.Compression.none
    passes = args.get("backward_passes_per_step", 1)
    op = hvd.Sum if args.get("op") == "sum" else hvd.Average
    # loopback has no NICs: under load its ring probes can read a rank's CPU as a degraded link
    detection = {"warmup_steps": 3, "min_gain": 0.0, "degraded_threshold": 1e9}
    config = stragglerkit.Config().replace(detection=detection)
    theirs, ours = _model(0), _model(0)
    hvd.broadcast_parameters(theirs.state_dict(), root_rank=0)
    hvd.broadcast_parameters(ours.state_dict(), root_rank=0)
    lr = 0.05 if op == hvd.Average else 0.05 / hvd.size()
    horovod = dict(compression=compression, backward_passes_per_step=passes, op=op)
    opt_theirs = hvd.DistributedOptimizer(
        torch.optim.SGD(theirs.parameters(), lr=lr), named_parameters=theirs.named_parameters(), **horovod
    )
    form = args.get("form", "drop_in")
    if form == "drop_in":
        opt_ours = stragglerkit.horovod.DistributedOptimizer(
            torch.optim.SGD(ours.parameters(), lr=lr),
            named_parameters=ours.named_parameters(),
            config=config,
            **horovod,
        )
    elif form == "instance":
        opt_ours = stragglerkit.straggler_aware(
            torch.optim.SGD(ours.parameters(), lr=lr),
            named_parameters=ours.named_parameters(),
            config=config,
            **horovod,
        )
    elif form == "class":

        @stragglerkit.straggler_aware(config=config, **horovod)
        class MySGD(torch.optim.SGD):
            pass

        opt_ours = MySGD(ours.parameters(), lr=lr, named_parameters=ours.named_parameters())
    else:

        @stragglerkit.straggler_aware(config=config, named_parameters=ours.named_parameters(), **horovod)
        def make(model: nn.Module) -> torch.optim.Optimizer:
            return torch.optim.SGD(model.parameters(), lr=lr)

        opt_ours = make(ours)
    buckets = getattr(opt_ours, "_stragglerkit", None)
    loop = buckets.loop if buckets is not None else None
    ran: set[str] = set()
    diffs = []
    for step in range(steps):
        for model, opt, late in ((theirs, opt_theirs, False), (ours, opt_ours, True)):
            for micro in range(passes):
                x, y = _batch(hvd.rank(), passes * step + micro)
                loss = nn.functional.mse_loss(model(x), y)
                if late and hvd.rank() == late_rank and step >= 5 and micro == 0:
                    time.sleep(late_s)
                loss.backward()
            if args.get("clip"):  # Horovod's pattern: synchronize, clip, step without synchronizing
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
            opt.zero_grad()
        diffs.append(float((_flat(theirs) - _flat(ours)).abs().max()))
        if loop is not None:  # (the profiler keeps only the recent steps)
            ran.update(t.algorithm for t in loop.profiler.buckets(step))
    if loop is not None:  # every rank, after the last step: the loop's thread stops
        opt_ours.close()
    return {
        "closed": loop is None or loop.exchange._observer is None,
        "diffs": diffs,
        "scale": float(_flat(theirs).abs().max()),
        "ours": _flat(ours).tolist(),
        "ran": sorted(ran),
        "events": [(e["step"], e["kind"], e["algorithm"]) for e in loop.events] if loop else [],
        "class": type(opt_ours).__name__,
        "is_sgd": isinstance(opt_ours, torch.optim.SGD),
    }


def bad_input(args: dict[str, Any]) -> dict[str, Any]:
    """What a user gets wrong: a wrap applied twice, a non-optimizer; Horovod's own checks keep
    Horovod's messages."""
    import stragglerkit
    import stragglerkit.horovod

    model = _model(0)
    errors: dict[str, str] = {}
    wrapped = stragglerkit.straggler_aware(torch.optim.SGD(model.parameters(), lr=0.1))
    for case, make in {
        "twice": lambda: stragglerkit.straggler_aware(wrapped),
        "not_an_optimizer": lambda: stragglerkit.straggler_aware(42),
        "duplicate_names": lambda: stragglerkit.horovod.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[("same", p) for p in model.parameters()],
        ),
        "passes": lambda: stragglerkit.horovod.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=0
        ),
    }.items():
        try:
            make()
            errors[case] = "no error"
        except Exception as err:
            errors[case] = f"{type(err).__name__}: {err}"
    return {"errors": errors}


def mismatched_parameters(args: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 (and 2, where noted) builds another model than rank 0; each case's error on this rank.
    ``values``: same shapes, other values (legitimate before broadcast_parameters)."""
    import stragglerkit

    rank = hvd.rank()

    def build(kind: str) -> nn.Module:
        if kind == "values":
            torch.manual_seed(rank)
        elif kind == "shape" and rank == 1:
            return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 9))
        elif kind == "dtype" and rank == 1:
            return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 8)).double()
        elif kind == "count" and rank in (1, 2):
            return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 8), nn.Linear(8, 8))
        return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 8))

    errors: dict[str, str] = {}
    for kind in ("values", "shape", "dtype", "count"):
        model = build(kind)
        try:
            stragglerkit.straggler_aware(
                torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters()
            )
            errors[kind] = "no error"
        except Exception as err:
            errors[kind] = f"{type(err).__name__}: {err}"
    return {"errors": errors}


def faulty_rank(args: dict[str, Any]) -> dict[str, Any]:
    """Rank ``faulty`` exits (``fault="dies"``, with status 0 so that horovodrun leaves the others
    running) or sleeps ``stall_s`` (``"stalls"``; Horovod's allreduce would wait for it forever)
    before its backward at step 5; the others must fail within the timeout naming it. Each rank
    writes its own result (``OUT.rankN.json``): after the failure Horovod has shut down, nothing
    is gathered."""
    import stragglerkit

    model = _model(0)
    config = stragglerkit.Config().replace(executor={"timeout": args["timeout"]}, detection={"warmup_steps": 3})
    opt = stragglerkit.straggler_aware(
        torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(), config=config
    )
    start = time.monotonic()
    try:
        for step in range(10):
            x, y = _batch(hvd.rank(), step)
            loss = nn.functional.mse_loss(model(x), y)
            if hvd.rank() == args["faulty"] and step == 5:
                if args["fault"] == "dies":
                    os._exit(0)
                time.sleep(args["stall_s"])
            loss.backward()
            opt.step()
            opt.zero_grad()
        outcome = {"error": None}
    except Exception as err:
        outcome = {"error": type(err).__name__, "peer": getattr(err, "peer", None), "message": str(err)}
    outcome["seconds"] = time.monotonic() - start
    with open(f"{sys.argv[2]}.rank{hvd.rank()}.json", "w", encoding="utf-8") as f:
        json.dump(outcome, f)
    os._exit(0)


def several(args: dict[str, Any]) -> dict[str, Any]:
    """Each case of ``args["cases"]`` ({name: {"case": a case of :data:`CASES`, **its args}}) in turn,
    in this one run: {"cases": {name: its result, with ``ok``, or ``ok`` False and the traceback}}."""
    out: dict[str, Any] = {}
    for name, case_args in args["cases"].items():
        try:
            out[name] = {"ok": True, **CASES[case_args["case"]](case_args)}
        except Exception:
            out[name] = {"ok": False, "error": f"case {name}:\n{traceback.format_exc()}"}
    return {"cases": out}


CASES = {
    "side_by_side": side_by_side,
    "bad_input": bad_input,
    "mismatched_parameters": mismatched_parameters,
    "faulty_rank": faulty_rank,
    "several": several,
}


def main() -> None:
    case, out = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    hvd.init()
    torch.set_num_threads(1)
    try:
        result: Any = {"ok": True, **CASES[case](args)}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    gathered = hvd.allgather_object(result)
    if hvd.rank() == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(gathered, f)


if __name__ == "__main__":
    main()

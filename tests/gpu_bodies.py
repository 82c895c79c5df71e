"""Per-rank bodies of the GPU checks (tests/test_gpu.py), imported by the spawned ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def hook_vs_plain_ddp_on_cuda(rank: int, n: int, steps: int, late_rank: int, late_s: float) -> dict[str, Any]:
    """Plain DDP and DDP with the stragglerkit hook train the same model on the GPU (every rank on
    device 0, over the gloo group); after each step the parameters are compared. ``late_rank``
    sleeps ``late_s`` before its hooked backward from step 5 on, so the loop may switch to StragglAR."""
    import time

    from ddp_bodies import _batch, _init, _model, _state

    import stragglerkit

    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    _init({})
    plain = DDP(_model(0).to(device), device_ids=[0], bucket_cap_mb=0.05)
    hooked = DDP(_model(0).to(device), device_ids=[0], bucket_cap_mb=0.05)
    # Probes run stragglerkit's ring on the largest bucket every few steps from step 3 on.
    state = _state({"warmup_steps": 3, "min_bucket_bytes": 1024, "min_gain": 0.0})
    hooked.register_comm_hook(state, stragglerkit.ddp_hook)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.05)
    opt_hooked = torch.optim.SGD(hooked.parameters(), lr=0.05)
    diffs: list[float] = []
    checksums: list[float] = []
    ran: set[str] = set()
    for step in range(steps):
        x, y = (t.to(device) for t in _batch(rank, step))
        for model, opt, late in ((plain, opt_plain, False), (hooked, opt_hooked, True)):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(x), y)
            if late and rank == late_rank and step >= 5:
                time.sleep(late_s)
            loss.backward()
            opt.step()
        ran.update(t.algorithm for t in state.loop.profiler.buckets(step))
        with torch.no_grad():
            flat_plain = torch.cat([p.flatten() for p in plain.parameters()])
            flat_hooked = torch.cat([p.flatten() for p in hooked.parameters()])
            diffs.append(float((flat_plain - flat_hooked).abs().max()))
            weights = torch.arange(flat_hooked.numel(), device=device) % 7 + 1
            checksums.append(float(flat_hooked.double().mul(weights).sum()))
    state.close()
    return {
        "diffs": diffs,
        "checksums": checksums,
        "scale": max(float(p.detach().abs().max()) for p in plain.parameters()),
        "ran": sorted(ran),
        "step": state.step,
        "device": str(next(hooked.parameters()).device),
    }


def nccl_world_of_one(rank: int, n: int) -> dict[str, Any]:
    """stragglerkit on an NCCL group of one rank: init creates its side groups beside NCCL, and every
    algorithm leaves the tensor as it is (nothing is exchanged), synchronously and asynchronously."""
    import torch.distributed as dist

    import stragglerkit
    from stragglerkit.schedules.registry import names

    assert dist.get_backend() == "nccl", dist.get_backend()
    stragglerkit.init()
    checks: dict[str, bool] = {}
    for algorithm in ("auto", *names()):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            t = torch.arange(1001, device="cuda").to(dtype)
            expected = t.clone()
            work = stragglerkit.all_reduce(t, algorithm=algorithm, async_op=True)
            checks[f"{algorithm}/{dtype}/async"] = work.wait() is True and work.get_future().value()[0] is t
            stragglerkit.all_reduce(t, op=torch.distributed.ReduceOp.AVG, algorithm=algorithm)
            checks[f"{algorithm}/{dtype}/unchanged"] = torch.equal(t, expected)
    stragglerkit.destroy()
    return checks

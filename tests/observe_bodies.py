"""Per-rank bodies of tests/test_observe_only.py: loops that observe only (``Config.detection.act``)
under the DDP hook and the torch-only ``straggler_aware`` optimizer, and the NCCL gate on two GPUs
(imported by the spawned ranks)."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

DETECTION = {"warmup_steps": 5, "window": 6, "confirm": 1, "min_gain": 0.0, "degraded_threshold": 1e9}
"""Acts on a short window; loopback has no NICs, so no link is believed degraded."""
TUNED = {"min_bucket_bytes": 1024, "clear_fraction": 0.01, "clear_delay_ratio": 0.0}
"""The late rank stays believed once detected (the test's buckets are ~50 KB: under the 64 KiB
below which no plan is made by default)."""
OBSERVES = "stragglerkit observes only"
"""How the loop's warning starts."""


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 192), nn.ReLU(), nn.Linear(192, 8))


def _batch(rank: int, step: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g).to(device), torch.randn(16, 8, generator=g).to(device)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith(OBSERVES)]


def ddp_never(rank: int, n: int, steps: int, late_from: int, late_s: float, folder: str) -> dict[str, Any]:
    """Plain DDP and DDP under the hook with ``act="never"`` on the same data; rank ``n - 1``
    sleeps ``late_s`` before the hooked copy's backward from ``late_from`` on. Per step: the
    loop's algorithm, each bucket's, the rank map, and how far the two copies' parameters are
    apart."""
    import stragglerkit
    from stragglerkit.detect.settings import tuned

    config = stragglerkit.Config().replace(
        detection={**DETECTION, "act": "never"},
        report={"event_log": os.path.join(folder, "events.rank{rank}.jsonl")},
    )
    stragglerkit.init(config=config)
    plain = DDP(_model(0), bucket_cap_mb=0.05)
    hooked = DDP(_model(0), bucket_cap_mb=0.05)
    with warnings.catch_warnings(record=True) as caught, tuned(**TUNED):
        warnings.simplefilter("always")  # count every warning the loop issues, not only the first shown
        state = stragglerkit.DDPState(None)
    hooked.register_comm_hook(state, stragglerkit.ddp_hook)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.05)
    opt_hooked = torch.optim.SGD(hooked.parameters(), lr=0.05)
    algorithms, buckets, rank_maps, diffs = [], [], [], []
    for step in range(steps):
        x, y = _batch(rank, step)
        for model, opt, late in ((plain, opt_plain, False), (hooked, opt_hooked, True)):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            if late and rank == n - 1 and step >= late_from:
                time.sleep(late_s)
            loss.backward()
            opt.step()
        algorithms.append(state.algorithm)
        buckets.append(sorted({t.algorithm for t in state.loop.profiler.buckets(step)}))
        rank_maps.append(state.loop.rank_map)
        diffs.append(float((_flat(plain) - _flat(hooked)).abs().max()))
    state.close()
    return {
        "acting": state.loop.settings.acting,
        "probe_every": state.loop.controller.probe_every,
        "algorithms": algorithms,
        "buckets": buckets,
        "rank_maps": rank_maps,
        "diffs": diffs,
        "events": state.events,
        "warnings": _warnings(caught),
        "step": state.step,
    }


def ddp_auto_as(rank: int, n: int, steps: int, backend: str) -> dict[str, Any]:
    """The DDP hook with the default ``act`` on this gloo group as the loop would see a group of
    ``backend`` (white-box: the session's backend is replaced): which algorithms ran, and the
    ``observing`` events."""
    import stragglerkit
    from stragglerkit.detect.settings import tuned
    from stragglerkit.session import Session

    stragglerkit.init()
    real = Session.backend
    Session.backend = property(lambda self: backend)  # type: ignore[method-assign, assignment]
    try:
        with warnings.catch_warnings(record=True) as caught, tuned(min_bucket_bytes=1024):
            warnings.simplefilter("always")
            state = stragglerkit.DDPState(None, stragglerkit.Config().replace(detection={"warmup_steps": 2}))
    finally:
        Session.backend = real  # type: ignore[method-assign]
    model = DDP(_model(0), bucket_cap_mb=0.05)
    model.register_comm_hook(state, stragglerkit.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ran: list[list[str]] = []
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        ran.append(sorted({t.algorithm for t in state.loop.profiler.buckets(step)}))
    state.close()
    return {
        "acting": state.loop.settings.acting,
        "ran": ran,
        "observing": [e["evidence"] for e in state.events if e["kind"] == "observing"],
        "warnings": _warnings(caught),
    }


def optimizer_never(rank: int, n: int, steps: int, late_s: float) -> dict[str, Any]:
    """``straggler_aware`` without Horovod (data parallelism by hand) with ``act="never"`` given
    to it, not to ``init``, and rank ``n - 1`` late: which algorithms reduced its buckets."""
    import stragglerkit
    from stragglerkit.detect.settings import tuned

    stragglerkit.init()  # the session's act is the default; the optimizer's configuration says never
    config = stragglerkit.Config().replace(detection={**DETECTION, "act": "never"})
    model = _model(0)
    with warnings.catch_warnings(record=True) as caught, tuned(**TUNED):
        warnings.simplefilter("always")
        opt = stragglerkit.straggler_aware(
            torch.optim.SGD(model.parameters(), lr=0.05), named_parameters=model.named_parameters(), config=config
        )
    loop = opt._stragglerkit.loop
    ran: set[str] = set()
    for step in range(steps):
        x, y = _batch(rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        if rank == n - 1 and step >= 2:
            time.sleep(late_s)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ran.update(t.algorithm for t in loop.profiler.buckets(step))
    loop.close()
    return {
        "acting": loop.settings.acting,
        "ran": sorted(ran),
        "events": [(e["step"], e["kind"]) for e in loop.events],
        "warnings": _warnings(caught),
    }


def nccl_gate(rank: int, n: int) -> dict[str, Any]:
    """On an NCCL group of one GPU per rank: with the default ``act`` the hook observes and says
    why; with ``act="always"`` it acts; and stragglerkit's ring over NCCL sums as torch's
    ``all_reduce`` does (the executor's NCCL transport with several ranks)."""
    import stragglerkit

    device = f"cuda:{rank}"
    out: dict[str, Any] = {"backend": str(dist.get_backend())}
    stragglerkit.init()
    for act in ("auto", "always"):
        config = stragglerkit.Config().replace(detection={"warmup_steps": 2, "act": act})
        model = DDP(_model(0).to(device), device_ids=[rank])
        state = stragglerkit.DDPState(None, config)
        model.register_comm_hook(state, stragglerkit.ddp_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(6):
            x, y = _batch(rank, step, device)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
        state.close()
        out[act] = {
            "acting": state.loop.settings.acting,
            "algorithms": [state.algorithm],
            "observing": [e["evidence"]["reason"] for e in state.events if e["kind"] == "observing"],
        }
    tensor = torch.arange(1 << 16, dtype=torch.float32, device=device) * (rank + 1)
    expected = tensor.clone()
    dist.all_reduce(expected)
    stragglerkit.all_reduce(tensor, algorithm="ring")
    torch.cuda.synchronize()
    out["ring_equals_torch"] = bool(torch.equal(tensor, expected))
    return out

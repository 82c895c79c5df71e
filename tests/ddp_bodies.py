"""Per-rank bodies of the DDP hook tests (imported by the spawned ranks)."""

from __future__ import annotations

import os
import pickle
import random
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 192), nn.ReLU(), nn.Linear(192, 8))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)


def _init(cfg: dict[str, Any], event_log: str | None = None) -> None:
    """``stragglerkit.init`` on the default group, with the test's timeout and event log."""
    import stragglerkit

    config = stragglerkit.Config()
    if "timeout" in cfg:
        config = config.replace(executor={"timeout": cfg["timeout"]})
    if event_log:
        config = config.replace(report={"event_log": event_log})
    stragglerkit.init(config=config)


def _state(overrides: dict[str, Any]) -> Any:
    """A DDPState whose loop runs with ``overrides``: ``Config.detection`` fields (also under
    ``"detector"``, where ``fraction`` is ``late_fraction``) and internal settings (``tuned``);
    ``timeout`` is the session's (:func:`_init`)."""
    import dataclasses

    import stragglerkit
    from stragglerkit.config import DetectionConfig
    from stragglerkit.detect.settings import tuned
    from stragglerkit.session import session_for

    detector = dict(overrides.pop("detector", {}))
    if "fraction" in detector:
        detector["late_fraction"] = detector.pop("fraction")
    overrides.pop("timeout", None)
    names = {f.name for f in dataclasses.fields(DetectionConfig)}
    values = {**overrides, **detector}
    config = session_for(None).config.replace(detection={k: v for k, v in values.items() if k in names})
    with tuned(**{k: v for k, v in values.items() if k not in names}):
        return stragglerkit.DDPState(None, config)


def hook_vs_plain(
    rank: int,
    n: int,
    steps: int,
    late_rank: int,
    late_from: int,
    late_s: float,
    force_optcc_at: int,
    cfg: dict,
    views: bool = False,
) -> dict[str, Any]:
    """Train the same model with plain DDP and with the hook; the hooked one sees a late rank.

    ``views``: both with ``gradient_as_bucket_view=True`` and gradients zeroed in place (they stay
    views of DDP's buckets, so the hook's averaging replaces DDP's own division pass)."""
    import stragglerkit
    from stragglerkit.detect.controller import Decision, Plan

    _init(cfg)
    plain = DDP(_model(0), bucket_cap_mb=0.05, gradient_as_bucket_view=views)
    hooked = DDP(_model(0), bucket_cap_mb=0.05, gradient_as_bucket_view=views)
    state = _state(dict(cfg))
    hooked.register_comm_hook(state, stragglerkit.ddp_hook)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.05)
    opt_hooked = torch.optim.SGD(hooked.parameters(), lr=0.05)
    algorithms: list[str] = []
    bucket_algorithms: list[list[tuple[int, str]]] = []
    probe_every: list[int] = []  # the probe interval in force after each step
    exchange_every: list[int] = []  # the exchange interval in force after each step
    exchanges: list[int] = []  # the steps an exchange was issued at
    diffs: list[float] = []
    checksums: list[float] = []
    for step in range(steps):
        if step == force_optcc_at:  # white-box: every rank adopts the same OptCC plan at this step
            plan = Plan("ring", ("optcc",) * 8, None, ((1, 2.0),))
            # with the probe interval rank 0 ships with an OptCC plan
            every = state.loop.settings.plan_probe_every
            state.loop.adopt(Decision(10_000, step, plan, [], every))
        x, y = _batch(rank, step)
        for model, opt, late in ((plain, opt_plain, False), (hooked, opt_hooked, True)):
            opt.zero_grad(set_to_none=not views)
            loss = nn.functional.mse_loss(model(x), y)
            if late and rank == late_rank and step >= late_from:
                time.sleep(late_s)
            loss.backward()
            opt.step()
        algorithms.append(state.algorithm)
        probe_every.append(state.loop.controller.probe_every)
        exchange_every.append(state.loop.controller.exchange_every)
        if state.loop.exchange.last_exchange != (exchanges[-1] if exchanges else 0):
            exchanges.append(state.loop.exchange.last_exchange)
        ran = sorted(state.loop.profiler.buckets(step), key=lambda t: t.bucket)
        bucket_algorithms.append([(t.nbytes, t.algorithm) for t in ran])
        with torch.no_grad():
            flat_plain = torch.cat([p.flatten() for p in plain.parameters()])
            flat_hooked = torch.cat([p.flatten() for p in hooked.parameters()])
            diffs.append(float((flat_plain - flat_hooked).abs().max()))
            checksums.append(flat_hooked.double().mul(torch.arange(flat_hooked.numel()) % 7 + 1).sum().item())
    state.close()
    return {
        "diffs": diffs,
        "checksums": checksums,
        "hooked": torch.cat([p.detach().flatten() for p in hooked.parameters()]).numpy().copy(),
        "scale": max(float(p.detach().abs().max()) for p in plain.parameters()),
        "algorithms": algorithms,
        "bucket_algorithms": bucket_algorithms,
        "probe_every": probe_every,
        "exchange_every": exchange_every,
        "exchanges": exchanges,
        "events": state.events,
        "step": state.step,
    }


def straggler_run(
    rank: int, n: int, steps: int, phases: list[tuple[int, int]], jitter: bool, floor_s: float, cfg: dict
) -> Any:
    """Hooked training; ``phases`` = [(from_step, late_rank)] say who sleeps before backward.

    The sleep is ``delay = max(2 x StragglAR's measured pre-phase time, floor_s)``. With ``jitter``
    every rank instead sleeps uniform(0, delay) each step (its own random stream).
    """
    import stragglerkit

    _init(cfg, event_log=os.environ.get("SK_TEST_EVENT_LOG"))
    delay = max(2 * prephase_seconds(rank, n, gradient_numel(), n - 1), floor_s)

    hooked = DDP(_model(0), bucket_cap_mb=0.05)
    state = _state(dict(cfg))
    hooked.register_comm_hook(state, stragglerkit.ddp_hook)
    opt = torch.optim.SGD(hooked.parameters(), lr=0.05)
    rng = random.Random(rank)
    algorithms = []
    for step in range(steps):
        x, y = _batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(hooked(x), y)
        late = [who for start, who in phases if step >= start]
        if late and late[-1] == rank:
            time.sleep(delay)
        if jitter:
            time.sleep(rng.uniform(0, delay))
        loss.backward()
        opt.step()
        algorithms.append((state.algorithm, state.loop.rank_map))
    state.close()
    params = torch.cat([p.detach().flatten() for p in hooked.parameters()]).numpy().copy()
    return {
        "events": state.events,
        "algorithms": algorithms,
        "params": params,
        "step": state.step,
        "delay": delay,
        "offsets": (state.loop.clock_offsets.offset_ns, state.loop.clock_offsets.rtt_ns),
    }


def fault_run(rank: int, n: int, fault: str, fault_step: int, cfg: dict) -> str:
    """Hooked training where rank 2 exits or stalls at ``fault_step``; returns the error as
    ``"<type> peer=<peer>: <message>"``."""
    import stragglerkit

    _init(cfg)
    hooked = DDP(_model(0), bucket_cap_mb=0.05)
    state = _state(dict(cfg))
    hooked.register_comm_hook(state, stragglerkit.ddp_hook)
    opt = torch.optim.SGD(hooked.parameters(), lr=0.05)
    try:
        for step in range(fault_step + 5):
            x, y = _batch(rank, step)
            opt.zero_grad()
            loss = nn.functional.mse_loss(hooked(x), y)
            if step == fault_step and rank == 2:
                if fault == "dies":
                    os._exit(0)
                time.sleep(3 * state.loop.settings.timeout)
            loss.backward()
            opt.step()
    except Exception as err:
        return f"{type(err).__name__} peer={getattr(err, 'peer', None)}: {err}"
    dist.barrier()
    return "ok"


def clock_run(rank: int, n: int, steps: int, jump_at: int, cfg: dict) -> dict[str, Any]:
    """Hooked training where the last rank's wall clock runs 30 ms ahead of the others and jumps
    to 80 ms ahead at ``jump_at`` (as an NTP step would; a process cannot have a system clock of
    its own, so this rank's ``time.time_ns`` adds the offset). Returns, after every step, the
    offsets the hook holds, and its clock re-measurements."""
    import stragglerkit

    ahead_ns = [0]
    if rank == n - 1:
        real_time_ns = time.time_ns
        ahead_ns[0] = 30_000_000
        time.time_ns = lambda: real_time_ns() + ahead_ns[0]
    _init(cfg)
    hooked = DDP(_model(0), bucket_cap_mb=0.05)
    state = _state(dict(cfg))
    hooked.register_comm_hook(state, stragglerkit.ddp_hook)
    opt = torch.optim.SGD(hooked.parameters(), lr=0.05)
    offsets = []
    for step in range(steps):
        if step == jump_at and rank == n - 1:
            ahead_ns[0] = 80_000_000
        x, y = _batch(rank, step)
        opt.zero_grad()
        nn.functional.mse_loss(hooked(x), y).backward()
        opt.step()
        offsets.append(list(state.loop.clock_offsets.offset_ns))
    state.close()
    return {"offsets": offsets, "syncs": list(state.loop.clock_syncs)}


def prephase_seconds(rank: int, n: int, numel: int, straggler: int, hold_s: float = 0.2) -> float:
    """StragglAR's pre-phase time on ``numel`` floats here: the punctual ranks' reduce-scatter, measured
    with the straggler held back (the slowest punctual rank's last pre-phase completion, max over 3 runs)."""
    import stragglerkit

    x = torch.ones(numel)
    stragglerkit.all_reduce(x, algorithm="stragglar", straggler=straggler)  # plan built, connections open
    longest = 0.0
    for _ in range(3):
        dist.barrier()
        if rank == straggler:
            time.sleep(hold_s)
        start = time.monotonic_ns()
        stragglerkit.all_reduce(x, algorithm="stragglar", straggler=straggler)
        record = stragglerkit.last_run()
        assert record is not None
        ends = [t.end_ns for label, t in record.labelled_timings() if label.startswith("reduce_scatter")]
        if ends:
            longest = max(longest, (max(ends) - start) / 1e9)
    result = torch.tensor([longest], dtype=torch.float64)
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return float(result[0])


def gradient_numel() -> int:
    return sum(p.numel() for p in _model(0).parameters())


def exchange_rounds(rank: int, n: int, rounds: int) -> dict[str, Any]:
    """Exchanges on a gloo group: every rank sends figures of its own, rank 0 a decision; what rank
    0 receives of every rank and what every rank decodes of rank 0's decision. Round ``r`` carries
    ``2 + 4 (r % 2)`` steps (the exchange interval changes between rounds, on every rank alike)."""
    from stragglerkit.detect.arrival import StepArrival
    from stragglerkit.detect.controller import Decision, Plan
    from stragglerkit.detect.exchange import StatsExchange

    exchange = StatsExchange(dist.new_group(backend="gloo"), world_size=n, rank=rank, buckets=4)
    seen: list[Any] = []
    for r in range(rounds):
        steps = 2 + 4 * (r % 2)
        arrivals = [
            StepArrival(
                step=2 * r + i,
                total_span=100.0 * rank + 10 * r + i,
                arrival_wall=0.0,
                bucket_spans=(),
                bucket_bytes=(),
                algorithms=(),
            )
            for i in range(steps)
        ]
        decision = None
        if rank == 0:
            plan = Plan("allreduce", ("stragglar", "allreduce"), r % n, ())
            kinds = [{"kind": "switch", "evidence": {}}, {"kind": "exchange", "evidence": {}}]
            decision = Decision(r + 1, 2 * r + 4, plan, kinds, 8 * (r + 1), 2 + 4 * ((r + 1) % 2))
        pending = exchange.start(exchange.pack(2 * r, arrivals, float("nan"), rank, decision), 2 * r)
        rows = exchange.wait(pending)
        decoded = exchange.decision(rows)
        entry: dict[str, Any] = {
            "decision": None
            if decoded is None
            else (
                decoded.seq,
                decoded.step,
                decoded.plan,
                decoded.probe_every,
                decoded.exchange_every,
                [e["kind"] for e in decoded.events],
            )
        }
        if rank == 0:
            stats = exchange.stats(rows, [1000, 2000], [["allreduce", "allreduce"]] * steps)
            entry["totals"] = stats.totals.tolist()
            entry["hosts"] = stats.hosts
        seen.append(entry)
    return {"seen": seen, "rows_shape": list(rows.shape)}


def state_validation(rank: int, n: int) -> dict[str, str]:
    """DDPState before ``stragglerkit.init`` and with a bad configuration: the errors' types and texts."""
    import stragglerkit

    def error_of(make: Any) -> str:
        try:
            make()
        except Exception as err:
            return f"{type(err).__name__}: {err}"
        return "ok"

    out = {"before_init": error_of(lambda: stragglerkit.DDPState(None))}
    stragglerkit.init()
    out["bad_config"] = error_of(lambda: stragglerkit.DDPState(None, {"warmup_steps": 3}))  # type: ignore[arg-type]
    out["after_close"] = error_of(lambda: stragglerkit.DDPState(None).close())
    restored = pickle.loads(pickle.dumps(stragglerkit.DDPState(None)))  # unbound until bound
    out["unbound"] = error_of(lambda: restored.loop.runtime)
    restored.bind(None)
    out["bound"] = error_of(lambda: restored.loop.runtime)
    return out


def checkpoint_run(
    rank: int, n: int, path: str, restore: dict[str, Any] | None, late_s: float, cfg: dict
) -> dict[str, Any]:
    """Hooked training with the last rank late by ``late_s`` every step, SGD with momentum.

    First run (``restore`` None): once the plan has run StragglAR for 4 steps, rank 0 saves the
    model, the optimizer and the hook's state to ``path`` (``torch.save``), and training goes on
    for 12 more steps. Restored run (``restore`` = the first run's ``{"saved_at", "steps"}``): fresh
    processes load the checkpoint on every rank and train the same steps from ``saved_at``."""
    import stragglerkit

    _init(cfg)
    model = _model(0)
    if restore is None:
        hooked = DDP(model, bucket_cap_mb=0.05)
        opt = torch.optim.SGD(hooked.parameters(), lr=0.05, momentum=0.9)
        state = _state(dict(cfg))
        first, steps = 0, 200
    else:
        checkpoint = torch.load(path, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        hooked = DDP(model, bucket_cap_mb=0.05)
        opt = torch.optim.SGD(hooked.parameters(), lr=0.05, momentum=0.9)
        opt.load_state_dict(checkpoint["optimizer"])
        state = checkpoint["hook"]
        first, steps = restore["saved_at"], restore["steps"]
    restored = {"step": state.step, "events": list(state.events), "plan": state.loop.controller.plan}
    hooked.register_comm_hook(state, stragglerkit.ddp_hook)
    algorithms: list[str] = []
    bucket_algorithms: list[list[str]] = []
    saved: dict[str, Any] = {}
    step = first
    while step < steps:
        x, y = _batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(hooked(x), y)
        if rank == n - 1:
            time.sleep(late_s)
        loss.backward()
        opt.step()
        algorithms.append(state.algorithm)
        bucket_algorithms.append(
            [t.algorithm for t in sorted(state.loop.profiler.buckets(step), key=lambda t: t.bucket)]
        )
        step += 1
        if restore is None and not saved and algorithms[-4:] == ["stragglar"] * 4:
            if rank == 0:
                checkpoint = {"model": model.state_dict(), "optimizer": opt.state_dict(), "hook": state}
                torch.save(checkpoint, path)
            saved = {
                "saved_at": step,
                "steps": step + 12,
                "events": list(state.events),
                "plan": state.loop.controller.plan,
            }
            steps = step + 12
    state.close()
    params = torch.cat([p.detach().flatten() for p in hooked.parameters()]).numpy().copy()
    return {
        "first": first,
        "algorithms": algorithms,
        "bucket_algorithms": bucket_algorithms,
        "params": params,
        "step": state.step,
        "saved": saved,
        "restored": restored,
        "events": state.events,
    }

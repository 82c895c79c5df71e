"""Per-rank bodies of the planner tests (imported by the spawned ranks)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

WORLD = 4
SLOWDOWNS = {3: 2.0}
NUMEL = 1 << 20  # 4 MiB of float32


def fitted_model() -> Any:
    """An online model fitted, as the loop fits it, to ring AllReduces measured on a cluster with
    slower links and lower latency than the default model's: 1 Gbit/s-class NICs (1e8 B/s), 1 us.
    Deterministic, so every rank fits the same parameters (as the loop's decisions would carry them)."""
    from stragglerkit.detect.model import OnlineModel
    from stragglerkit.planner import DEFAULT_PRIOR, Predictor
    from stragglerkit.sim.cost_model import CostModelParams

    truth = Predictor(WORLD, CostModelParams(alpha=1e-6, beta=1 / 1e8))
    model = OnlineModel(WORLD, DEFAULT_PRIOR)
    for step, nbytes in enumerate([1 << 20, 4 << 20, 16 << 20] * 2):
        model.add("ring", nbytes, truth.predict("ring", nbytes), step=step)
    model.refit()
    return model


def loop_choice(model: Any) -> str:
    """The controller's choice for one bucket of NUMEL floats with rank 3's NIC at l = 2, the
    ring as the baseline (what ``auto`` compares with), under ``model``."""
    from stragglerkit.detect.choice import best_plan
    from stragglerkit.detect.settings import Settings

    settings = Settings(baseline="ring")
    plan = best_plan(settings, model, WORLD, None, dict(SLOWDOWNS), None, [NUMEL * 4], 0, lambda *_: False)
    return str(plan.algorithm_for(0))


def auto_choices(rank: int, n: int) -> dict[str, Any]:
    """``all_reduce(algorithm="auto")`` with the default model, then with the fitted one adopted."""
    import stragglerkit
    from stragglerkit.planner import Predictor
    from stragglerkit.session import session_for

    stragglerkit.init()
    try:
        tensor = torch.full((NUMEL,), float(rank + 1))
        stragglerkit.all_reduce(tensor, slowdowns=SLOWDOWNS)
        default = stragglerkit.last_run().algorithm
        correct_default = bool(torch.all(tensor == float(n * (n + 1) // 2)))
        model = fitted_model()
        session_for(None).runtime.adopt_model(model)
        tensor = torch.full((NUMEL,), float(rank + 1))
        stragglerkit.all_reduce(tensor, slowdowns=SLOWDOWNS)
        fitted = stragglerkit.last_run().algorithm
        correct_fitted = bool(torch.all(tensor == float(n * (n + 1) // 2)))
        return {
            "default": default,
            "fitted": fitted,
            "loop_default": loop_choice(Predictor(n)),
            "loop_fitted": loop_choice(model),
            "correct": correct_default and correct_fitted,
        }
    finally:
        stragglerkit.destroy()


def fitted_model_adopted(rank: int, n: int, steps: int) -> dict[str, Any]:
    """DDP training under the hook with probes every other step, so that rank 0's controller fits
    its model; then the model every rank's ``auto`` chooses with, and what ``auto`` ran."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import stragglerkit
    from stragglerkit.detect.settings import tuned
    from stragglerkit.planner import Predictor
    from stragglerkit.session import session_for

    stragglerkit.init()
    try:
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64)), bucket_cap_mb=0.1)
        detection = {"warmup_steps": 2, "probe_every": 2, "quiet_exchange_every": 2}
        with tuned(quiet_probe_every=2):  # probes keep coming while all is quiet
            state = stragglerkit.DDPState(None, session_for(None).config.replace(detection=detection))
        model.register_comm_hook(state, stragglerkit.ddp_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(8, 64, generator=g)).square().mean().backward()
            optimizer.step()
        state.close()
        runtime = session_for(None).runtime
        adopted = runtime.model
        params = adopted.config if isinstance(adopted, Predictor) else None
        tensor = torch.full((NUMEL,), float(rank + 1))
        stragglerkit.all_reduce(tensor, slowdowns=SLOWDOWNS)
        return {
            "params": None if params is None else dataclasses.astuple(params),
            "fitted_on_rank0": bool(state.loop.controller.model.fit_info.get("fitted")) if rank == 0 else None,
            "auto": stragglerkit.last_run().algorithm,
            "planner": None if params is None else loop_choice(Predictor(n, params)),
            "correct": bool(torch.all(tensor == float(n * (n + 1) // 2))),
        }
    finally:
        stragglerkit.destroy()

"""Per-rank bodies of tests/test_megatron.py: megatron-core's own DistributedDataParallel on real
gloo ranks, side by side with the same model under ``stragglerkit.megatron.install``.

Every body builds its models from the same seed on every rank, feeds each rank its own inputs
(seeded by rank, step and micro-batch) and returns plain data: the largest difference between the
two models' reduced gradients per step, and what the loop ran. megatron-core's DDP is built on the
CPU with :func:`examples.megatron.cpu_shim.cuda_calls_on_cpu` (it asks CUDA for the device of
its gradient buffers while it is constructed); nothing else needs it here.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

STEPS = 4
"""Steps per case: step 0 is the loop's warm-up (megatron-core's own collective), 1.. the forced plan."""
BUCKET_SIZE = 600
"""Parameters per megatron-core bucket: three buckets for the model below."""


def _quiet() -> None:
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|deprecated).*")


def _setup(tensor_parallel: int = 1) -> None:
    from megatron.core import parallel_state

    _quiet()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel)


def _stragglerkit_config() -> Any:
    """The loop forced by hand: one warm-up step, no exchange (that could bring rank 0's plan), no probes."""
    import stragglerkit

    return stragglerkit.Config().replace(
        detection={"warmup_steps": 1, "exchange_every": 100, "quiet_exchange_every": 0, "probe_every": 0}
    )


def _megatron_ddp(ddp_fields: dict[str, Any], dtype: torch.dtype, bucket_size: int | None) -> Any:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    from examples.megatron.cpu_shim import cuda_calls_on_cpu

    torch.manual_seed(0)
    width = 32  # with bucket_size 600: three buckets (megatron-core makes one without overlap_grad_reduce)
    layers = [nn.Linear(16, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh()]
    module = nn.Sequential(*layers, nn.Linear(width, 4)).to(dtype)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True)
    ddp_config = DistributedDataParallelConfig(bucket_size=bucket_size, **ddp_fields)
    with cuda_calls_on_cpu():  # megatron-core places its gradient buffers on torch.cuda.current_device()
        return DistributedDataParallel(config, ddp_config, module)


def _train_step(
    model: Any, rank: int, step: int, micro_batches: int, dtype: torch.dtype, start_first: bool = False
) -> torch.Tensor:
    """One step: ``micro_batches`` forward/backward passes (all but the last under ``no_sync``),
    then ``finish_grad_sync``; the reduced gradients, flat, in float64."""
    model.zero_grad_buffer()
    for micro in range(micro_batches):
        generator = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
        x = torch.randn(8, 16, generator=generator).to(dtype)
        sync = micro == micro_batches - 1
        with contextlib.nullcontext() if sync else model.no_sync():
            model(x).float().pow(2).mean().backward()
    if start_first:
        model.start_grad_sync()  # the model-level call before finish_grad_sync (first batch: a no-op after)
    model.finish_grad_sync()
    return torch.cat([p.main_grad.detach().double().flatten() for p in model.module.parameters()])


def _force(state: Any, plan: Any, step: int) -> None:
    """Every rank adopts ``plan`` from ``step`` on, as a decision shipped by rank 0 would."""
    from stragglerkit.plans import Decision

    state.loop.adopt(Decision(10_000 + step, step, plan, []))


def _ran(state: Any, step: int) -> list[str]:
    return [t.algorithm for t in sorted(state.loop.profiler.buckets(step), key=lambda t: t.bucket)]


def _plan(spec: dict[str, Any]) -> Any:
    from stragglerkit.plans import Plan

    slowdowns = tuple((int(rank), float(slowdown)) for rank, slowdown in spec.get("slowdowns", []))
    return Plan(spec["default"], tuple(spec.get("buckets", ())), None, slowdowns)


def side_by_side(
    rank: int, n: int, cases: list[dict[str, Any]], plan_spec: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """For each case: megatron-core's DDP alone and with ``install``; with ``plan_spec`` the loop
    runs that plan from step 1 (else megatron-core's own collective throughout)."""
    import stragglerkit.megatron as skm

    _setup()
    results = []
    for case in cases:
        dtype = getattr(torch, case.get("dtype", "float32"))
        fields = case["ddp"]
        bucket_size = case.get("bucket_size", BUCKET_SIZE)
        micro_batches = case.get("micro_batches", 1)
        plain = _megatron_ddp(fields, dtype, bucket_size)
        ours = _megatron_ddp(fields, dtype, bucket_size)
        off = skm.install(ours, skm.MegatronConfig(straggler_aware_allreduce=False))
        state = skm.install(ours, skm.MegatronConfig(straggler_aware_allreduce=True, config=_stragglerkit_config()))
        assert off is None and state is not None
        diffs: list[float] = []
        scales: list[float] = []
        ran: list[list[str]] = []
        for step in range(STEPS):
            if step == 1 and plan_spec is not None:
                _force(state, _plan(plan_spec), step)
            first = case.get("start_first", False) and step == 0
            expected = _train_step(plain, rank, step, micro_batches, dtype, first)
            got = _train_step(ours, rank, step, micro_batches, dtype, first)
            diffs.append(float((got - expected).abs().max()))
            scales.append(float(expected.abs().max()))
            ran.append(_ran(state, step))
        results.append(
            {
                "case": case,
                "diffs": diffs,
                "scales": scales,
                "ran": ran,
                "steps": state.step,
                "buckets": state.buckets,
                "handles_cleared": all(g.grad_reduce_handle is None for g in ours.bucket_groups),
            }
        )
        state.close()
        assert "start_grad_sync" not in vars(ours.bucket_groups[0])  # megatron-core's own again
    return results


def data_parallel_group_not_world(rank: int, n: int, plan_spec: dict[str, Any]) -> dict[str, Any]:
    """Tensor-parallel size 2 on 4 ranks: data-parallel groups {0, 2} and {1, 3}. The buckets are
    averaged over the rank's data-parallel group only, like megatron-core's own."""
    from megatron.core import parallel_state

    import stragglerkit.megatron as skm

    _setup(tensor_parallel=2)
    fields = {"overlap_grad_reduce": True}
    plain = _megatron_ddp(fields, torch.float32, BUCKET_SIZE)
    ours = _megatron_ddp(fields, torch.float32, BUCKET_SIZE)
    state = skm.install(ours, skm.MegatronConfig(straggler_aware_allreduce=True, config=_stragglerkit_config()))
    assert state is not None
    diffs = []
    ran = []
    grads = []
    for step in range(STEPS):
        if step == 1:
            _force(state, _plan(plan_spec), step)
        expected = _train_step(plain, rank, step, 1, torch.float32)
        got = _train_step(ours, rank, step, 1, torch.float32)
        diffs.append(float((got - expected).abs().max()))
        ran.append(_ran(state, step))
        grads.append(float(got.sum()))
    result = {
        "dp_ranks": dist.get_process_group_ranks(parallel_state.get_data_parallel_group()),
        "loop_ranks": dist.get_process_group_ranks(state.group),
        "loop_world_size": state.loop.world_size,
        "diffs": diffs,
        "ran": ran,
        "grad_sums": grads,
    }
    state.close()
    return result


def distributed_optimizer(rank: int, n: int, event_log: str) -> dict[str, Any]:
    """``use_distributed_optimizer``: megatron-core's own reduce-scatter stays, one note says so."""
    import stragglerkit
    import stragglerkit.megatron as skm

    _setup()
    fields = {"overlap_grad_reduce": True, "use_distributed_optimizer": True}
    plain = _megatron_ddp(fields, torch.float32, BUCKET_SIZE)
    ours = _megatron_ddp(fields, torch.float32, BUCKET_SIZE)
    config = stragglerkit.Config().replace(report={"event_log": event_log})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = skm.install(ours, skm.MegatronConfig(straggler_aware_allreduce=True, config=config))
        again = skm.install(ours, skm.MegatronConfig(straggler_aware_allreduce=True, config=config))
    assert state is not None and again is state
    diffs = []
    for step in range(2):
        expected = _train_step(plain, rank, step, 1, torch.float32)
        got = _train_step(ours, rank, step, 1, torch.float32)
        diffs.append(float((got - expected).abs().max()))
    return {
        "diffs": diffs,
        "routed": state.buckets,
        "algorithm": state.algorithm,
        "wrapped": any("start_grad_sync" in vars(g) for g in ours.bucket_groups),
        "notes": [e["kind"] for e in state.events],
        "warnings": [str(w.message) for w in caught if "stragglerkit" in str(w.message)],
        "log": [json.loads(line) for line in Path(event_log).read_text().splitlines()] if rank == 0 else [],
        "session": stragglerkit.is_initialized(state.group),
    }


def one_rank_errors(rank: int, n: int) -> dict[str, str]:
    """Bad input on a live group: a data-parallel group of one rank; torch's DDP instead of megatron-core's."""
    import stragglerkit.megatron as skm

    _setup()
    errors = {}
    model = _megatron_ddp({"overlap_grad_reduce": True}, torch.float32, BUCKET_SIZE)
    try:
        skm.install(model, skm.MegatronConfig(straggler_aware_allreduce=True))
    except Exception as err:
        errors["dp_size_1"] = f"{type(err).__name__}: {err}"
    torch_ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
    try:
        skm.install(torch_ddp, skm.MegatronConfig(straggler_aware_allreduce=True))
    except Exception as err:
        errors["torch_ddp"] = f"{type(err).__name__}: {err}"
    return errors


def llama_as_gpt_model(rank: int, n: int) -> dict[str, float]:
    """examples/llama's model (perturbed, so that no norm weight is 1) as transformers' Llama and as
    megatron-core's GPTModel after the lab's conversion: their logits and losses on one batch."""
    from megatron.core import tensor_parallel

    from examples.megatron.cpu_shim import cuda_calls_on_cpu
    from profiling.lab.workloads import _shifted, example, megatron_llama

    _setup()
    tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)
    llama = example("llama")
    options = {"hidden": 64, "layers": 2, "heads": 4, "seq_length": 48}
    reference = llama.build_model(64, 2, 4, 48).eval()
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    windows = torch.randint(0, llama.VOCAB, (3, 48), generator=torch.Generator().manual_seed(1))
    shifted = _shifted(windows)
    with cuda_calls_on_cpu(), torch.no_grad():
        _, model = megatron_llama(options, reference.state_dict())
        model.eval()
        logits = model(shifted["tokens"], shifted["position_ids"], None)
        losses = model(shifted["tokens"], shifted["position_ids"], None, labels=shifted["labels"])
        expected = reference(input_ids=windows, labels=windows)
    return {
        "logit_diff": float((logits - expected.logits[:, :-1]).abs().max()),
        "logit_scale": float(expected.logits.abs().max()),
        "loss": float(losses.float().mean()),
        "expected_loss": float(expected.loss),
    }

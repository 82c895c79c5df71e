"""Per-rank body of the multi-process correctness sweep (imported by the spawned ranks)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
SIZES = (0, 1, 7, 1000, (1 << 20) + 3)


def algorithms_for(n: int, slowdowns: dict[int, float] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Every registry algorithm that applies at world size n, with its arguments; ``slowdowns``
    (default: rank 1 at l = 3 from 3 ranks on) for those built for them."""
    from stragglerkit.schedules.registry import Situation, applicable

    straggler = n // 2
    if slowdowns is None:
        slowdowns = {1: 3.0} if n >= 3 else {}
    situation = Situation(world_size=n, straggler=straggler, slowdowns=slowdowns)
    out: list[tuple[str, dict[str, Any]]] = []
    for name in applicable(situation):
        kwargs: dict[str, Any] = {}
        if name in ("stragglar", "direct"):
            kwargs["straggler"] = straggler
        if name in ("optcc", "balanced_ring"):
            kwargs["slowdowns"] = slowdowns
        out.append((name, kwargs))
    return out


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@contextlib.contextmanager
def tuned(tuning: dict[str, Any] | None) -> Iterator[dict[str, int]]:
    """Force the runtime's fixed choices in this rank while the block runs, then restore them.

    ``tuning``: ``wait_mode`` ("ordered" or "concurrent"), ``optcc_message_bytes`` (OptCC's message
    size, so its segment count) and ``optcc_sizing`` ("lp" or "closed_form"), ``closed_form_plans``
    (build every plan from the rank's closed form, as the runtime does above 64 ranks). Yields a
    count of the plans built from a rank's closed form (``"closed_form"``)."""
    from stragglerkit.planner import compiled, policy
    from stragglerkit.runtime.executor import force_wait_mode

    tuning = tuning or {}
    saved = (policy.optcc_segments, policy.OPTCC_SIZING, compiled.SCALE_FROM_RANKS, compiled.one_rank_schedule)
    counts = {"closed_form": 0}
    try:
        force_wait_mode(tuning.get("wait_mode", "auto"))
        if "optcc_message_bytes" in tuning:
            policy.optcc_segments = functools.partial(  # type: ignore[assignment]
                policy.optcc_segments, message_bytes=tuning["optcc_message_bytes"]
            )
        if "optcc_sizing" in tuning:
            policy.OPTCC_SIZING = tuning["optcc_sizing"]
        if tuning.get("closed_form_plans"):  # every plan from its rank's closed form, as above 64 ranks
            one_rank_schedule = compiled.one_rank_schedule

            def counted(*args: Any, **kwargs: Any) -> Any:
                part = one_rank_schedule(*args, **kwargs)
                counts["closed_form"] += part is not None
                return part

            compiled.SCALE_FROM_RANKS = 0  # type: ignore[misc]
            compiled.one_rank_schedule = counted  # type: ignore[assignment]
        yield counts
    finally:
        force_wait_mode("auto")
        policy.optcc_segments, policy.OPTCC_SIZING = saved[0], saved[1]  # type: ignore[assignment]
        compiled.SCALE_FROM_RANKS, compiled.one_rank_schedule = saved[2], saved[3]  # type: ignore[misc]


def sweep(
    rank: int,
    n: int,
    sizes: tuple[int, ...] = SIZES,
    dtypes: tuple[torch.dtype, ...] = DTYPES,
    only: tuple[str, ...] = (),
    slowdowns: dict[int, float] | None = None,
    tuning: dict[str, Any] | None = None,
    device: str = "cpu",
    large_bytes: int = 0,
) -> dict[str, Any]:
    """Run every (algorithm, size, dtype) (the algorithms in ``only``, if given), sum and avg;
    return digests and the worst error / tolerance ratio, under a session of its own
    (``stragglerkit.init`` then ``destroy``: nothing cached from another sweep in this process).

    Each (size, dtype) has one random input per rank, which every algorithm reduces: its sum is
    compared with the exact (float64) sum within 2·n·eps·Σ|x_i| and with torch.distributed's
    all_reduce of the same input within twice that; its avg must have exactly the bits of that
    sum divided by n (torch's division). ``tuning``: see :func:`tuned`. ``device``: where the
    tensors live ("cuda": every rank on the current GPU); ``large_bytes``: one more size per
    dtype, that many bytes plus three elements (odd), summed only."""
    import stragglerkit

    if device == "cuda":
        torch.cuda.set_device(0)
    digests: dict[str, str] = {}
    worst: dict[str, float] = {}
    with tuned(tuning) as counts:
        stragglerkit.init()
        try:
            algorithms = [(name, kw) for name, kw in algorithms_for(n, slowdowns) if not only or name in only]
            for dtype in dtypes:
                large = (large_bytes // dtype.itemsize + 3,) if large_bytes else ()
                for numel in (*sizes, *large):
                    # op avg (divided inside the reductions that finish each chunk's sum) has exactly
                    # the bits of the same algorithm's sum followed by torch's division
                    averaged = numel in sizes and (numel < (1 << 20) or dtype == torch.float32)
                    _one_input(rank, n, numel, dtype, algorithms, device, averaged, digests, worst)
        finally:
            stragglerkit.destroy()
    return {"digests": digests, "worst": worst, "algorithms": [a for a, _ in algorithms], **counts}


def _one_input(
    rank: int,
    n: int,
    numel: int,
    dtype: torch.dtype,
    algorithms: list[tuple[str, dict[str, Any]]],
    device: str,
    averaged: bool,
    digests: dict[str, str],
    worst: dict[str, float],
) -> None:
    """One random input of ``numel`` elements of ``dtype``, reduced by torch and by every algorithm."""
    import stragglerkit

    gen = torch.Generator().manual_seed(hash((rank, numel, str(dtype))) % (1 << 31))
    x = torch.randn(numel, generator=gen, dtype=torch.float32).to(dtype)
    reference = torch.stack([x.double(), x.double().abs()])  # a copy, also for float64
    theirs = x.clone()
    dist.all_reduce(reference)
    dist.all_reduce(theirs)
    exact, sumabs = reference[0], reference[1]
    eps = torch.finfo(dtype).eps
    tol = 2 * n * eps * sumabs + torch.finfo(dtype).tiny
    for algorithm, kwargs in algorithms:
        case = f"{algorithm}/{numel}/{str(dtype).removeprefix('torch.')}"
        ours = x.clone().to(device)
        assert stragglerkit.all_reduce(ours, algorithm=algorithm, **kwargs) is None
        record = stragglerkit.last_run()
        assert record is not None and record.algorithm == algorithm, (case, record)
        ours = ours.cpu()
        digests[case] = digest(ours)
        ratio = ((ours.double() - exact).abs() / tol).max().item() if numel else 0.0
        torch_ratio = ((theirs.double() - ours.double()).abs() / (2 * tol)).max().item() if numel else 0.0
        worst[case] = max(ratio, torch_ratio)
        if averaged:
            mean = x.clone().to(device)
            stragglerkit.all_reduce(mean, algorithm=algorithm, op="avg", **kwargs)
            mean = mean.cpu()
            digests[f"{case}/avg"] = digest(mean)
            worst[f"{case}/avg"] = 0.0 if torch.equal(mean, ours / n) else float("inf")

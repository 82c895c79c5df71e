"""Per-rank body of the multi-process correctness sweep (imported by the spawned ranks)."""

from __future__ import annotations

import hashlib
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
    """Run every (algorithm, size, dtype) (the algorithms in ``only``, if given); return digests
    and the worst error / tolerance ratio.

    ``tuning`` forces the runtime's fixed choices in this rank: ``wait_mode`` ("ordered" or
    "concurrent"), ``optcc_message_bytes`` (OptCC's message size, so its segment count) and
    ``optcc_sizing`` ("lp" or "closed_form"), ``closed_form_plans`` (build every plan from the
    rank's closed form, as the runtime does above 64 ranks). ``device``: where the tensors live ("cuda": every
    rank on the current GPU); ``large_bytes``: one more size per dtype, that many bytes plus three
    elements (odd)."""
    import functools

    import stragglerkit
    from stragglerkit.planner import policy
    from stragglerkit.runtime.executor import force_wait_mode

    tuning = tuning or {}
    force_wait_mode(tuning.get("wait_mode", "auto"))
    if "optcc_message_bytes" in tuning:
        policy.optcc_segments = functools.partial(  # type: ignore[assignment]
            policy.optcc_segments, message_bytes=tuning["optcc_message_bytes"]
        )
    if "optcc_sizing" in tuning:
        policy.OPTCC_SIZING = tuning["optcc_sizing"]
    if tuning.get("closed_form_plans"):  # every plan from its rank's closed form, as above 64 ranks
        from stragglerkit.runtime import runtime

        runtime.SCALE_FROM_RANKS = 0  # type: ignore[misc]
    if device == "cuda":
        torch.cuda.set_device(0)
    stragglerkit.init()
    digests: dict[str, str] = {}
    worst: dict[str, float] = {}
    algorithms = [(name, kwargs) for name, kwargs in algorithms_for(n, slowdowns) if not only or name in only]
    for algorithm, kwargs in algorithms:
        for dtype in dtypes:
            large = (large_bytes // dtype.itemsize + 3,) if large_bytes else ()
            for numel in (*sizes, *large):
                case = f"{algorithm}/{numel}/{str(dtype).removeprefix('torch.')}"
                gen = torch.Generator().manual_seed(hash((rank, numel, str(dtype), algorithm)) % (1 << 31))
                x = torch.randn(numel, generator=gen, dtype=torch.float32).to(dtype)
                reference = torch.stack([x.double(), x.double().abs()])  # a copy, also for float64
                theirs = x.clone()
                dist.all_reduce(reference)
                dist.all_reduce(theirs)
                exact, sumabs = reference[0], reference[1]
                x = x.to(device)
                assert stragglerkit.all_reduce(x, algorithm=algorithm, **kwargs) is None
                x = x.cpu()
                record = stragglerkit.last_run()
                assert record is not None and record.algorithm == algorithm, (case, record)
                digests[case] = digest(x)
                eps = torch.finfo(dtype).eps
                tol = 2 * n * eps * sumabs + torch.finfo(dtype).tiny
                ratio = ((x.double() - exact).abs() / tol).max().item() if numel else 0.0
                torch_ratio = ((theirs.double() - x.double()).abs() / (2 * tol)).max().item() if numel else 0.0
                worst[case] = max(ratio, torch_ratio)
    # op avg (divided inside the reductions that finish each chunk's sum) has exactly the bits of
    # the same algorithm's sum followed by torch's division
    for algorithm, kwargs in algorithms:
        for numel in sizes:
            for dtype in dtypes if numel < (1 << 20) else (torch.float32,):
                case = f"{algorithm}/{numel}/{str(dtype).removeprefix('torch.')}/avg"
                gen = torch.Generator().manual_seed(rank + 17 + numel)
                x = torch.randn(numel, generator=gen).to(dtype).to(device)
                y = x.clone()
                stragglerkit.all_reduce(x, algorithm=algorithm, op="sum", **kwargs)
                stragglerkit.all_reduce(y, algorithm=algorithm, op="avg", **kwargs)
                x, y = x.cpu(), y.cpu()
                digests[case] = digest(y)
                worst[case] = 0.0 if torch.equal(y, x / n) else float("inf")
    return {"digests": digests, "worst": worst, "algorithms": [a for a, _ in algorithms]}

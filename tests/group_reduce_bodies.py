"""Per-rank bodies of the weighted group AllReduce tests (imported by the spawned ranks).

Every rank can build every rank's input (seeded by rank, case, size and dtype), so each rank
computes its reference locally: its group's weighted sum in float64, cast back.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import torch

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
SIZES = (0, 1, 7, 1001)
LARGE = (1 << 20) + 3

CASES: dict[int, list[tuple[list[list[int]], list[list[float]] | None]]] = {
    # (groups, weights): subsets of every size, several at once, ranks in none, given out of order
    3: [
        ([[0, 1, 2]], [[1, 2, 3]]),
        ([[2, 0]], [[5, 1]]),  # rank 1 in no group
        ([[1], [0, 2]], [[4], [0, 0]]),  # a group of one; zero weights: equal shares
        ([[0], [1], [2]], None),
    ],
    4: [
        ([[0, 1], [2, 3]], [[3, 1], [0.25, 0.75]]),
        ([[3, 1, 2]], [[1, 1, 2]]),  # rank 0 in no group
        ([[0, 1, 2, 3]], None),
        ([[3], [1, 0]], [[2], [7, 9]]),
    ],
    5: [
        ([[0, 2, 4], [1, 3]], [[3, 3, 2], [5, 4]]),
        ([[4, 3, 2, 1, 0]], [[1, 2, 3, 4, 5]]),
        ([[1, 2, 3, 4]], None),  # rank 0 in no group
        ([[0, 4], [2]], [[0.1, 0.9], [1]]),  # ranks 1 and 3 in none
    ],
}


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def data(rank: int, case: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000003 * rank + 7919 * case + numel + 31 * DTYPES.index(dtype))
    return torch.randn(numel, generator=gen).to(dtype)


def sweep(rank: int, n: int, ending: str = "") -> dict[str, Any]:
    """Run every case x dtype x size; return per case the digest (members) or whether the tensor
    stayed the same bits (others), and the worst error / tolerance ratio against the reference."""
    import stragglerkit
    from stragglerkit.errors import ConfigError
    from stragglerkit.selective import group_shares, weighted_group_all_reduce

    stragglerkit.init(config=stragglerkit.Config().replace(executor={"timeout": 60.0}))
    out: dict[str, Any] = {"digests": {}, "worst": {}, "untouched": {}, "errors": {}}

    # bad arguments on every rank: ConfigError everywhere, and the calls after them still match up
    for label, groups, weights in (
        ("overlap", [[0, 1], [1, 2]], None),
        ("out_of_range", [[0, n]], None),
        ("empty_group", [[0], []], None),
        ("weights_shape", [[0, 1]], [[1]]),
        ("negative", [[0, 1]], [[1, -1]]),
    ):
        try:
            weighted_group_all_reduce(torch.ones(4), groups, weights)
        except ConfigError as err:
            out["errors"][label] = str(err)
    try:
        weighted_group_all_reduce(torch.ones(4, dtype=torch.int64), [[0, 1]])
    except ConfigError as err:
        out["errors"]["integer"] = str(err)

    for case, (groups, weights) in enumerate(CASES[n]):
        shares = group_shares(groups, weights, n)
        mine = next(((g, row) for g, row in zip(groups, shares) if rank in g), None)
        for dtype in DTYPES:
            large = (LARGE,) if case < 2 and dtype in (torch.float32, torch.bfloat16) else ()
            for numel in (*SIZES, *large):
                key = f"{case}/{numel}/{str(dtype).removeprefix('torch.')}"
                x = data(rank, case, numel, dtype)
                before = x.clone()
                if case == 1 and numel == 7:
                    work = weighted_group_all_reduce(x, groups, weights, async_op=True)
                    assert work is not None and work.wait()
                else:
                    assert weighted_group_all_reduce(x, groups, weights) is None
                record = stragglerkit.last_run()
                assert record is not None and record.algorithm == "group_ring", record
                if mine is None:
                    out["untouched"][key] = torch.equal(x.view(torch.uint8), before.view(torch.uint8))
                    assert record.plan is not None and record.plan.ops.shape[0] == 0
                    continue
                members, member_shares = mine
                terms = [share * data(m, case, numel, dtype).double() for m, share in zip(members, member_shares)]
                exact = torch.stack(terms).sum(0) if terms else torch.zeros(numel, dtype=torch.float64)
                sumabs = torch.stack([t.abs() for t in terms]).sum(0)
                finfo = torch.finfo(dtype)
                tol = 2 * len(members) * finfo.eps * sumabs + finfo.tiny
                ratio = ((x.double() - exact).abs() / tol).max().item() if numel else 0.0
                if len(members) == 1:  # a group of one keeps its own value
                    ratio = 0.0 if torch.equal(x.view(torch.uint8), before.view(torch.uint8)) else float("inf")
                out["digests"][key] = digest(x)
                out["worst"][key] = ratio

    # a plain AllReduce after the group calls: every rank's calls are still numbered alike
    ones = torch.ones(3)
    stragglerkit.all_reduce(ones)
    out["after"] = ones.tolist()

    if ending:
        out["ending"] = ENDINGS[ending](rank, n)
    return out


def mismatched_sizes(rank: int, n: int) -> dict[str, Any]:
    """Members 0 and 1 pass tensors of different sizes; rank 2 is in no group."""
    from stragglerkit.selective import weighted_group_all_reduce

    x = torch.ones(9 if rank == 1 else 8)
    start = time.monotonic()
    try:
        weighted_group_all_reduce(x, [[0, 1]], [[1, 1]])
        outcome = "ok"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    return {"outcome": outcome, "seconds": time.monotonic() - start, "value": x.tolist()}


def bad_weights_on_one_rank(rank: int, n: int) -> dict[str, Any]:
    """Rank 0 passes a negative weight, the others valid ones; groups 0-1 and 2-3."""
    from stragglerkit.errors import PeerError
    from stragglerkit.selective import weighted_group_all_reduce

    weights = [[1, -1], [1, 1]] if rank == 0 else [[1, 1], [1, 1]]
    x = torch.full((5,), float(rank))
    start = time.monotonic()
    try:
        weighted_group_all_reduce(x, [[0, 1], [2, 3]], weights)
        outcome = "ok"
    except PeerError as err:
        outcome = f"PeerError(peer={err.peer}): {err}"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    return {"outcome": outcome, "seconds": time.monotonic() - start, "value": x.tolist()}


def different_weights(rank: int, n: int) -> dict[str, Any]:
    """Rank 0 was given other (valid) weights than ranks 1 and 2 of its group; group 3-4 agrees."""
    from stragglerkit.selective import weighted_group_all_reduce

    weights = [[1, 1, 1], [1, 1]] if rank == 0 else [[1, 1, 2], [1, 1]]
    x = torch.full((6,), float(rank))
    start = time.monotonic()
    try:
        weighted_group_all_reduce(x, [[0, 1, 2], [3, 4]], weights)
        outcome = "ok"
    except Exception as err:
        outcome = f"{type(err).__name__}: {err}"
    return {"outcome": outcome, "seconds": time.monotonic() - start, "value": x.tolist()}


ENDINGS = {
    "mismatched_sizes": mismatched_sizes,
    "bad_weights_on_one_rank": bad_weights_on_one_rank,
    "different_weights": different_weights,
}

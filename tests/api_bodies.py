"""Per-rank bodies of the API tests (imported by the spawned ranks)."""

from __future__ import annotations

import warnings
from typing import Any

import torch


def api_features(rank: int, n: int) -> dict[str, Any]:
    import stragglerkit
    from stragglerkit.runtime.api import FallbackWarning, runtime_for

    out: dict[str, Any] = {}
    expected = torch.full((100,), float(n * (n + 1) // 2))

    # fallback: StragglAR needs an even world size; said once, then silent
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = []
        for _ in range(2):
            x = torch.full((100,), float(rank + 1))
            records.append(stragglerkit.all_reduce(x, algorithm="stragglar", straggler=1))
            assert torch.equal(x, expected)
    fallback = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    out["fallback_warnings"] = fallback
    out["fallback_ran"] = [r.algorithm for r in records]

    # asynchronous calls complete in call order; the future holds the tensor
    a = torch.full((1000,), float(rank + 1))
    b = torch.full((7,), float(rank + 1))
    handle_a = stragglerkit.all_reduce_async(a, algorithm="ring")
    handle_b = stragglerkit.all_reduce_async(b, algorithm="rhd", op="avg")
    c = torch.full((3,), float(rank + 1))
    stragglerkit.all_reduce(c, algorithm="direct", straggler=0)  # queued behind the two
    out["async_ring"] = handle_a.wait().algorithm
    out["future_is_tensor"] = handle_b.future.wait() is b
    out["async_values"] = [a[0].item(), b[0].item(), c[0].item()]

    # a remapped group: logical rank i is played by group rank mapping[i]
    runtime = runtime_for()
    runtime.set_rank_map([(r + 1) % n for r in range(n)])
    x = torch.arange(10, dtype=torch.float64) * (rank + 1)
    record = stragglerkit.all_reduce(x, algorithm="ring")
    out["remapped_ok"] = bool(torch.equal(x, torch.arange(10, dtype=torch.float64) * (n * (n + 1) // 2)))
    out["remapped_peers"] = sorted({t.peer for t in record.timings.records()})
    runtime.set_rank_map(None)

    # timings: one row per message of this rank, positive byte counts, post <= completion
    x = torch.ones(4096)
    record = stragglerkit.all_reduce(x, algorithm="ring")
    rows = record.timings.records()
    out["timing_rows"] = len(rows)
    out["timings_sane"] = all(t.nbytes > 0 and t.start_ns <= t.end_ns for t in rows)
    out["timing_bytes"] = sum(t.nbytes for t in rows)
    return out

"""Per-rank bodies of the API tests (imported by the spawned ranks)."""

from __future__ import annotations

import warnings
from typing import Any

import torch


def api_features(rank: int, n: int) -> dict[str, Any]:
    import stragglerkit
    from stragglerkit.runtime.runtime import FallbackWarning
    from stragglerkit.runtime.session import session_for

    stragglerkit.init()
    out: dict[str, Any] = {}
    expected = torch.full((100,), float(n * (n + 1) // 2))

    # fallback: StragglAR needs an even world size; said once, then silent
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = []
        for _ in range(2):
            x = torch.full((100,), float(rank + 1))
            assert stragglerkit.all_reduce(x, algorithm="stragglar", straggler=1) is None
            records.append(stragglerkit.last_run())
            assert torch.equal(x, expected)
    fallback = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    out["fallback_warnings"] = fallback
    out["fallback_ran"] = [r.algorithm for r in records]

    # asynchronous calls complete in call order; the future holds the tensor
    a = torch.full((1000,), float(rank + 1))
    b = torch.full((7,), float(rank + 1))
    work_a = stragglerkit.all_reduce(a, async_op=True, algorithm="ring")
    work_b = stragglerkit.all_reduce(b, "avg", None, True, algorithm="rhd")
    assert work_a is not None and work_b is not None
    c = torch.full((3,), float(rank + 1))
    stragglerkit.all_reduce(c, algorithm="direct", straggler=0)  # queued behind the two
    out["async_ring"] = work_a.result().algorithm
    out["future_is_tensor"] = work_b.get_future().wait()[0] is b
    out["async_values"] = [a[0].item(), b[0].item(), c[0].item()]

    # a remapped group: logical rank i is played by group rank mapping[i]
    runtime = session_for().runtime
    runtime.set_rank_map([(r + 1) % n for r in range(n)])
    x = torch.arange(10, dtype=torch.float64) * (rank + 1)
    stragglerkit.all_reduce(x, algorithm="ring")
    record = stragglerkit.last_run()
    out["remapped_ok"] = bool(torch.equal(x, torch.arange(10, dtype=torch.float64) * (n * (n + 1) // 2)))
    out["remapped_peers"] = sorted({t.peer for t in record.timings.records()})
    runtime.set_rank_map(None)

    # timings: one row per message of this rank, positive byte counts, post <= completion
    x = torch.ones(4096)
    stragglerkit.all_reduce(x, algorithm="ring")
    record = stragglerkit.last_run()
    rows = record.timings.records()
    out["timing_rows"] = len(rows)
    out["timings_sane"] = all(t.nbytes > 0 and t.start_ns <= t.end_ns for t in rows)
    out["timing_bytes"] = sum(t.nbytes for t in rows)
    return out


def different_window_on_one_rank(rank: int, n: int) -> dict[str, Any]:
    """Rank 1 alone asks for another detection window; what ``init`` raised and how long it took."""
    import time

    import stragglerkit

    config = stragglerkit.Config()
    if rank == 1:
        config = config.replace(detection={"window": 32})
    start = time.monotonic()
    try:
        stragglerkit.init(config=config)
        error = "ok"
        kinds: list[str] = []
    except Exception as err:  # the test inspects type and text
        error = f"{type(err).__name__}: {err}"
        kinds = [kind.__name__ for kind in type(err).__mro__]
    return {"error": error, "kinds": kinds, "seconds": time.monotonic() - start,
            "initialized": stragglerkit.is_initialized()}

"""Per-rank bodies of the API tests (imported by the spawned ranks)."""

from __future__ import annotations

import warnings
from typing import Any

import torch


def api_features(rank: int, n: int) -> dict[str, Any]:
    import stragglerkit
    from stragglerkit.runtime.runtime import FallbackWarning
    from stragglerkit.session import session_for

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
    x = torch.arange(10, dtype=torch.float64) * (rank + 1)
    record = runtime.all_reduce(x, algorithm="ring", rank_map=[(r + 1) % n for r in range(n)])
    out["remapped_ok"] = bool(torch.equal(x, torch.arange(10, dtype=torch.float64) * (n * (n + 1) // 2)))
    out["remapped_peers"] = sorted({t.peer for t in record.timings.records()})

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
    return {
        "error": error,
        "kinds": kinds,
        "seconds": time.monotonic() - start,
        "initialized": stragglerkit.is_initialized(),
    }


PROGRAM_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int64)
PROGRAM_SIZES = (0, 1, 7, 100_003)


def program_input(rank: int, dtype: torch.dtype, numel: int, salt: int = 0) -> torch.Tensor:
    """What rank ``rank`` reduces in :func:`torch_program` (the test rebuilds every rank's input)."""
    seed = 7919 * rank + 31 * numel + PROGRAM_DTYPES.index(dtype) + 100_003 * salt
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(numel, generator=gen, dtype=torch.float64) * 10).to(dtype)
    return torch.randint(-(1 << 40), 1 << 40, (numel,), generator=gen, dtype=dtype)


def torch_program(rank: int, n: int, library: str) -> dict[str, Any]:
    """A program written for ``torch.distributed.all_reduce``; ``library="stragglerkit"`` runs it with
    ``stragglerkit.all_reduce`` after one ``stragglerkit.init()`` (and one for its subgroup)."""
    import torch.distributed as dist

    import stragglerkit

    reduce = dist.all_reduce
    if library == "stragglerkit":
        stragglerkit.init()
        reduce = stragglerkit.all_reduce  # type: ignore[assignment]
    members = list(range(n - 1))  # a user's subgroup: every rank but the last
    subgroup = dist.new_group(members)
    if library == "stragglerkit" and rank in members:
        stragglerkit.init(group=subgroup)
    results: dict[str, bytes] = {}  # the tensors' bytes (tensors would travel as shared memory)
    work_api: dict[str, bool] = {}
    for dtype in PROGRAM_DTYPES:
        for numel in PROGRAM_SIZES:
            case = f"{str(dtype).removeprefix('torch.')}/{numel}"
            t = program_input(rank, dtype, numel)
            work = reduce(t, dist.ReduceOp.SUM, None, True)
            work_api[f"{case}/wait"] = work.wait() is True
            work_api[f"{case}/value_after_wait"] = work.get_future().value()[0] is t
            work_api[f"{case}/future"] = work.get_future().wait()[0] is t
            work_api[f"{case}/completed"] = work.is_completed()
            results[f"{case}/sum_async"] = t.view(torch.uint8).numpy().tobytes()
            if dtype.is_floating_point:
                t = program_input(rank, dtype, numel, salt=1)
                assert reduce(t, dist.ReduceOp.AVG) is None
                results[f"{case}/avg"] = t.view(torch.uint8).numpy().tobytes()
            if rank in members:
                t = program_input(rank, dtype, numel, salt=2)
                assert reduce(t, op=dist.ReduceOp.SUM, group=subgroup) is None
                results[f"{case}/subgroup"] = t.view(torch.uint8).numpy().tobytes()
    return {"results": results, "work_api": work_api}


def before_init(rank: int, n: int) -> dict[str, str]:
    """stragglerkit used after dist.init_process_group but before stragglerkit.init."""
    import stragglerkit

    out = {}
    for name, call in (
        ("all_reduce", lambda: stragglerkit.all_reduce(torch.ones(3))),
        ("last_run", stragglerkit.last_run),
    ):
        try:
            call()
            out[name] = "ok"
        except Exception as err:  # the test inspects type and text
            out[name] = f"{type(err).__name__}: {err}"
    out["is_initialized"] = str(stragglerkit.is_initialized())
    return out


def unsupported_op_on_rank_0(rank: int, n: int) -> dict[str, Any]:
    """Rank 0 passes ReduceOp.MAX, the others SUM, on the first call after init."""
    import time

    import torch.distributed as dist

    import stragglerkit

    stragglerkit.init()
    op = dist.ReduceOp.MAX if rank == 0 else dist.ReduceOp.SUM
    start = time.monotonic()
    try:
        stragglerkit.all_reduce(torch.ones(1000), op)
        error, kinds, peer = "ok", [], None
    except Exception as err:  # the test inspects type and text
        error = f"{type(err).__name__}: {err}"
        kinds = [kind.__name__ for kind in type(err).__mro__]
        peer = getattr(err, "peer", None)
    return {"error": error, "kinds": kinds, "peer": peer, "seconds": time.monotonic() - start}


def what_ran(rank: int, n: int) -> dict[str, Any]:
    """last_run() before any call and after calls naming StragglAR, auto with a straggler, and ring."""
    import stragglerkit

    stragglerkit.init()
    out: dict[str, Any] = {"before": stragglerkit.last_run()}
    for name, kwargs in (
        ("stragglar", {"algorithm": "stragglar", "straggler": 1}),
        ("auto_straggler", {"straggler": 1}),
        ("ring", {"algorithm": "ring"}),
    ):
        t = torch.full((1001,), float(rank + 1))
        stragglerkit.all_reduce(t, **kwargs)  # type: ignore[arg-type]
        record = stragglerkit.last_run()
        assert record is not None
        out[name] = (record.requested, record.algorithm, bool(torch.all(t == n * (n + 1) / 2)))
    work = stragglerkit.all_reduce(torch.ones(10), async_op=True, algorithm="stragglar", straggler=3)
    assert work is not None
    out["async"] = work.result().algorithm
    return out


def init_twice_then_again(rank: int, n: int) -> dict[str, Any]:
    """init twice (refused), destroy, init again with another configuration, and reduce."""
    import stragglerkit

    stragglerkit.init()
    out: dict[str, Any] = {}
    try:
        stragglerkit.init()
        out["second"] = "ok"
    except Exception as err:  # the test inspects type and text
        out["second"] = f"{type(err).__name__}: {err}"
    t = torch.full((5,), float(rank))
    stragglerkit.all_reduce(t)  # the first session still works
    out["first_sum"] = t.tolist()
    stragglerkit.destroy()
    out["after_destroy"] = stragglerkit.is_initialized()
    stragglerkit.init(config=stragglerkit.Config().replace(executor={"timeout": 60.0}))
    from stragglerkit.session import session_for

    out["timeout"] = session_for().runtime.timeout
    t = torch.full((5,), float(rank))
    stragglerkit.all_reduce(t, algorithm="direct", straggler=0)
    out["second_sum"] = t.tolist()
    stragglerkit.destroy()
    return out


def world_of_one(rank: int, n: int) -> dict[str, Any]:
    """Every algorithm on a one-rank group: the tensor stays as it is, with no warning."""
    import warnings

    import stragglerkit
    from stragglerkit.schedules.registry import names

    stragglerkit.init()
    checks: dict[str, bool] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for algorithm in ("auto", *names()):
            for _ in range(50):  # the future must be complete whenever wait() returned
                t = torch.arange(7, dtype=torch.float32)
                work = stragglerkit.all_reduce(t, async_op=True, algorithm=algorithm)
                checks[f"{algorithm}/wait"] = work.wait() is True
                checks[f"{algorithm}/value"] = work.get_future().value()[0] is t
                checks[f"{algorithm}/unchanged"] = torch.equal(t, torch.arange(7, dtype=torch.float32))
            record = stragglerkit.last_run()
            checks[f"{algorithm}/record"] = record is not None and record.algorithm == "none"
    return checks

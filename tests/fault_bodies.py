"""Per-rank bodies of the fault tests (imported by the spawned ranks)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch


def _call(x: torch.Tensor, **kwargs: Any) -> str:
    """Run all_reduce; return 'ok' or 'ExceptionType: message'."""
    import stragglerkit

    try:
        stragglerkit.all_reduce(x, **kwargs)
        return "ok"
    except Exception as err:  # the test inspects type and text
        return f"{type(err).__name__}: {err}"


def bad_arguments_everywhere(rank: int, n: int) -> dict[str, Any]:
    """Every rank makes the same bad calls (local ValueErrors), then a good call must still work."""
    out = {
        "non_contiguous": _call(torch.ones(4, 6).t()),
        "sparse": _call(torch.ones(8).to_sparse()),
        "dtype": _call(torch.ones(8, dtype=torch.int8)),
        "complex": _call(torch.ones(8, dtype=torch.complex64)),
        "op": _call(torch.ones(8), op="max"),
        "avg_int": _call(torch.ones(8, dtype=torch.int32), op="avg"),
        "algorithm": _call(torch.ones(8), algorithm="butterfly"),
        "straggler": _call(torch.ones(8), algorithm="stragglar", straggler=n + 3),
    }
    x = torch.full((1000,), float(rank + 1))
    out["good"] = _call(x, algorithm="ring")
    out["good_value"] = bool(torch.all(x == n * (n + 1) / 2))
    return out


def one_rank_bad_arguments(rank: int, n: int) -> str:
    _call(torch.ones(24), algorithm="ring")  # warm: every rank's abort listener is up
    x = torch.ones(4, 6).t() if rank == 1 else torch.ones(24)
    return _call(x, algorithm="ring")


def one_rank_bad_setting(rank: int, n: int, variable: str) -> str:
    _call(torch.ones(24), algorithm="ring")  # warm: every rank's abort listener is up
    if rank == 1:
        os.environ[variable] = "maybe"
    return _call(torch.ones(24), algorithm="ring")


def one_rank_setting_at_creation(rank: int, n: int, variable: str, value: str) -> str:
    """Rank 1 alone sets ``variable`` before the group's runtime exists (the first call creates it)."""
    if rank == 1:
        os.environ[variable] = value
    first = _call(torch.ones(24), algorithm="ring")
    return first


def size_mismatch(rank: int, n: int) -> dict[str, Any]:
    import stragglerkit.runtime.api as api

    api.runtime_for().timeout = 30.0
    _call(torch.ones(1000), algorithm="ring")  # warm: every rank's abort listener is up
    numel = 1001 if rank == 2 else 1000
    x = torch.full((numel,), float(rank))
    before = x.clone()
    return {"error": _call(x, algorithm="ring"), "unchanged": bool(torch.equal(x, before))}


def dtype_mismatch(rank: int, n: int) -> dict[str, Any]:
    import stragglerkit.runtime.api as api

    api.runtime_for().timeout = 30.0
    _call(torch.ones(1000), algorithm="rhd")  # warm: every rank's abort listener is up
    dtype = torch.float64 if rank == 0 else torch.float32
    x = torch.ones(1000, dtype=dtype)
    before = x.clone()
    return {"error": _call(x, algorithm="rhd"), "unchanged": bool(torch.equal(x, before))}


def dtype_mismatch_notes(rank: int, n: int) -> dict[str, Any]:
    """``dtype_mismatch``; then the abort notes this rank received (on the group the runtime sends over)."""
    import stragglerkit._C as native

    import stragglerkit.runtime.api as api

    out = dtype_mismatch(rank, n)
    time.sleep(1.0)  # notes still on their way when this rank raised
    return {"error": out["error"], "notes": [list(note) for note in native.abort_notes(api.runtime_for().data_group)]}


def peer_dies(rank: int, n: int, queue_hint: Any = None) -> str:
    import torch.distributed as dist

    import stragglerkit.runtime.api as api

    api.runtime_for().timeout = 20.0
    x = torch.ones(1000)
    _call(x, algorithm="ring")  # warm: every rank connected and listening
    dist.barrier()
    if rank == 2:
        os._exit(0)
    time.sleep(0.5)
    return _call(x, algorithm="ring")


def peer_stalls(rank: int, n: int) -> dict[str, Any]:
    import torch.distributed as dist

    import stragglerkit.runtime.api as api

    x = torch.ones(1000)
    _call(x, algorithm="ring")
    dist.barrier()
    api.runtime_for().timeout = 2.0
    if rank == 2:
        api.runtime_for().timeout = 10.0  # so that failing fast on arrival is visible
        time.sleep(5.0)
    start = time.monotonic()
    error = _call(x, algorithm="ring")
    return {"error": error, "seconds": time.monotonic() - start}


def straggler_overlap(rank: int, n: int, algorithm: str, straggler: int, delay: float) -> dict[str, Any]:
    """The straggler arrives `delay` s late; report its arrival and everyone's labelled timings."""
    import torch.distributed as dist

    import stragglerkit

    x = torch.randn(1 << 18)
    stragglerkit.all_reduce(x.clone(), algorithm=algorithm, straggler=straggler)  # warm: plan cached
    dist.barrier()
    if rank == straggler:
        time.sleep(delay)
    arrival = time.monotonic_ns()
    record = stragglerkit.all_reduce(x, algorithm=algorithm, straggler=straggler)
    finished = time.monotonic_ns()
    timings = [(label, t.peer, t.nbytes, t.start_ns, t.end_ns) for label, t in record.labelled_timings()]
    return {"arrival": arrival, "finished": finished, "timings": timings}


def idle_past_the_group_timeout(rank: int, n: int, idle_s: float) -> list[float]:
    """AllReduce, stay idle for longer than the group's timeout, AllReduce again (executor and the
    group's own): the executor's abort-note listener must not let the idle group time out."""
    import datetime

    import torch.distributed as dist

    from stragglerkit.runtime.api import Runtime

    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=1))
    runtime = Runtime(group, timeout=5.0)
    sums = []
    for algorithm in ("ring", "direct"):
        tensor = torch.full((1001,), float(rank + 1))
        runtime.all_reduce(tensor, algorithm)
        sums.append(float(tensor[0]))
        time.sleep(idle_s)
    own = torch.full((3,), float(rank + 1))
    dist.all_reduce(own, group=group)
    sums.append(float(own[0]))
    return sums


def misspelt_setting(rank: int, n: int) -> list[str]:
    """Every rank has STRAGGLERKIT_WAITMODE set; the warnings the first call gives."""
    import warnings

    os.environ["STRAGGLERKIT_WAITMODE"] = "ordered"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _call(torch.ones(24), algorithm="ring") == "ok"
    return [str(w.message) for w in caught if "STRAGGLERKIT" in str(w.message)]

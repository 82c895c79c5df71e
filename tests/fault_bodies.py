"""Per-rank bodies of the fault tests (imported by the spawned ranks)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch


def _init(timeout: float | None = None, wait_mode: str = "auto") -> None:
    """``stragglerkit.init`` on every rank, with the executor's ``timeout`` and wait mode."""
    import stragglerkit
    from stragglerkit.runtime.executor import force_wait_mode

    force_wait_mode(wait_mode)
    config = stragglerkit.Config()
    if timeout is not None:
        config = config.replace(executor={"timeout": timeout})
    stragglerkit.init(config=config)


def _attempt(x: torch.Tensor, **kwargs: Any) -> dict[str, Any]:
    """Run all_reduce; ``error``: 'ok' or 'ExceptionType: message', ``kinds``: the exception's
    class names (its MRO), ``peer``: the rank a PeerError blames."""
    import stragglerkit

    try:
        stragglerkit.all_reduce(x, **kwargs)
        return {"error": "ok", "kinds": [], "peer": None}
    except Exception as err:  # the test inspects type and text
        kinds = [kind.__name__ for kind in type(err).__mro__]
        return {"error": f"{type(err).__name__}: {err}", "kinds": kinds, "peer": getattr(err, "peer", None)}


def _call(x: torch.Tensor, **kwargs: Any) -> str:
    """Run all_reduce; return 'ok' or 'ExceptionType: message'."""
    return str(_attempt(x, **kwargs)["error"])


def blames_its_peer(out: dict[str, Any], culprit: int) -> bool:
    """A PeerError whose ``peer`` is the rank its message blames: ``culprit``, found by this rank
    itself, or the rank whose abort note stopped this one (which may have been told first)."""
    error, peer = out["error"], out["peer"]
    if not error.startswith("PeerError") or peer is None:
        return False
    told = f"aborted because rank {peer} failed" in error
    return told or (peer == culprit and f"rank {culprit} (logical" in error)


def bad_arguments_everywhere(rank: int, n: int) -> dict[str, Any]:
    """Every rank makes the same bad calls (local ConfigErrors), then a good call must still work."""
    _init()
    out = {
        "non_contiguous": _attempt(torch.ones(4, 6).t()),
        "sparse": _attempt(torch.ones(8).to_sparse()),
        "dtype": _attempt(torch.ones(8, dtype=torch.int8)),
        "complex": _attempt(torch.ones(8, dtype=torch.complex64)),
        "op": _attempt(torch.ones(8), op="max"),
        "avg_int": _attempt(torch.ones(8, dtype=torch.int32), op="avg"),
        "algorithm": _attempt(torch.ones(8), algorithm="butterfly"),
        "straggler": _attempt(torch.ones(8), algorithm="stragglar", straggler=n + 3),
    }
    x = torch.full((1000,), float(rank + 1))
    out["good"] = _attempt(x, algorithm="ring")
    out["good_value"] = bool(torch.all(x == n * (n + 1) / 2))
    return out


def one_rank_bad_arguments(rank: int, n: int) -> dict[str, Any]:
    _init()
    _call(torch.ones(24), algorithm="ring")  # warm: every rank's abort listener is up
    x = torch.ones(4, 6).t() if rank == 1 else torch.ones(24)
    return _attempt(x, algorithm="ring")


def one_rank_setting_at_init(rank: int, n: int, variable: str, value: str) -> dict[str, Any]:
    """Rank 1 alone sets ``variable`` before ``stragglerkit.init``; what init raised (or 'ok')."""
    import stragglerkit

    if rank == 1:
        os.environ[variable] = value
    try:
        stragglerkit.init()
    except Exception as err:  # the test inspects type and text
        return {"error": f"{type(err).__name__}: {err}", "kinds": [kind.__name__ for kind in type(err).__mro__]}
    return {"error": "ok", "kinds": []}


def size_mismatch(rank: int, n: int, wait_mode: str = "auto") -> dict[str, Any]:
    _init(30.0, wait_mode)
    _call(torch.ones(1000), algorithm="ring")  # warm: every rank's abort listener is up
    numel = 1001 if rank == 2 else 1000
    x = torch.full((numel,), float(rank))
    before = x.clone()
    return {**_attempt(x, algorithm="ring"), "unchanged": bool(torch.equal(x, before))}


def dtype_mismatch(rank: int, n: int, wait_mode: str = "auto") -> dict[str, Any]:
    _init(30.0, wait_mode)
    _call(torch.ones(1000), algorithm="rhd")  # warm: every rank's abort listener is up
    dtype = torch.float64 if rank == 0 else torch.float32
    x = torch.ones(1000, dtype=dtype)
    before = x.clone()
    return {**_attempt(x, algorithm="rhd"), "unchanged": bool(torch.equal(x, before))}


def dtype_mismatch_notes(rank: int, n: int) -> dict[str, Any]:
    """``dtype_mismatch``; then the abort notes this rank received (on the group the runtime sends over)."""
    import stragglerkit._C as native

    from stragglerkit.session import session_for

    out = dtype_mismatch(rank, n)
    time.sleep(1.0)  # notes still on their way when this rank raised
    data_group = session_for().runtime.data_group
    return {"error": out["error"], "notes": [list(note) for note in native.abort_notes(data_group)]}


def peer_dies(rank: int, n: int, wait_mode: str = "auto") -> dict[str, Any]:
    import torch.distributed as dist

    _init(20.0, wait_mode)
    x = torch.ones(1000)
    _call(x, algorithm="ring")  # warm: every rank connected and listening
    dist.barrier()
    if rank == 2:
        os._exit(0)
    time.sleep(0.5)
    return _attempt(x, algorithm="ring")


def peer_stalls(rank: int, n: int, wait_mode: str = "auto") -> dict[str, Any]:
    import torch.distributed as dist

    from stragglerkit.session import session_for

    _init(wait_mode=wait_mode)
    runtime = session_for().runtime
    x = torch.ones(1000)
    _call(x, algorithm="ring")
    dist.barrier()
    runtime.timeout = 2.0
    if rank == 2:
        runtime.timeout = 10.0  # so that failing fast on arrival is visible
        time.sleep(5.0)
    start = time.monotonic()
    out = _attempt(x, algorithm="ring")
    return {**out, "seconds": time.monotonic() - start}


def straggler_overlap(rank: int, n: int, algorithm: str, straggler: int, delay: float) -> dict[str, Any]:
    """The straggler arrives `delay` s late; report its arrival and everyone's labelled timings."""
    import torch.distributed as dist

    import stragglerkit

    stragglerkit.init()
    x = torch.randn(1 << 18)
    stragglerkit.all_reduce(x.clone(), algorithm=algorithm, straggler=straggler)  # warm: plan cached
    dist.barrier()
    if rank == straggler:
        time.sleep(delay)
    arrival = time.monotonic_ns()
    stragglerkit.all_reduce(x, algorithm=algorithm, straggler=straggler)
    finished = time.monotonic_ns()
    record = stragglerkit.last_run()
    assert record is not None
    timings = [(label, t.peer, t.nbytes, t.start_ns, t.end_ns) for label, t in record.labelled_timings()]
    return {"arrival": arrival, "finished": finished, "timings": timings}


def idle_past_the_group_timeout(rank: int, n: int, idle_s: float) -> list[float]:
    """AllReduce, stay idle for longer than the group's timeout, AllReduce again (executor and the
    group's own): the executor's abort-note listener must not let the idle group time out."""
    import datetime

    import torch.distributed as dist

    from stragglerkit import Config
    from stragglerkit.runtime.runtime import Runtime

    group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=1))
    runtime = Runtime(group, Config().replace(executor={"timeout": 5.0}))
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
    """Every rank has STRAGGLERKIT_TIME_OUT set; the warnings init gives."""
    import warnings

    import stragglerkit

    os.environ["STRAGGLERKIT_TIME_OUT"] = "60"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stragglerkit.init()
        assert _call(torch.ones(24), algorithm="ring") == "ok"
    return [str(w.message) for w in caught if "STRAGGLERKIT" in str(w.message)]

"""Spawns a real multi-process group (gloo unless told otherwise) on 127.0.0.1 for the executor tests;
``several`` runs several tests' cases in one such group, one after the other."""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_group", "several"]


def _entry(
    rank: int,
    world_size: int,
    store_path: str,
    backend: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    queue: Any,
) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def run_group(
    world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 240.0, backend: str = "gloo"
) -> dict[int, Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks of a ``backend`` group; return {rank: result}.

    Raises AssertionError with every failing rank's traceback.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_entry, args=(rank, world_size, store_path, backend, fn, args, queue), daemon=True)
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        errors: list[str] = []
        try:
            for _ in range(world_size):
                rank, status, payload = queue.get(timeout=timeout)
                if status == "ok":
                    results[rank] = payload
                else:
                    errors.append(f"rank {rank}:\n{payload}")
        finally:
            for p in procs:
                p.join(timeout=20)
                if p.is_alive():
                    p.kill()
    assert not errors, "\n".join(errors)
    return results


def several(rank: int, world_size: int, cases: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]) -> dict[str, Any]:
    """Each case ({name: (fn, args)}: ``fn(rank, world_size, *args)``) in turn in this process group
    (``run_group(n, several, cases)``), each from a clean slate: no stragglerkit session, the
    executor's own wait mode, and this process's environment and wall clock as they were before
    it; every rank ends a case before the next starts. {name: what ``fn`` returned}; an exception
    names its case."""
    import stragglerkit
    from stragglerkit.runtime.executor import force_wait_mode

    out: dict[str, Any] = {}
    for name, (fn, args) in cases.items():
        environment, time_ns = dict(os.environ), time.time_ns
        try:
            out[name] = fn(rank, world_size, *args)
        except Exception as err:
            raise AssertionError(f"case {name!r} on rank {rank}: {type(err).__name__}: {err}") from err
        finally:
            if stragglerkit.is_initialized():
                stragglerkit.destroy()
            force_wait_mode("auto")
            os.environ.clear()
            os.environ.update(environment)
            time.time_ns = time_ns
        dist.barrier()
    return out

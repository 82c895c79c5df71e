"""Spawns a real multi-process group (gloo unless told otherwise) on 127.0.0.1 for the executor tests."""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_group"]


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

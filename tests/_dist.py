"""Spawns a real multi-process gloo group on 127.0.0.1 for the executor tests."""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["WAIT_MODES", "run_group", "use_wait_mode"]

WAIT_MODES = ["ordered", "concurrent", "concurrent-via-interpreter"]
"""The executor's ways of observing completions (csrc/channel_waiters.h): in the plan's global
order; one waiter thread per channel that handles its completions itself (the default for large
buffers); the same waiters handing every completion to the interpreter's thread."""


def use_wait_mode(monkeypatch: Any, wait_mode: str) -> None:
    """Makes the ranks that the test spawns (they inherit the environment) observe completions
    the ``wait_mode`` way, one of :data:`WAIT_MODES`."""
    if wait_mode not in WAIT_MODES:
        raise ValueError(f"wait mode {wait_mode!r}: one of {WAIT_MODES}")
    monkeypatch.setenv("STRAGGLERKIT_WAIT_MODE", "ordered" if wait_mode == "ordered" else "concurrent")
    monkeypatch.setenv("STRAGGLERKIT_WAITERS_COMPLETE", "off" if wait_mode == "concurrent-via-interpreter" else "on")


def _entry(
    rank: int, world_size: int, store_path: str, fn: Callable[..., Any], args: tuple[Any, ...], queue: Any
) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        queue.put((rank, "ok", result))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))


def run_group(world_size: int, fn: Callable[..., Any], *args: Any, timeout: float = 240.0) -> dict[int, Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return {rank: result}.

    Raises AssertionError with every failing rank's traceback.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_entry, args=(rank, world_size, store_path, fn, args, queue), daemon=True)
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

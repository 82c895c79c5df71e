"""The closed loop's records: the run's id, the run header, and when queued records are written.

**Records** (``Config.report``; docs/event_log.md): with an event log, each writing rank starts
its file with a ``run`` header at its first step (a ``run_id`` that every rank of the job agrees
on through the rendezvous store, the adapter's name, each rank's host), the decisions follow as
they are adopted, and rank 0 adds a ``window`` line per exchange, queued by the controller's
thread and written by the loop's once per exchange, after the step's first bucket went to its
AllReduce. With Weights & Biases on (``report.wandb``) rank 0 hands the same records to
:mod:`stragglerkit.telemetry.wandb`.

:func:`shared_run_id` agrees on the ``run_id``; :func:`start_records` sets up a bound loop's sinks
(:mod:`stragglerkit.loop.sinks`) and leaves this rank's host id for the headers;
:func:`after_first_bucket` writes the header at the first step and what the controller queued
(:func:`take_outbox`) once the step's first bucket is on its way; :func:`flush_records` hands the
sinks what they hold.
"""

from __future__ import annotations

import datetime
import os
import warnings
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from stragglerkit import defaults
from stragglerkit.loop.sinks import NvtxSink, Sinks, WandbSink
from stragglerkit.telemetry.records import new_run_id, run_record
from stragglerkit.telemetry.wandb import wandb_logger

if TYPE_CHECKING:
    from stragglerkit.loop.loop import StragglerLoop

__all__ = [
    "RUN_ID_KEY",
    "after_first_bucket",
    "flush_records",
    "shared_run_id",
    "start_records",
    "take_outbox",
    "write_header",
]

RUN_ID_KEY = "stragglerkit/run_id"
"""The rendezvous store's key under which the first rank to create a loop leaves the run's id."""


def shared_run_id() -> str:
    """The run's id: the first rank to ask leaves a fresh one in the rendezvous store and every
    rank gets that one (``compare_set`` neither waits nor is collective); without a reachable
    store, torchrun's ``TORCHELASTIC_RUN_ID`` or else a fresh one of this rank's own."""
    candidate = new_run_id()
    try:
        store = dist.distributed_c10d._get_default_store()
        return bytes(store.compare_set(RUN_ID_KEY, "", candidate)).decode()
    except Exception:
        elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
        return elastic if elastic and elastic != "none" else candidate


def start_records(loop: StragglerLoop, wandb: bool | None) -> None:
    """The record sinks: the event log, NVTX marks, and W&B on rank 0. This rank's host id is
    left for the others' headers; the header itself is written at the first step."""
    sinks: list[Any] = [loop.event_log, NvtxSink()]
    loop._header_due = loop.event_log.path is not None
    if loop._store is not None:
        try:
            loop._store.set(f"host/{loop.rank}", str(loop._host))
        except Exception as err:  # a header without hosts: not worth failing the set-up for
            warnings.warn(f"stragglerkit could not share this rank's host id: {err!r}", stacklevel=3)
    if loop.rank == 0 and loop.world_size > 1:
        logger = wandb_logger(wandb)
        if logger is not None:
            sinks.append(WandbSink(logger))
    loop._sinks = Sinks(sinks)


def after_first_bucket(loop: StragglerLoop, step: int) -> None:
    """The records' turn, once the step's first bucket is on its way: the header at the first
    step, what the controller queued at an exchange step, and W&B's rows on rank 0."""
    if loop._header_due:
        loop._header_due = False
        write_header(loop)
    if step == loop.exchange.last_exchange:
        take_outbox(loop)
    flush_records(loop)


def take_outbox(loop: StragglerLoop) -> None:
    outbox = loop.controller.outbox
    while outbox:
        loop._sinks.add(outbox.popleft())


def write_header(loop: StragglerLoop) -> None:
    hosts = None
    if loop._store is not None:
        keys = [f"host/{r}" for r in range(loop.world_size)]
        try:  # every rank left its id before its first step: only a rank far behind is waited for
            loop._store.wait(keys, datetime.timedelta(seconds=defaults.HOSTS_WAIT_S))
            hosts = [int(loop._store.get(key)) for key in keys]
        except Exception:
            hosts = None  # a rank that never comes fails the step with its own error
    header = run_record(
        loop.run_id,
        rank=loop.rank,
        world_size=loop.world_size,
        framework=loop.framework,
        hosts=hosts if hosts is not None else ([loop._host] if loop.world_size == 1 else None),
        config=loop.settings,
    )
    loop.event_log.start(header)


def flush_records(loop: StragglerLoop) -> None:
    loop._sinks.flush()
    if loop.event_log not in loop._sinks.sinks:  # not bound: the log alone
        loop.event_log.flush()

"""The fault report's notes (stragglerkit.loop.faults) over a real TCP store, hosted by another
process that ends as soon as it has its own report, as rank 0's does when its error ends it."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any

import torch.distributed as dist

from stragglerkit.loop.faults import REPORT_WAIT_S, compare_notes

TIMEOUT_S = 6.0


def _host(port_out: Any, report_out: Any, world_size: int, step: int, entered_ns: int) -> None:
    """Rank 0: hosts the store, compares notes, reports, and exits at once (``os._exit``)."""
    store = dist.TCPStore("127.0.0.1", 0, world_size, True, wait_for_workers=False)
    port_out.put(store.port)
    report = compare_notes(store, 0, world_size, step=step, entered_ns=entered_ns, timeout=TIMEOUT_S)
    report_out.put((report.ranks, report.text, time.monotonic()))
    report_out.close()
    report_out.join_thread()  # the report is in the pipe before the process ends
    os._exit(0)


def _start_host(world_size: int, step: int, entered_ns: int) -> tuple[Any, Any, Any, int]:
    ctx = mp.get_context("spawn")
    port_out, report_out = ctx.Queue(), ctx.Queue()
    host = ctx.Process(target=_host, args=(port_out, report_out, world_size, step, entered_ns), daemon=True)
    host.start()
    return host, port_out, report_out, port_out.get(timeout=60)


def test_a_rank_that_enters_later_still_reads_every_note_before_the_host_leaves() -> None:
    """Rank 2 died before the step; rank 1 enters its report 1.5 s after rank 0, whose process
    hosts the store and ends right after its own report. Rank 1 must still name rank 2, which it
    can only do if rank 0 stays until rank 1 has concluded."""
    now = time.time_ns()
    host, _, report_out, port = _start_host(3, 5, now)
    try:
        client = dist.TCPStore("127.0.0.1", port, 3, False)
        time.sleep(1.5)
        report = compare_notes(client, 1, 3, step=5, entered_ns=now + 10_000_000, timeout=TIMEOUT_S)
        concluded = time.monotonic()
        host_ranks, host_text, host_left = report_out.get(timeout=30)
    finally:
        host.join(timeout=30)
        if host.is_alive():
            host.kill()
    assert report.ranks == (2,), report.text
    assert host_ranks == (2,), host_text
    assert "rank 2 did not reach step 5" in report.text
    assert host_left >= concluded - 0.2, "the host left before rank 1 had concluded"


def test_the_report_takes_no_longer_than_the_notes_need_when_all_ranks_report() -> None:
    """Every rank reached the step at once: no rank is named and nobody waits out the window."""
    now = time.time_ns()
    host, _, report_out, port = _start_host(2, 3, now)
    try:
        client = dist.TCPStore("127.0.0.1", port, 2, False)
        start = time.monotonic()
        report = compare_notes(client, 1, 2, step=3, entered_ns=now, timeout=TIMEOUT_S)
        took = time.monotonic() - start
        host_ranks, _, _ = report_out.get(timeout=30)
    finally:
        host.join(timeout=30)
    assert report.ranks == () and host_ranks == ()
    assert "every rank reached step 3 in time" in report.text
    assert took < REPORT_WAIT_S, f"took {took:.2f} s with every note there"


def test_a_rank_that_woke_from_a_stall_is_named_late() -> None:
    """A rank that entered half the timeout or more after the first one stalled and failed in turn."""
    now = time.time_ns()
    host, _, report_out, port = _start_host(2, 7, now)
    try:
        client = dist.TCPStore("127.0.0.1", port, 2, False)
        late = now + int(TIMEOUT_S / 2 * 1e9)
        report = compare_notes(client, 1, 2, step=7, entered_ns=late, timeout=TIMEOUT_S)
        host_ranks, _, _ = report_out.get(timeout=30)
    finally:
        host.join(timeout=30)
    assert report.ranks == (1,) and host_ranks == (1,), report.text


def test_without_a_store_nobody_is_named() -> None:
    report = compare_notes(None, 0, 3, 1, 0, TIMEOUT_S)
    assert report.ranks == () and report.text.startswith("no store")

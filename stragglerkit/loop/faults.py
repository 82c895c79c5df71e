"""Fault reports of the closed loop: after a failed AllReduce, which rank did not reach the step.

A rank that dies or stalls makes the AllReduce it missed fail on every other rank after the
configured timeout (``executor.timeout``), with an error that names the peer the transport
blamed, which is not always the rank at fault (a dead rank's neighbour in the ring can be named
by the ranks further along). So each surviving rank compares notes in the rendezvous store:

1. it writes ``reached/<rank>`` = the step that failed and when it entered that step's first
   AllReduce (rank 0's clock, through the clock offsets);
2. it waits up to :data:`REPORT_WAIT_S` for the others' notes;
3. it names the ranks that wrote none, wrote an earlier step, or entered at least half the
   timeout after the first rank (they woke from a stall and failed in turn);
4. it writes ``concluded/<rank>`` and waits (again at most :data:`REPORT_WAIT_S`) until every
   rank whose note it read has concluded too. The store lives in one rank's process (usually
   rank 0's), which may end as soon as it raises; a survivor that entered its wait later would
   then find no store and could name nobody.

Nothing is written or waited for while all is well. The result becomes one
:class:`~stragglerkit.errors.PeerError` whose message says which bucket of which step failed on
this rank, who is to blame and the transport's own error, and whose ``peer`` is the rank named
(if exactly one is).

Example::

    store = report_store(index=0)
    report = compare_notes(store, rank=1, world_size=4, step=8, entered_ns=t, timeout=300.0)
    raise peer_error("stragglerkit all_reduce (algorithm ring, bucket 0 of step 8)", 1, report, err)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch.distributed as dist

from stragglerkit.errors import PeerError

__all__ = ["REPORT_WAIT_S", "FaultReport", "compare_notes", "peer_error", "report_store"]

REPORT_WAIT_S = 2.0
"""After a failed AllReduce, how long a rank waits for the others' notes before naming the missing."""


@dataclass(frozen=True, slots=True)
class FaultReport:
    """Who did not reach a step in time, as the surviving ranks' notes say."""

    text: str
    """One sentence for the error message."""
    ranks: tuple[int, ...] = ()
    """The ranks named as stalled or dead (empty: none could be pinned)."""


def report_store(index: int, group: dist.ProcessGroup | None = None) -> dist.Store | None:
    """The rendezvous store under a prefix of loop ``index``'s own (``None`` if there is none).

    ``group``: the loop's group when it is not the default one; its ranks go into the prefix, so
    that loops of disjoint groups (Megatron's data-parallel groups) never read each other's notes."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # initialised without a store the loop can reach
        return None
    prefix = f"stragglerkit/loop{index}"
    if group is not None and group is not dist.distributed_c10d._get_default_group():
        prefix += "/ranks" + "-".join(map(str, dist.get_process_group_ranks(group)))
    return dist.PrefixStore(prefix, store)


def compare_notes(
    store: dist.Store | None, rank: int, world_size: int, step: int, entered_ns: int, timeout: float
) -> FaultReport:
    """Write this rank's note for ``step`` and name the ranks whose notes are missing or late
    (module docstring). ``entered_ns``: when this rank entered the step, on rank 0's clock."""
    if store is None or world_size == 1:
        return FaultReport("no store to compare notes in: the rank at fault is unknown")
    keys = [f"reached/{r}" for r in range(world_size)]
    notes: dict[int, list[str]] = {}
    try:
        store.set(keys[rank], f"{step} {entered_ns}")
        deadline = time.monotonic() + min(REPORT_WAIT_S, timeout)
        while True:
            for r in range(world_size):  # each note read as soon as it is there
                if r not in notes and store.check([keys[r]]):
                    notes[r] = store.get(keys[r]).decode().split()
            if len(notes) == world_size or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    except Exception as err:  # the store went down too (e.g. with rank 0, which usually hosts it)
        return FaultReport(f"the rendezvous store did not answer ({err}): the rank at fault is unknown")
    _wait_for_conclusions(store, rank, step, sorted(notes), min(REPORT_WAIT_S, timeout))
    first = min(int(entered) for _, entered in notes.values())
    late_ns = timeout / 2 * 1e9
    named = [r for r in range(world_size) if r not in notes]
    for r, (reached, entered) in sorted(notes.items()):
        if int(reached) < step or int(entered) - first >= late_ns:
            named.append(r)
    named.sort()
    if not named:
        return FaultReport(f"every rank reached step {step} in time: the fault is in the network or the process group")
    return FaultReport(
        f"{', '.join(f'rank {r}' for r in named)} did not reach step {step}'s AllReduce in time (no report "
        f"within {REPORT_WAIT_S:g} s, or entered it {late_ns / 1e9:g} s or more after the first rank): "
        "stalled or dead; check its log",
        tuple(named),
    )


def _wait_for_conclusions(store: dist.Store, rank: int, step: int, ranks: list[int], wait_s: float) -> None:
    """Step 4 of the module docstring: say this rank has concluded on ``step`` and wait up to
    ``wait_s`` until ``ranks`` have too, so that this process (maybe the store's) stays until
    they have read every note they need. Only for ranks that are still running: a rank that
    failed the step did not write a note and is not waited for."""
    keys = [f"concluded/{step}/{r}" for r in ranks]
    deadline = time.monotonic() + wait_s
    try:
        store.set(f"concluded/{step}/{rank}", "1")
        while not store.check(keys) and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:  # the store went down: nobody can read notes from it any more
        return


def peer_error(what: str, rank: int, report: FaultReport, cause: BaseException) -> PeerError:
    """The error a surviving rank raises: ``what`` failed on ``rank``, who is to blame, and why.

    ``peer``: the one rank the notes name, else the rank the transport blamed (when ``cause`` is
    a :class:`PeerError`), else ``None``."""
    peer = report.ranks[0] if len(report.ranks) == 1 else None
    if peer is None and isinstance(cause, PeerError):
        peer = cause.peer
    return PeerError(f"{what} failed on rank {rank}: {report.text}; cause: {cause}", peer)

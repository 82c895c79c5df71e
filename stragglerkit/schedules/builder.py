"""The :class:`ScheduleBuilder`: how generators write a schedule, with its data dependencies derived.

Every generator appends its ranks' ops through a builder, which makes each op wait for the earlier
ops of its rank that it conflicts with (per chunk and per scratch slot) and hands back the op's
index; :meth:`ScheduleBuilder.build` returns the :class:`~stragglerkit.schedules.schedule.Schedule`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stragglerkit.schedules.ops import Op, OpKind
from stragglerkit.schedules.schedule import Schedule

__all__ = ["ScheduleBuilder"]

# Bound once: the builder's hot path compares kinds 260,000 times for a schedule at n = 256.
_SEND, _RECV, _RECV_REDUCE, _REDUCE, _COPY = OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE, OpKind.REDUCE, OpKind.COPY


class ScheduleBuilder:
    """Appends ops to per-rank lists, derives their data dependencies, and hands back indices.

    With ``auto_depends`` (the default) every op automatically depends on the earlier ops of its
    rank that it conflicts with: the last op that wrote a chunk or scratch slot it reads or writes
    (read-after-write, write-after-write) and, when it writes, the ops that read it since then
    (write-after-read). Generators therefore state only program order plus any extra ordering they
    want; the executor may run everything else concurrently. The checker re-derives and verifies the
    ordering independently, so a schedule loaded from JSON gets the same guarantee.

    Example::

        b = ScheduleBuilder(world_size=2, num_chunks=2)
        b.send(0, peer=1, chunks=(0, 1), round=0)
        r = b.recv(0, peer=1, chunks=(1, 2), scratch=0, round=0)
        b.reduce(0, scratch=0, chunks=(1, 2))   # depends on r automatically
    """

    __slots__ = ("_readers", "_sreaders", "_swriter", "_writer", "auto_depends", "num_chunks", "ops", "world_size")

    def __init__(self, world_size: int, num_chunks: int, auto_depends: bool = True) -> None:
        self.world_size = world_size
        self.num_chunks = num_chunks
        self.auto_depends = auto_depends
        self.ops: list[list[Op]] = [[] for _ in range(world_size)]
        self._writer: list[list[int] | None] = [None] * world_size
        """Per rank (made on its first op): per chunk, the last op that wrote it (-1: none)."""
        self._readers: list[list[list[int] | None]] = [[] for _ in range(world_size)]
        """Per rank: per chunk, the ops that read it since its last write (``None``: none)."""
        self._swriter: list[dict[int, int]] = [{} for _ in range(world_size)]
        """Per rank: scratch slot -> the last op that wrote it."""
        self._sreaders: list[dict[int, list[int]]] = [{} for _ in range(world_size)]
        """Per rank: scratch slot -> the ops that read it since its last write."""

    def _append(
        self,
        rank: int,
        kind: OpKind,
        chunks: tuple[int, int],
        peer: int | None,
        scratch: int | None,
        depends: Sequence[int] = (),
        round: int | None = None,
        phase: str = "",
    ) -> int:
        """Append an op; with ``auto_depends`` it also waits for the earlier ops of its rank that it
        conflicts with. A write waits for the last write and the reads since; a scratch slot's write
        waits only for the reads since its last write where there are any (each of them waited for
        that write)."""
        rank_ops = self.ops[rank]
        index = len(rank_ops)
        after = depends if type(depends) is tuple else tuple(depends)
        if self.auto_depends:
            deps: list[int] = []
            if scratch is not None:
                swriter, sreaders = self._swriter[rank], self._sreaders[rank]
                if kind is _RECV:  # writes the slot
                    slot_readers = sreaders.get(scratch)
                    if slot_readers:
                        deps += slot_readers
                    elif scratch in swriter:
                        deps.append(swriter[scratch])
                    swriter[scratch] = index
                    sreaders[scratch] = []
                else:  # reduce / copy read the slot
                    if scratch in swriter:
                        deps.append(swriter[scratch])
                    sreaders.setdefault(scratch, []).append(index)
            writer = self._writer[rank]
            if writer is None:  # the per-chunk tables, made once the rank has ops
                writer = self._writer[rank] = [-1] * self.num_chunks
                self._readers[rank] = [None] * self.num_chunks
            readers = self._readers[rank]
            first, stop = chunks
            if stop == first + 1 and kind is not _RECV:  # one chunk, the common case: no loop
                last = writer[first]
                if last >= 0:
                    deps.append(last)
                since = readers[first]
                if kind is _SEND:  # reads it
                    if since is None:
                        readers[first] = [index]
                    else:
                        since.append(index)
                else:  # writes it
                    if since:
                        deps += since
                    writer[first] = index
                    readers[first] = None
            elif kind is _SEND:  # reads the chunks
                for chunk in range(chunks[0], chunks[1]):
                    last = writer[chunk]
                    if last >= 0:
                        deps.append(last)
                    since = readers[chunk]
                    if since is None:
                        readers[chunk] = [index]
                    else:
                        since.append(index)
            elif kind is _RECV and scratch is not None:  # into scratch: after the chunk's last write
                for chunk in range(chunks[0], chunks[1]):
                    last = writer[chunk]
                    if last >= 0:
                        deps.append(last)
            else:  # writes the chunks
                for chunk in range(chunks[0], chunks[1]):
                    last = writer[chunk]
                    if last >= 0:
                        deps.append(last)
                    since = readers[chunk]
                    if since:
                        deps += since
                    writer[chunk] = index
                    readers[chunk] = None
            if after:
                if not set(deps).issubset(after):
                    after = tuple(sorted({*deps, *after}))
            elif len(deps) == 1:
                after = (deps[0],)
            elif deps:
                after = tuple(sorted(set(deps)))
        rank_ops.append(Op(kind, chunks, peer, scratch, after, round, phase))
        return index

    def add(self, rank: int, op: Op) -> int:
        """Append ``op`` to ``rank``'s ops (with ``auto_depends``, adding the dependencies it lacks)."""
        if not self.auto_depends:
            self.ops[rank].append(op)
            return len(self.ops[rank]) - 1
        return self._append(rank, op.kind, op.chunks, op.peer, op.scratch, op.depends, op.round, op.phase)

    def last(self, rank: int) -> int | None:
        """Index of ``rank``'s most recent op, or ``None``."""
        return len(self.ops[rank]) - 1 if self.ops[rank] else None

    # Each returns the new op's index; ``depends``: more ops to wait for; ``round``, ``phase``: tags.
    # (Explicit keywords rather than a **kwargs TypedDict: schedules at n = 256 make 260,000 of these calls.)
    def send(
        self,
        rank: int,
        peer: int,
        chunks: tuple[int, int],
        *,
        depends: Sequence[int] = (),
        round: int | None = None,
        phase: str = "",
    ) -> int:
        return self._append(rank, _SEND, chunks, peer, None, depends, round, phase)

    def recv(
        self,
        rank: int,
        peer: int,
        chunks: tuple[int, int],
        scratch: int | None = None,
        *,
        depends: Sequence[int] = (),
        round: int | None = None,
        phase: str = "",
    ) -> int:
        return self._append(rank, _RECV, chunks, peer, scratch, depends, round, phase)

    def recv_reduce(
        self,
        rank: int,
        peer: int,
        chunks: tuple[int, int],
        *,
        depends: Sequence[int] = (),
        round: int | None = None,
        phase: str = "",
    ) -> int:
        return self._append(rank, _RECV_REDUCE, chunks, peer, None, depends, round, phase)

    def reduce(
        self,
        rank: int,
        scratch: int,
        chunks: tuple[int, int],
        *,
        depends: Sequence[int] = (),
        round: int | None = None,
        phase: str = "",
    ) -> int:
        return self._append(rank, _REDUCE, chunks, None, scratch, depends, round, phase)

    def copy(
        self,
        rank: int,
        scratch: int,
        chunks: tuple[int, int],
        *,
        depends: Sequence[int] = (),
        round: int | None = None,
        phase: str = "",
    ) -> int:
        return self._append(rank, _COPY, chunks, None, scratch, depends, round, phase)

    def build(
        self,
        algorithm: str,
        chunk_sizes: Sequence[int] | None = None,
        round_phase: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> Schedule:
        return Schedule(
            algorithm=algorithm,
            world_size=self.world_size,
            num_chunks=self.num_chunks,
            ops=self.ops,
            chunk_sizes=None if chunk_sizes is None else tuple(chunk_sizes),
            round_phase=round_phase,
            params=dict(params or {}),
        )

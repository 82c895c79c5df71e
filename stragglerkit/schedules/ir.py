"""The Schedule IR: an AllReduce algorithm as data.

A schedule describes an in-place AllReduce among ``world_size`` *logical* ranks whose buffer is
cut into ``num_chunks`` chunks. Each rank has an ordered list of :class:`Op`; an op may depend on
earlier ops of the same rank (``depends`` holds their indices in that rank's list). The executor
starts an op as soon as its dependencies have completed, so two ops without a dependency path
between them may run concurrently; the checker (``check.py``) therefore requires every pair of
ops that touch the same chunk (one of them writing) to be ordered by dependencies.

Ops (``chunks`` is a half-open range ``(start, stop)`` of chunk indices):

==============  ===========================================================================
``send``        send ``buffer[chunks]`` to ``peer``
``recv``        receive from ``peer``: into scratch slot ``scratch`` when given, otherwise
                straight into ``buffer[chunks]`` (overwrite; the all-gather step)
``recv_reduce`` receive from ``peer`` and add into ``buffer[chunks]`` (fused)
``reduce``      ``buffer[chunks] += scratch[scratch]``
``copy``        ``buffer[chunks] = scratch[scratch]``
==============  ===========================================================================

Messages between a pair of ranks match in program order: the k-th ``send`` from a to b is the
k-th ``recv``/``recv_reduce`` on b from a, and both name the same chunk range. Round-based
algorithms tag ops with ``round`` (unique per ``phase``); ``phase`` labels also name NVTX ranges.

Chunk sizes are relative integer weights (``chunk_sizes``; ``None`` means all equal); the runtime's
``plan.py`` turns them into byte offsets for a real bucket.

A *group AllReduce* (schedules/group_ring.py) declares its groups in ``params["groups"]``
(:data:`GROUPS_PARAM`): disjoint lists of ranks, each of which reduces among its own members only;
ranks in no group keep their buffers. The checker proves a schedule against that declaration.

Schedules serialise to JSON with a format version (:meth:`Schedule.to_json`,
:meth:`Schedule.from_json`); the op list is stored as compact arrays in a documented field order.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from stragglerkit.errors import ScheduleError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "GROUPS_PARAM",
    "Op",
    "OpKind",
    "Schedule",
    "ScheduleBuilder",
]

FORMAT_NAME = "stragglerkit.schedule"
FORMAT_VERSION = 1
GROUPS_PARAM = "groups"
"""The ``params`` key of a group AllReduce's groups (a list of disjoint lists of ranks)."""
_OP_FIELDS = ("kind", "start", "stop", "peer", "scratch", "depends", "round", "phase")


class OpKind(StrEnum):
    """What an op does; see the module docstring for the semantics."""

    SEND = "send"
    RECV = "recv"
    RECV_REDUCE = "recv_reduce"
    REDUCE = "reduce"
    COPY = "copy"


_COMM_KINDS = frozenset({OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE})
_RECEIVE_KINDS = frozenset({OpKind.RECV, OpKind.RECV_REDUCE})
# Bound once: the builder's hot path compares kinds 260,000 times for a schedule at n = 256.
_SEND, _RECV, _RECV_REDUCE, _REDUCE, _COPY = OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE, OpKind.REDUCE, OpKind.COPY


@dataclass(slots=True)
class Op:
    """One step of one rank.

    Example::

        Op(OpKind.SEND, chunks=(3, 4), peer=2, round=0, phase="reduce_scatter")
    """

    kind: OpKind
    chunks: tuple[int, int]
    """Half-open range of chunk indices ``(start, stop)`` the op reads or writes."""
    peer: int | None = None
    """Logical peer rank (send, recv, recv_reduce only)."""
    scratch: int | None = None
    """Scratch slot (recv into scratch, reduce, copy)."""
    depends: tuple[int, ...] = ()
    """Indices of earlier ops of the same rank that must complete first."""
    round: int | None = None
    """Round tag for round-based algorithms (at most one send and one receive per rank)."""
    phase: str = ""
    """Phase label (also the NVTX range name), e.g. ``reduce_scatter``, ``matching``."""

    @property
    def is_comm(self) -> bool:
        return self.kind in _COMM_KINDS

    @property
    def is_receive(self) -> bool:
        return self.kind in _RECEIVE_KINDS

    @property
    def num_chunks(self) -> int:
        return self.chunks[1] - self.chunks[0]

    def describe(self) -> str:
        """A short human-readable form, used in error messages and the CLI."""
        start, stop = self.chunks
        span = f"chunk {start}" if stop == start + 1 else f"chunks {start}..{stop - 1}"
        where = ""
        if self.round is not None:
            where = f" [{self.phase or 'round'} {self.round}]" if self.phase else f" [round {self.round}]"
        elif self.phase:
            where = f" [{self.phase}]"
        if self.kind is OpKind.SEND:
            return f"send {span} to {self.peer}{where}"
        if self.kind is OpKind.RECV:
            into = f" into scratch {self.scratch}" if self.scratch is not None else ""
            return f"recv {span} from {self.peer}{into}{where}"
        if self.kind is OpKind.RECV_REDUCE:
            return f"recv_reduce {span} from {self.peer}{where}"
        return f"{self.kind.value} scratch {self.scratch} into {span}{where}"

    def to_row(self) -> list[Any]:
        return [
            self.kind.value,
            self.chunks[0],
            self.chunks[1],
            self.peer,
            self.scratch,
            list(self.depends),
            self.round,
            self.phase,
        ]

    @staticmethod
    def from_row(row: Sequence[Any], where: str) -> Op:
        if not isinstance(row, (list, tuple)) or len(row) != len(_OP_FIELDS):
            raise ScheduleError(f"{where}: expected an op row with fields {list(_OP_FIELDS)}, got {row!r}")
        kind, start, stop, peer, scratch, depends, rnd, phase = row
        try:
            op_kind = OpKind(kind)
        except ValueError:
            valid = ", ".join(k.value for k in OpKind)
            raise ScheduleError(f"{where}: unknown op kind {kind!r}; expected one of {valid}") from None
        return Op(
            kind=op_kind,
            chunks=(int(start), int(stop)),
            peer=None if peer is None else int(peer),
            scratch=None if scratch is None else int(scratch),
            depends=tuple(int(d) for d in depends),
            round=None if rnd is None else int(rnd),
            phase=str(phase),
        )


@dataclass(slots=True)
class Schedule:
    """A whole AllReduce schedule: per-logical-rank op lists plus chunking.

    Example::

        from stragglerkit.schedules import ring, check
        sched = ring(4)
        check(sched)              # raises ScheduleError if anything is wrong
        text = sched.to_json()
        assert Schedule.from_json(text) == sched
    """

    algorithm: str
    world_size: int
    num_chunks: int
    ops: list[list[Op]]
    """``ops[rank]`` is the ordered op list of logical rank ``rank``."""
    chunk_sizes: tuple[int, ...] | None = None
    """Relative chunk sizes (positive integers); ``None`` means equal chunks."""
    round_phase: str | None = None
    """The phase whose rounds are the algorithm's headline round count (``None``: all phases)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Generator parameters (e.g. ``{"straggler": 7}``), kept for reports and JSON."""

    # -- queries -------------------------------------------------------------------------------
    def chunk_weights(self) -> tuple[int, ...]:
        return self.chunk_sizes if self.chunk_sizes is not None else (1,) * self.num_chunks

    def total_weight(self) -> int:
        return sum(self.chunk_weights())

    def num_ops(self) -> int:
        return sum(len(rank_ops) for rank_ops in self.ops)

    def rounds(self, phase: str | None = None) -> int:
        """Number of distinct round tags in ``phase`` (default: :attr:`round_phase`, else all)."""
        wanted = phase if phase is not None else self.round_phase
        tags: set[tuple[str, int]] = set()
        for rank_ops in self.ops:
            for op in rank_ops:
                if op.round is not None and (wanted is None or op.phase == wanted):
                    tags.add((op.phase, op.round))
        return len(tags)

    def phases(self) -> list[str]:
        seen: dict[str, None] = {}
        for rank_ops in self.ops:
            for op in rank_ops:
                seen.setdefault(op.phase, None)
        return list(seen)

    def iter_ops(self) -> Iterator[tuple[int, int, Op]]:
        for rank, rank_ops in enumerate(self.ops):
            for index, op in enumerate(rank_ops):
                yield rank, index, op

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "algorithm": self.algorithm,
            "world_size": self.world_size,
            "num_chunks": self.num_chunks,
            "chunk_sizes": None if self.chunk_sizes is None else list(self.chunk_sizes),
            "round_phase": self.round_phase,
            "params": self.params,
            "op_fields": list(_OP_FIELDS),
            "ranks": [[op.to_row() for op in rank_ops] for rank_ops in self.ops],
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Schedule:
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise ScheduleError(f"not a stragglerkit schedule: expected 'format': {FORMAT_NAME!r}")
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise ScheduleError(
                f"schedule format version {version!r} is not supported by this stragglerkit "
                f"(it reads version {FORMAT_VERSION}); regenerate the schedule with "
                "`stragglerkit schedule ... --json FILE`"
            )
        if list(data.get("op_fields", [])) != list(_OP_FIELDS):
            raise ScheduleError(f"schedule op_fields {data.get('op_fields')!r} != {list(_OP_FIELDS)}")
        try:
            ranks = data["ranks"]
            world_size = int(data["world_size"])
            num_chunks = int(data["num_chunks"])
            algorithm = str(data["algorithm"])
        except KeyError as missing:
            raise ScheduleError(f"schedule JSON lacks the field {missing}") from None
        if len(ranks) != world_size:
            raise ScheduleError(f"schedule JSON has {len(ranks)} rank op lists for world_size {world_size}")
        ops = [
            [Op.from_row(row, f"rank {rank} op {index}") for index, row in enumerate(rank_rows)]
            for rank, rank_rows in enumerate(ranks)
        ]
        sizes = data.get("chunk_sizes")
        return Schedule(
            algorithm=algorithm,
            world_size=world_size,
            num_chunks=num_chunks,
            ops=ops,
            chunk_sizes=None if sizes is None else tuple(int(s) for s in sizes),
            round_phase=data.get("round_phase"),
            params=dict(data.get("params") or {}),
        )

    @staticmethod
    def from_json(text: str) -> Schedule:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ScheduleError(f"schedule JSON does not parse: {err}") from None
        return Schedule.from_dict(data)

    # -- rank mapping --------------------------------------------------------------------------
    def relabel(self, logical_to_new: Sequence[int]) -> Schedule:
        """The same schedule with rank ``r`` renamed ``logical_to_new[r]`` (a permutation).

        Used to put StragglAR's straggler (built as rank n-1) on the real straggler's rank. A group
        AllReduce's declared groups (:data:`GROUPS_PARAM`) are renamed with it.
        """
        n = self.world_size
        if sorted(logical_to_new) != list(range(n)):
            raise ScheduleError(f"relabel needs a permutation of 0..{n - 1}, got {list(logical_to_new)}")
        new_ops: list[list[Op]] = [[] for _ in range(n)]
        for rank, rank_ops in enumerate(self.ops):
            new_ops[logical_to_new[rank]] = [
                op if op.peer is None else _replace_peer(op, logical_to_new[op.peer]) for op in rank_ops
            ]
        params = dict(self.params)
        groups = params.get(GROUPS_PARAM)
        if isinstance(groups, list) and all(
            isinstance(g, list) and all(type(r) is int and 0 <= r < n for r in g) for g in groups
        ):  # (a malformed declaration stays as it is, for the checker to reject)
            params[GROUPS_PARAM] = sorted(sorted(logical_to_new[r] for r in group) for group in groups)
        return Schedule(
            algorithm=self.algorithm,
            world_size=n,
            num_chunks=self.num_chunks,
            ops=new_ops,
            chunk_sizes=self.chunk_sizes,
            round_phase=self.round_phase,
            params=params,
        )


def _replace_peer(op: Op, peer: int) -> Op:
    return Op(op.kind, op.chunks, peer, op.scratch, op.depends, op.round, op.phase)


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

"""Ops of the Schedule IR: :class:`OpKind` and :class:`Op`, one step of one rank.

The semantics of each kind are in :mod:`stragglerkit.schedules.ir`. An op serialises as one row
of :data:`OP_FIELDS` (:meth:`Op.to_row`, :meth:`Op.from_row`), the compact form of a schedule's JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from stragglerkit.errors import ScheduleError

__all__ = ["OP_FIELDS", "Op", "OpKind"]

OP_FIELDS = ("kind", "start", "stop", "peer", "scratch", "depends", "round", "phase")
"""The field order of an op row in a schedule's JSON."""


class OpKind(StrEnum):
    """What an op does; see :mod:`stragglerkit.schedules.ir` for the semantics."""

    SEND = "send"
    RECV = "recv"
    RECV_REDUCE = "recv_reduce"
    REDUCE = "reduce"
    COPY = "copy"


_COMM_KINDS = frozenset({OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE})
_RECEIVE_KINDS = frozenset({OpKind.RECV, OpKind.RECV_REDUCE})


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
        if not isinstance(row, (list, tuple)) or len(row) != len(OP_FIELDS):
            raise ScheduleError(f"{where}: expected an op row with fields {list(OP_FIELDS)}, got {row!r}")
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

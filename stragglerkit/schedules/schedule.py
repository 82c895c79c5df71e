"""The :class:`Schedule`: a whole AllReduce as per-rank op lists, with its JSON form.

A schedule holds every logical rank's ordered :class:`~stragglerkit.schedules.ops.Op` list and the
chunking; it answers queries (rounds, phases, ops), serialises to JSON with a format version
(:meth:`Schedule.to_json`, :meth:`Schedule.from_json`) and renames ranks (:meth:`Schedule.relabel`).
A group AllReduce declares its groups in ``params[GROUPS_PARAM]``. The IR's semantics are in
:mod:`stragglerkit.schedules.ir`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ops import OP_FIELDS, Op

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "GROUPS_PARAM", "Schedule"]

FORMAT_NAME = "stragglerkit.schedule"
FORMAT_VERSION = 1
GROUPS_PARAM = "groups"
"""The ``params`` key of a group AllReduce's groups (a list of disjoint lists of ranks)."""


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
            "op_fields": list(OP_FIELDS),
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
        if list(data.get("op_fields", [])) != list(OP_FIELDS):
            raise ScheduleError(f"schedule op_fields {data.get('op_fields')!r} != {list(OP_FIELDS)}")
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

"""Logical ↔ physical ranks.

Schedules are written for *logical* ranks (StragglAR builds its straggler as logical rank n-1 and
the registry relabels it). The executor sends to *physical* ranks, the ranks of the c10d group. A
:class:`RankMap` holds the permutation; remapping the group therefore needs no new communicator,
only a new plan-cache key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RankMap"]


@dataclass(slots=True, frozen=True)
class RankMap:
    """``to_physical[logical]`` is the group rank that plays logical rank ``logical``.

    Example::

        m = RankMap.from_sequence([2, 0, 1])
        assert m.physical(0) == 2 and m.logical(2) == 0
    """

    to_physical: tuple[int, ...]

    def __post_init__(self) -> None:
        n = len(self.to_physical)
        if sorted(self.to_physical) != list(range(n)):
            raise ValueError(
                f"a rank map must be a permutation of 0..{n - 1} (logical -> group rank), got {list(self.to_physical)}"
            )

    @staticmethod
    def identity(world_size: int) -> RankMap:
        return RankMap(tuple(range(world_size)))

    @staticmethod
    def from_sequence(ranks: Sequence[int] | None, world_size: int | None = None) -> RankMap:
        """``ranks`` as a map, or the identity of ``world_size`` when ``ranks`` is ``None``."""
        if ranks is None:
            if world_size is None:
                raise ValueError("RankMap.from_sequence needs ranks or world_size")
            return RankMap.identity(world_size)
        rank_map = RankMap(tuple(int(r) for r in ranks))
        if world_size is not None and rank_map.world_size != world_size:
            raise ValueError(f"the rank map has {rank_map.world_size} ranks but the group has {world_size}")
        return rank_map

    @property
    def world_size(self) -> int:
        return len(self.to_physical)

    def physical(self, logical: int) -> int:
        return self.to_physical[logical]

    def logical(self, physical: int) -> int:
        try:
            return self.to_physical.index(physical)
        except ValueError:
            raise ValueError(f"rank {physical} is not a rank of this {self.world_size}-rank group") from None

    def is_identity(self) -> bool:
        return self.to_physical == tuple(range(self.world_size))

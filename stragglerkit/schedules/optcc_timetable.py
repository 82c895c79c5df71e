"""OptCC's timetable: the flows of every window and their lowering to ops.

:class:`OptccPlan` is the closed-form pipeline that :func:`~stragglerkit.schedules.optcc.optcc_plan`
computes (:mod:`stragglerkit.schedules.optcc` explains the algorithm and its nomenclature): it maps
any ``(rank, window)`` to its :class:`Flow` s in ``O(1)``, lowers one rank's ops
(:meth:`OptccPlan.rank_ops`) or the whole schedule (:meth:`OptccPlan.lower`), and
:func:`timetable_text` prints it. The multi-server lowering
(:mod:`stragglerkit.schedules.optcc_servers`) reads the same types.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from stragglerkit.schedules.ir import Op, OpKind, Schedule

__all__ = ["ADDING_STAGES", "Flow", "OptccPlan", "timetable_text"]


@dataclass(slots=True, frozen=True)
class Flow:
    """One transfer of the timetable: ``src`` sends ``chunk`` to ``dst`` in ``window``."""

    window: int
    src: int
    dst: int
    chunk: int
    stage: str
    """``reduce_scatter`` (S1), ``upload`` (S2), ``download`` (S3), ``allgather`` (S4),
    ``fill_up`` / ``fill_down`` (bubble filling), ``attach_up`` / ``attach_down`` (other stragglers),
    ``raw_down`` / ``final_up`` (S3 and S2 of the second ordering)."""


@dataclass(slots=True, frozen=True)
class OptccPlan:
    """The closed-form OptCC pipeline: the generated schedule, before lowering (module docstring).

    Example::

        plan = optcc_plan(5, {0: 2.0}, segments=4)
        assert plan.num_windows == 4 * (4 + 2) + 1
        ops = plan.rank_ops(3)          # what rank 3 executes
    """

    world_size: int
    straggler: int
    """The straggler on the upload/download detour (the slowest one)."""
    healthy: tuple[int, ...]
    """Healthy ranks in ring order (increasing): ``healthy[j]`` is ``h_j``."""
    slowdown: float
    segments: int
    section_weight: int
    """Relative size of one section."""
    fill_weight: int
    """Relative size of one fill chunk (0 when ``l >= 2``: no bubble filling)."""
    attached: tuple[int, ...] = ()
    """Further degraded ranks (App. D): each sends its own sections to their owners and gets every
    global sum back from the rank that S returned it to, one exchange per window on a rotating edge."""
    q: int = 0
    """Number of healthy ranks (``len(healthy)``; filled in when left 0)."""
    orderings: int = 1
    """1: every segment S1→S2→S3→S4; 2: odd segments use S3→S1→S4→S2 (see ``_second``)."""
    ramp: int = 0
    """Segments at each end of the pipeline that are smaller than the rest ("The ramp" above):
    segment ``σ`` weighs ``min(ramp + 1, σ + 1, k - σ)`` (0: all segments equal)."""
    weights: tuple[int, ...] = ()
    """Explicit chunk weights (sections, then fills) that replace the closed-form sizes: what
    ``sizing="lp"`` computes ("Sizes by linear programming" above). Empty: the closed form."""

    def __post_init__(self) -> None:
        if self.q == 0:
            object.__setattr__(self, "q", len(self.healthy))
        if self.ramp < 0:
            raise ValueError(f"ramp must be >= 0 (segments at each end that grow), got {self.ramp}")
        if self.weights and (len(self.weights) != self.num_chunks or min(self.weights) < 1):
            raise ValueError(
                f"weights must give each of the plan's {self.num_chunks} chunks a positive integer weight, "
                f"got {len(self.weights)} weights"
            )
        if self.ramp and (self.fill_weight or self.orderings != 1):
            raise ValueError(
                "the ramp is built for the timetable without bubble fills and with one stage ordering "
                f"(fill_weight={self.fill_weight}, orderings={self.orderings}); use ramp=0 there"
            )

    # -- shape ---------------------------------------------------------------------------------
    @property
    def num_fills(self) -> int:
        return self.segments if self.fill_weight else 0

    @property
    def num_chunks(self) -> int:
        return self.segments * self.q + self.num_fills

    @property
    def num_windows(self) -> int:
        """Windows up to the last all-gather hop (the last chain starts ``2..q`` after ``q(k+1)``)."""
        last_download = self.q * (self.segments + 1)
        lane = (last_download + 1) % (self.q - 1)
        return last_download + self.q - lane + self.q - 1

    def segment_weight(self, segment: int) -> int:
        """Relative size of ``segment``'s sections, in units of :attr:`section_weight`."""
        return min(self.ramp + 1, segment + 1, self.segments - segment)

    def chunk_sizes(self) -> tuple[int, ...]:
        if self.weights:
            return self.weights
        sections = tuple(
            self.section_weight * self.segment_weight(chunk // self.q) for chunk in range(self.segments * self.q)
        )
        return sections + (self.fill_weight,) * self.num_fills

    def section_chunk(self, window: int) -> int | None:
        """Chunk uploaded in ``window`` (and downloaded in ``window + 1``), if any."""
        segment = window // self.q - 1
        if 0 <= segment < self.segments:
            return segment * self.q + window % self.q
        return None

    def _second(self, window: int) -> bool:
        """Whether the section uploaded in ``window`` belongs to a segment of the second ordering."""
        segment = window // self.q - 1
        return self.orderings == 2 and segment % 2 == 1 and 0 <= segment < self.segments

    def fill_download_body(self, body: int) -> int:
        """The fill whose sum S downloads in ``body``: the previous body's, but the last fill waits
        until body ``k+1``, after the last section download (see "The tail" above)."""
        k = self.segments
        if body == k + 1:
            return k - 1
        return -1 if body == k else body - 1

    def fill_chunk(self, body: int) -> int | None:
        if self.fill_weight and 0 <= body < self.segments:
            return self.segments * self.q + body
        return None

    # -- the timetable -------------------------------------------------------------------------
    def _rs_chunk(self, lane: int, window: int) -> int | None:
        """Section carried by the S1 chain of ``lane`` in ``window`` (batch ``window div (q-1)``)."""
        batch = window // (self.q - 1)
        return self.section_chunk(self.q + lane + batch * (self.q - 1))

    def _ag_chunks(self, lane: int, window: int) -> Iterator[int]:
        """Section carried by the S4 chain of ``lane`` in ``window`` (none or one).

        The slot of download window ``d`` starts at ``h_{d+1}``. First ordering: S returned section
        ``d-1`` there. Second ordering: ``h_{d+1}`` owns section ``d+1``; but the first two
        sections of a segment find that slot taken by the previous segment's last two, so they take
        the slot one body later (``d+1-q``), which the next segment leaves free.
        """
        q = self.q
        start = window - window % (q - 1)
        download = start - q + lane
        for upload, second in ((download - 1, False), (download + 1, True), (download + 1 - q, True)):
            if upload < 0 or self._second(upload) != second:
                continue
            if second and (upload % q < 2) != (upload == download + 1 - q):
                continue
            chunk = self.section_chunk(upload)
            if chunk is not None:
                yield chunk

    def _straggler_flows(self, window: int) -> Iterator[Flow]:
        q, h, s = self.q, self.healthy, self.straggler
        uploader, downloader = h[window % q], h[(window + 1) % q]
        chunk = self.section_chunk(window)
        if chunk is not None:
            yield Flow(window, uploader, s, chunk, "final_up" if self._second(window) else "upload")
        fill = self.fill_chunk(window // q)
        if fill is not None:
            yield Flow(window, uploader, s, fill, "fill_up")
        chunk = self.section_chunk(window - 1)
        if chunk is not None and not self._second(window - 1):
            yield Flow(window, s, downloader, chunk, "download")
        raw = window + 2 * q - 1  # second ordering: S's own value, to the second rank of the S1 chain
        chunk = self.section_chunk(raw)
        if chunk is not None and self._second(raw):
            yield Flow(window, s, downloader, chunk, "raw_down")
        fill = self.fill_chunk(self.fill_download_body(window // q))
        if fill is not None:
            yield Flow(window, s, downloader, fill, "fill_down")

    # -- attached stragglers (App. D) ----------------------------------------------------------
    def _attached_edge(self, index: int, window: int) -> int:
        """Ring edge of attached straggler ``index`` in ``window``: it walks the ring backwards."""
        return (1 + index * self.q // len(self.attached) - window) % self.q

    def _attached_flows(self, index: int, window: int) -> Iterator[Flow]:
        j = self._attached_edge(index, window)
        rank, h = self.attached[index], self.healthy
        raw = self._attached_raw(j, window)
        if raw is not None:
            yield Flow(window, rank, h[(j + 1) % self.q], raw, "attach_up")
        final = self._attached_final(j, window)
        if final is not None:
            yield Flow(window, h[j], rank, final, "attach_down")

    def _attached_raw(self, edge: int, window: int) -> int | None:
        """Section whose owner ``h_{edge+1}`` uploads next, in the ``q`` windows after ``window``."""
        upload = window + 1 + (edge - window) % self.q
        return self.section_chunk(upload)

    def _attached_final(self, edge: int, window: int) -> int | None:
        """Section that S returned to ``h_edge`` last, in the ``q`` windows before ``window``."""
        download = window - 1 - (window - edge) % self.q
        return self.section_chunk(download - 1)

    def _attached_sends(self, j: int, window: int) -> Iterator[Flow]:
        for index, rank in enumerate(self.attached):
            if self._attached_edge(index, window) == j:
                final = self._attached_final(j, window)
                if final is not None:
                    yield Flow(window, self.healthy[j], rank, final, "attach_down")

    def _attached_receives(self, j: int, window: int) -> Iterator[Flow]:
        for index, rank in enumerate(self.attached):
            edge = (j - 1) % self.q
            if self._attached_edge(index, window) == edge:
                raw = self._attached_raw(edge, window)
                if raw is not None:
                    yield Flow(window, rank, self.healthy[j], raw, "attach_up")

    def _healthy_flows(self, window: int, position: int) -> Iterator[Flow]:
        q, h = self.q, self.healthy
        me = h[(window + 1 + position) % q]
        if position == q - 1:  # the uploader: its ring output is the gap
            for flow in self._straggler_flows(window):
                if flow.src == me:
                    yield flow
        else:
            nxt = h[(window + 2 + position) % q]
            chunk = self._rs_chunk(position, window)
            if chunk is not None:
                yield Flow(window, me, nxt, chunk, "reduce_scatter")
            for chunk in self._ag_chunks(position, window):
                yield Flow(window, me, nxt, chunk, "allgather")
        if position == 0:  # the downloader: its ring input is the gap
            for flow in self._straggler_flows(window):
                if flow.dst == me:
                    yield flow
        else:
            prev = h[(window + position) % q]
            chunk = self._rs_chunk(position - 1, window)
            if chunk is not None:
                yield Flow(window, prev, me, chunk, "reduce_scatter")
            for chunk in self._ag_chunks(position - 1, window):
                yield Flow(window, prev, me, chunk, "allgather")

    def rank_flows(self, rank: int, window: int) -> Iterator[Flow]:
        """The flows ``rank`` sends or receives in ``window``, in its program order (``O(1)``)."""
        if rank == self.straggler:
            yield from self._straggler_flows(window)
            return
        if rank in self.attached:
            yield from self._attached_flows(self.attached.index(rank), window)
            return
        j = self._ring_index(rank)
        if self.attached:
            yield from self._attached_sends(j, window)
            yield from self._attached_receives(j, window)
        yield from self._healthy_flows(window, (j - window - 1) % self.q)

    def brings_a_final(self, rank: int, flow: Flow) -> bool:
        """Whether ``rank`` holds the global sum of ``flow.chunk`` once it has received ``flow``."""
        if flow.dst != rank:
            return False
        if rank == self.straggler:  # S adds its own value last, or receives the final sum
            return flow.stage in ("upload", "fill_up", "final_up")
        if flow.stage in ("download", "allgather", "fill_down", "attach_down"):
            return True
        # second ordering: the S1 chain (which took in S's value) completes at the section's owner
        return (
            flow.stage == "reduce_scatter"
            and self.orderings == 2
            and flow.chunk < self.segments * self.q
            and (flow.chunk // self.q) % 2 == 1
            and self.healthy[flow.chunk % self.q] == rank
        )

    def flows(self, window: int) -> Iterator[Flow]:
        """Every flow of ``window`` (each once, listed by its sender)."""
        for rank in (self.straggler, *self.attached, *self.healthy):
            for flow in self.rank_flows(rank, window):
                if flow.src == rank:
                    yield flow

    def _ring_index(self, rank: int) -> int:
        j = bisect_left(self.healthy, rank)
        if j == self.q or self.healthy[j] != rank:
            raise ValueError(f"rank {rank} is not a healthy rank of this plan")
        return j

    # -- lowering ------------------------------------------------------------------------------
    def rank_ops(self, rank: int, chunk_ranges: list[tuple[int, int]] | None = None) -> list[Op]:
        """The op list of one rank (what the executor of that rank runs): one op per flow.

        Each send depends on the rank's previous send and each receive on its previous receive, so
        a NIC never carries two flows in one direction at once; on top of that every op depends on
        the last op that wrote its chunk and a receive on the sends that read the chunk since (the
        same data dependencies :class:`ScheduleBuilder` derives, computed directly because this
        runs for millions of ops). ``chunk_ranges`` lets :meth:`lower` share the range tuples.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not a rank of 0..{self.world_size - 1}")
        ranges = chunk_ranges if chunk_ranges is not None else [(c, c + 1) for c in range(self.num_chunks)]
        ops: list[Op] = []
        last_send = last_recv = -1
        writer: dict[int, int] = {}
        readers: dict[int, list[int]] = {}
        for window in range(self.num_windows):
            for flow in self.rank_flows(rank, window):
                chunk, index = flow.chunk, len(ops)
                deps = []
                wrote = writer.get(chunk)
                if flow.src == rank:
                    if last_send >= 0:
                        deps.append(last_send)
                    if wrote is not None and wrote != last_send:
                        deps.append(wrote)
                    readers.setdefault(chunk, []).append(index)
                    ops.append(Op(OpKind.SEND, ranges[chunk], flow.dst, None, tuple(sorted(deps)), None, flow.stage))
                    last_send = index
                else:
                    if last_recv >= 0:
                        deps.append(last_recv)
                    if wrote is not None and wrote != last_recv:
                        deps.append(wrote)
                    deps.extend(r for r in readers.pop(chunk, ()) if r not in deps)
                    kind = OpKind.RECV_REDUCE if flow.stage in ADDING_STAGES else OpKind.RECV
                    ops.append(Op(kind, ranges[chunk], flow.src, None, tuple(sorted(deps)), None, flow.stage))
                    writer[chunk] = index
                    last_recv = index
        return ops

    def params(self) -> dict[str, object]:
        return {
            "straggler": self.straggler,
            "attached": list(self.attached),
            "slowdown": self.slowdown,
            "segments": self.segments,
            "section_weight": self.section_weight,
            "fill_weight": self.fill_weight,
            "ramp": self.ramp,
            "orderings": self.orderings,
            "sizing": "lp" if self.weights else "closed_form",
        }

    def lower(self, ranks: Collection[int] | None = None) -> Schedule:
        """The whole schedule in the op IR (for the checker and the simulator); with ``ranks``
        only their ops (the others' lists empty: one rank's plan at scale)."""
        ranges = [(c, c + 1) for c in range(self.num_chunks)]
        ops = [self.rank_ops(rank, ranges) if ranks is None or rank in ranks else [] for rank in range(self.world_size)]
        return Schedule(
            algorithm="optcc",
            world_size=self.world_size,
            num_chunks=self.num_chunks,
            ops=ops,
            chunk_sizes=self.chunk_sizes(),
            params=self.params(),
        )


ADDING_STAGES = frozenset({"reduce_scatter", "upload", "fill_up", "attach_up", "raw_down"})
_STAGE_MARK = {
    "reduce_scatter": "r",
    "upload": "U",
    "download": "D",
    "raw_down": "X",
    "final_up": "V",
    "allgather": "a",
    "fill_up": "F",
    "fill_down": "f",
    "attach_up": "R",
    "attach_down": "d",
}


def timetable_text(plan: OptccPlan, windows: range) -> str:
    """The timetable as text: one row per rank, one column per window, what the rank *sends*.

    ``r`` = S1 hop, ``U`` = upload, ``D`` = download (``>rank``: receiver), ``a`` = S4 hop,
    ``F``/``f`` = fill up/down; then ``section.segment`` (fills: the body).
    """
    cells: dict[tuple[int, int], list[str]] = {}
    for window in windows:
        for flow in plan.flows(window):
            if flow.stage.startswith("fill"):
                label = f"{_STAGE_MARK[flow.stage]}{flow.chunk - plan.segments * plan.q}"
            else:
                segment, section = divmod(flow.chunk, plan.q)
                label = f"{_STAGE_MARK[flow.stage]}{section}.{segment}"
            if flow.stage in ("download", "raw_down"):
                label += f">{flow.dst}"
            cells.setdefault((flow.src, window), []).append(label)
    width = max((len(" ".join(c)) for c in cells.values()), default=1)
    lines = [("window " + " ".join(f"{w:<{width}}" for w in windows)).rstrip()]
    for rank in (plan.straggler, *plan.attached, *plan.healthy):
        if rank in plan.healthy:
            name = f"h{plan.healthy.index(rank)}={rank}"
        else:
            name = f"S={rank}" if rank == plan.straggler else f"A={rank}"
        row = " ".join(f"{' '.join(cells.get((rank, w), ['-'])):<{width}}" for w in windows)
        lines.append(f"{name:<6} {row}".rstrip())
    return "\n".join(lines)

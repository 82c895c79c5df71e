"""OptCC: a pipelined AllReduce that hides the slow NIC of a degraded rank.

From the OptCC paper (Chen et al., "Don't Let a Few Network Failures Slow the Entire AllReduce"),
§4; docs/optcc.md explains the construction and the choices below.

Setting. ``p`` ranks; one *straggler* S whose NIC runs at ``1/l`` of the healthy bandwidth, and the
``q = p - 1`` healthy ranks arranged in a directed ring ``h_0 -> h_1 -> ... -> h_{q-1} -> h_0``
(edge ``e_j`` goes from ``h_j`` to ``h_{j+1}``). The buffer is cut into ``k`` *segments* of ``q``
*sections* each; section ``x`` of a segment is *owned* by ``h_x``. Every section goes through four
stages (OptCC paper, §4.1):

* S1 reduce-scatter: a chain of ``q-1`` hops ``h_{x+1} -> ... -> h_x`` adds the healthy
  contributions (never using edge ``e_x``);
* S2 upload: ``h_x`` sends the healthy partial sum to S; S adds its own contribution;
* S3 download: S sends the global sum back to a healthy rank ``h_y``;
* S4 all-gather: a chain of ``q-1`` hops ``h_y -> ... -> h_{y-1}`` hands the sum to everyone.

S only ever moves one section in and one section out per section of data: the minimum that
Lemma 5 allows. Stages S2/S3 use S's slow link, S1/S4 the healthy ring: disjoint links, so the
pipeline runs them at the same time.

The timetable. Time is cut into *windows* of length ``W = max(2, l)`` section-times (``s``); ``q``
windows form a *body* and in steady state a body carries exactly one segment through every stage.
In window ``t`` (``g = t mod q``) the *gap* is at ``e_g``: ``h_g`` uploads to S and S downloads to
``h_{g+1}``, so the ring edge ``e_g`` is replaced by the detour ``h_g -> S -> h_{g+1}``; every
other edge carries two ring hops (sub-slot 0: S1, sub-slot 1: S4). Seen from the gap, window ``t``
is the line ``h_{t+1} -> h_{t+2} -> ... -> h_t``: node *position* ``i`` is ``h_{t+1+i}`` and edge
position ``i`` joins positions ``i`` and ``i+1``. A *lane* is a fixed edge position ``0..q-2``;
a chain that makes one hop per window in lane ``i`` stays in lane ``i`` while the line turns.

* S1: every lane starts a chain every ``q-1`` windows, all lanes together (batch ``m`` starts at
  window ``m(q-1)``). The chain in lane ``i`` of batch ``m`` ends at its owner, which uploads it at
  window ``u = q + i + m(q-1)``: the uploads of the batches tile the windows ``q, q+1, ...`` with
  exactly one upload per window, and window ``u`` uploads section ``x = u mod q`` of segment
  ``u div q - 1``.
* S2/S3: S receives the section uploaded in window ``u`` and sends the global sum in window
  ``d = u + 1`` to ``h_{d+1}`` (the node at position 0, whose ring input is idle then).
* S4: the download of window ``d`` waits at ``h_{d+1}`` until lane ``i = (d+1) mod (q-1)`` is free
  and leaves in window ``d + q - i``; every lane starts an all-gather chain every ``q-1`` windows.

Every edge/window slot is used at most once per sub-slot, the uploader sends nothing on the ring
and the downloader receives nothing from it: no NIC ever sends or receives two flows at once. In
the op IR each rank's sends are chained by dependencies, and so are its receives, so the executor
and the simulator keep that property; the timetable only fixes the *order*, so the pipeline runs
as fast as the data allows (faster than the windows at the head and tail, where links are idle).

Worked example, p = 5, l = 2, k = 2 (rank 0 is S; h0..h3 are ranks 1..4), as printed by
:func:`timetable_text` (what each rank *sends* per window; ``r2.0`` = S1 hop of section 2 of segment
0, ``U`` upload, ``D0.0>3`` S's download of section 0.0 to rank 3, ``a`` S4 hop)::

    window 0      1      2      3      4      5      6      7      8      9      10     11     12     13
    S=0    -      -      -      -      -      D0.0>3 D1.0>4 D2.0>1 D3.0>2 D0.1>3 D1.1>4 D2.1>1 D3.1>2 -
    h0=1   -      r2.0   r1.0   r3.0   U0.0   r1.1   r3.1   r2.1   U0.1   a2.0   a1.0   a0.0   -      a1.1
    h1=2   r0.0   -      r2.0   r0.1   r3.0   U1.0   -      r3.1   r2.1   U1.1   a2.0   a1.0   a3.0   -
    h2=3   r1.0   r0.0   -      r1.1   r0.1   r3.0   U2.0   -      r3.1   a0.0   U2.1   a2.0   a0.1   a3.0
    h3=4   r2.0   r1.0   r0.0   -      r1.1   r0.1   r2.1   U3.0   -      a1.0   a0.0   U3.1   a1.1   a0.1

The gap walks down the diagonal (h0 uploads in windows 0, 4, 8, 12; S returns each section one
window after its upload, to the rank just past that window's gap). Section 0.0 climbs
h1 -> h2 -> h3 -> h0 in windows 0..2 (lane 0: the sender is always the rank just past the gap),
waits at its owner h0 for its upload window 4, comes back from S to rank 3 in window 5 and is
all-gathered by the chain h2 -> h3 -> h0 -> h1 in windows 9..11.
Per body (4 windows) each healthy rank sends ``2(q-1) = 6`` ring sections and one upload
(``2s`` at l = 2): in steady state the ring and S's link are both full.

Second stage ordering (``orderings=2``, OptCC paper, §4.1: S3→S1→S4→S2 on the odd segments, the
even ones keep S1→S2→S3→S4). Same S1 chains and the same straggler slots; for a section uploaded
in window ``u`` (owner ``h_u``): S sends its own value in window ``u - 2q + 1`` (the download slot,
to ``h_{u-2q+2}``, the chain's second rank, before the chain gets there); the chain thus ends at
the owner with the global sum, which starts the S4 chain in the slot that starts at ``h_u`` (that
of download window ``u - 1``, or ``u - 1 + q`` for a segment's first two sections, whose slots
the previous segment's last two use), and sends it to S in window ``u`` (S2, replacing S's copy).
The odd segments' S3 slots are the even segments' spare ones (two bodies earlier), so the
straggler's downloads end one body sooner. In an event-driven pipeline that buys little (the ring
already runs at full speed before the first upload and after the last download) and it keeps
equal segments, without the ramp below, so ``orderings=1`` is the default (docs/optcc.md, "The
second stage ordering").

Bubble filling (l < 2, OptCC paper, §4.2 and App. C). A window is 2 section-times long but a
straggler flow of one section only ``l``: the straggler link idles ``(2-l)s`` per window. Each
upload/download is therefore followed by a *fill* piece of ``(2-l)/l`` sections: in body ``b``
(``b < k``) every healthy rank uploads its own contribution of fill chunk ``b`` to S, S adds them
all to its own, and in body ``b+1`` it downloads the sum to every healthy rank (a point-to-point
AllReduce through S, at no extra time). Body 0, where S has no section to receive yet, carries
only fill uploads; body ``k`` carries only section uploads. Sections shrink accordingly:
``s' = l·n / (k((p-2)l + 2))``.

The tail (our choice; the paper's figures are not in its text). The last fill, ``k-1``, is
downloaded in body ``k+1``, after S's last section download, not in body ``k`` next to it: a
section download is followed by an S4 chain of ``q-1`` ring hops, a fill download by nothing, so
ending S's link with the fills lets the last chains run while S still sends (they are hidden
entirely when ``q(2-l) >= q-1``, i.e. ``l <= 1 + 1/q``); ``l >= 2`` has no fills and is unchanged.
What remains above the paper's ``(k+l-1)/k`` is the head: S has nothing to send until the first S1
chain (``q-1`` hops) and its upload are done.

The ramp (our choice, for plans without fills). The head and the tail above are a whole segment's
chain each (``q-1`` hops before S's first upload, ``q-1`` after its last download), so they shrink
with the first and last segments. With ``ramp = h`` segment ``σ`` weighs ``min(h+1, σ+1, k-σ)``
(k = 9, h = 3: 1 2 3 4 4 4 3 2 1): the pipeline starts and ends with small sections and keeps
large ones, and its messages, in the body. The timetable does not change, only the chunk sizes;
sections of adjacent segments differ by at most one step of the ramp, so S's link, which takes
its sections one per window, never waits long for a larger segment's chain. In the flow-level
simulator :func:`default_ramp` (``k // 3``) is within 0.5 % of the best ramp length from 4 segments
on (docs/optcc.md, "The ramp"). The fills' timetable and the second ordering keep equal
segments (their fill sizes and early S3 slots are sized for them; ramps simulated slower there),
and so do plans below 4 segments.

Sizes by linear programming (our construction; ``sizing``). The ramp is one guess at the sizes;
the best ones follow from the timetable itself. Each rank's sends and receives are chained, so in
the bandwidth model no two flows share a link, a flow takes its chunk's size times the slower end's
``l``, and the makespan is the longest path through the flows: linear in the chunk sizes along
every path. :mod:`stragglerkit.schedules.chunk_sizing` minimises it by an LP over the sizes
(every chunk at least a quarter of the mean, or its closed-form size if smaller). At ``l < 2``
this removes most of the head the text above describes: the LP gives the first segment's
sections and the first fills small sizes, so S's link starts sending after a short chain, and
sizes the fills to the bubbles segment by segment; at ``l >= 2`` the ramp is already within
0.5 % of the LP. ``sizing="auto"`` takes the LP's sizes where they shorten the modelled time by
:data:`LP_MIN_GAIN` and the plan has at most :data:`~stragglerkit.schedules.chunk_sizing.MAX_FLOWS`
flows, else keeps the closed form; ``sizing="lp"`` always solves. A plain ``optcc(...)`` call
keeps the closed form (``sizing="closed_form"``); the runtime uses ``"auto"``
(:data:`stragglerkit.planner.policy.OPTCC_SIZING`) together with OptCC's short send queues
(``Config.optcc.send_buffer``): the LP balances many paths to the same length, which holds on real
links only while a send holds its link about as long as the timetable has it.

When filling pays (our choice; the paper's evaluation uses deep pipelines). The fills add a
body of fill uploads before the first section and a fill download after the last, and that head and
tail costs more than the filled bubbles save unless the pipeline is deep and ``l`` well below 2
(the plan without them, ``bubble_filling=False``, is the ``l >= 2`` timetable, correct for any
``l``, with its ramp). On real links the fills cost more than the simulator says: their flows share
the healthy ranks' links with the ring hops, which TCP shares less evenly than the simulator's
max-min share. The runtime therefore fills only where the simulator says they gain at least 1 %
(``stragglerkit.planner.policy.optcc_bubble_filling``; docs/optcc.md, "Bubble filling"); a plain
``optcc(...)`` call fills whenever ``l < 2``, as the paper does.

Several stragglers (App. D, a different timetable from the paper's). Every straggler must send
and receive the whole buffer once (Lemma 8), and only one of them can be the last to add into a
section, so the slowest one, S, keeps the detour above and each other one, ``A_a``, *attaches*:
per window it sends its own contribution of one section to that section's owner (added before the
upload, so S receives the sum of everything but itself) and receives one global sum from the rank
S returned it to. ``A_a``'s exchange edge walks the ring *backwards*, one edge per window
(``e_{1 + a·q/(m-1) - t}``): a lane walks forwards with the gap, so the extra ``l_a`` of work visits
every lane once per body instead of piling up in one lane, and every healthy rank does one
exchange per attached straggler per segment. Per body a healthy rank then sends (and receives)
for ``2(q-1) + l_1 + sum_a l_a`` section-times and S for ``q·l_1``, so
``T -> max{2(q-1) + l_1 + sum_a l_a, q·l_1}/q · n`` as k grows, at or below the paper's
``max{2(p-1), l_1(p-m) + 2(m-1)}/(p-m) · n`` (App. D.3). No bubble filling here.

Several GPUs per server (App. E): see :mod:`stragglerkit.schedules.optcc_servers`.

Time (bandwidth only, ``n`` = buffer/healthy bandwidth): ``l·n·(k+1)/k`` for ``l >= 2`` and about
``2(p-1)·l·n/((p-2)l+2)·(k+l-1)/k`` for ``l < 2`` (OptCC paper, eq. (1), (2)), against the lower
bounds of Theorems 1 and 6 (``stragglerkit.sim.optcc_bounds``).

Generation cost. :func:`optcc_plan` computes the whole pipeline in closed form in ``O(p)``
(the ring order, the section and fill sizes, the number of windows); the timetable above maps any
``(rank, window)`` to its flows in ``O(1)``. :meth:`OptccPlan.rank_ops` lowers one rank's ops
(``O(kq)`` ops, what an executor needs) and :func:`optcc` lowers the whole schedule (``O(kq^2)``
ops, for the checker and the simulator). For p = 1024, k = 64: plan ~0.03 ms, one window of one
rank ~3 us, one rank's whole op list ~2 s.

Nomenclature: ``q`` healthy ranks, ``k`` segments, ``σ`` segment, ``x`` section (= owner index on
the ring), ``t`` window, ``u``/``d`` upload/download window, ``i`` lane (edge position), ``m``
batch, ``b`` body; chunk ``σ·q + x`` is section ``x`` of segment ``σ``, chunk ``k·q + b`` fill ``b``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import TYPE_CHECKING, TypedDict, Unpack

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.chunk_sizing import MAX_FLOWS, flow_graph, makespan, optimal_chunk_weights
from stragglerkit.schedules.ir import Schedule
from stragglerkit.schedules.optcc_servers import lower_servers
from stragglerkit.schedules.optcc_timetable import ADDING_STAGES, Flow, OptccPlan, timetable_text

if TYPE_CHECKING:
    from stragglerkit.schedules.registry import Situation

__all__ = [
    "ADDING_STAGES",
    "LP_MIN_GAIN",
    "SIZINGS",
    "Flow",
    "OptccPlan",
    "PlanOptions",
    "default_ramp",
    "lp_sized",
    "optcc",
    "optcc_plan",
    "optcc_plan_for",
    "timetable_text",
]

_MAX_WEIGHT_DENOMINATOR = 64

LP_MIN_GAIN = 0.02
"""``sizing="auto"`` takes the LP's sizes where they shorten the modelled time by at least this
fraction; elsewhere (l >= 2, where the ramp is within 0.5 % of them) it keeps the closed form."""

SIZINGS = ("auto", "lp", "closed_form")
"""``sizing`` values: ``closed_form`` (the default) keeps the timetable's own sizes (equal
sections, or the ramp), ``lp`` solves for the chunk sizes, ``auto`` is ``lp`` up to
:data:`~stragglerkit.schedules.chunk_sizing.MAX_FLOWS` flows where that gains :data:`LP_MIN_GAIN`,
else ``closed_form``; always ``closed_form`` for several GPUs per server and where a ``ramp`` is
given."""


def _fill_ratio(slowdown: float) -> Fraction:
    """Fill size per section, ``(2-l)/l``, as a small fraction (0 when ``l >= 2``)."""
    if slowdown >= 2.0:
        return Fraction(0)
    return Fraction((2.0 - slowdown) / slowdown).limit_denominator(_MAX_WEIGHT_DENOMINATOR)


def _validate(world_size: int, slowdowns: dict[int, float], segments: int, gpus_per_server: int) -> dict[int, float]:
    if world_size < 3:
        raise NotApplicableError(
            f"optcc needs at least 3 ranks (world_size={world_size}): with fewer there is no healthy ring; use ring"
        )
    if segments < 1:
        raise ValueError(f"segments must be at least 1, got {segments}")
    if gpus_per_server < 1 or world_size % gpus_per_server:
        raise ValueError(f"gpus_per_server={gpus_per_server} must be a positive divisor of world_size={world_size}")
    degraded: dict[int, float] = {}
    for rank, slowdown in slowdowns.items():
        if not 0 <= rank < world_size:
            raise ValueError(f"slowdowns names rank {rank}, which is not a rank of 0..{world_size - 1}")
        if not math.isfinite(slowdown) or slowdown < 1.0:
            raise ValueError(
                f"slowdown of rank {rank} is {slowdown}; a slowdown l is the factor by which the rank's "
                "NIC is slower than a healthy one and must be a finite number >= 1"
            )
        if slowdown > 1.0:
            degraded[rank] = float(slowdown)
    if not degraded:
        raise NotApplicableError(
            "optcc needs at least one degraded rank (slowdown l > 1); with none, use ring (bandwidth-optimal)"
        )
    return degraded


def default_ramp(segments: int) -> int:
    """The ramp :func:`optcc_plan` gives a plan without fills: a third of the segments at each end
    (k = 9: weights 1 2 3 4 4 4 3 2 1); in the flow-level simulator it is within 0.5 % of the best
    ramp length from k = 4 on. None below 4 segments: there a ramp gains at ``l >= 2`` but loses
    more at ``l`` near 1 (docs/optcc.md, "The ramp")."""
    return segments // 3 if segments >= 4 else 0


def optcc_plan(
    world_size: int,
    slowdowns: dict[int, float],
    segments: int = 64,
    gpus_per_server: int = 1,
    orderings: int = 1,
    bubble_filling: bool = True,
    ramp: int | None = None,
    sizing: str = "closed_form",
) -> OptccPlan:
    """The closed-form pipeline (``O(p)``); see :func:`optcc` for the arguments.

    With the default ``sizing="closed_form"`` generating a plan stays ``O(p)`` (the 100 ms budget
    of an online re-plan); ``auto`` or ``lp`` lower the plan and solve an LP on top (0.1 s at p = 8,
    k = 9; up to ~1 s at :data:`~stragglerkit.schedules.chunk_sizing.MAX_FLOWS`).

    With ``gpus_per_server > 1`` the plan is built on the servers (its ranks are servers; a server
    is degraded if any of its GPUs is, with the largest ``l`` named); :func:`optcc` lowers it to the
    GPUs with :func:`~stragglerkit.schedules.optcc_servers.lower_servers`.

    Example::

        plan = optcc_plan(8, {5: 1.5}, segments=16)
        assert plan.fill_weight * 3 == plan.section_weight   # (2 - 1.5) / 1.5 = 1/3
    """
    degraded = _validate(world_size, slowdowns, segments, gpus_per_server)
    if sizing not in SIZINGS:
        raise ValueError(f"sizing must be one of {', '.join(SIZINGS)}, got {sizing!r}")
    if ramp is not None and sizing == "lp":
        raise ValueError("a ramp is a closed-form size; sizing='lp' computes its own sizes (leave ramp=None)")
    if ramp is not None:  # the caller asked for a particular closed-form shape
        sizing = "closed_form"
    if orderings not in (1, 2):
        raise ValueError(f"orderings must be 1 (S1→S2→S3→S4 only) or 2 (alternate with S3→S1→S4→S2), got {orderings}")
    if gpus_per_server > 1:  # plan on the servers: a server is degraded if any of its GPUs is (PXN pools NICs)
        servers: dict[int, float] = {}
        for rank, slowdown in degraded.items():
            servers[rank // gpus_per_server] = max(slowdown, servers.get(rank // gpus_per_server, 1.0))
        if world_size // gpus_per_server < 3:
            raise NotApplicableError(
                f"optcc needs at least 3 servers, got {world_size // gpus_per_server} "
                f"({world_size} ranks, {gpus_per_server} per server); use ring"
            )
        if sizing == "lp":
            raise NotApplicableError(
                "sizing='lp' models one GPU per server (its flows share no NVLink); use sizing='closed_form' "
                "or 'auto' with gpus_per_server > 1"
            )
        return optcc_plan(
            world_size // gpus_per_server,
            servers,
            segments,
            orderings=orderings,
            bubble_filling=bubble_filling,
            ramp=ramp,
            sizing="closed_form",
        )
    q = world_size - len(degraded)
    if q < len(degraded):
        raise NotApplicableError(
            f"optcc needs at least as many healthy ranks (servers) as degraded ones ({len(degraded)} of "
            f"{world_size} are degraded); use ring"
        )
    # the slowest straggler takes the detour; the others exchange with the ring on rotating edges
    order = sorted(degraded, key=lambda r: (-degraded[r], r))
    straggler, attached = order[0], tuple(order[1:])
    if orderings == 2 and attached:
        raise NotApplicableError(
            f"the second stage ordering is built for one degraded rank (server), got {len(degraded)}; use orderings=1"
        )
    slowdown = degraded[straggler]
    fill = _fill_ratio(slowdown) if bubble_filling and not attached else Fraction(0)
    if ramp is None:
        ramp = default_ramp(segments) if fill == 0 and orderings == 1 else 0
    plan = OptccPlan(
        world_size=world_size,
        straggler=straggler,
        healthy=tuple(r for r in range(world_size) if r not in degraded),
        slowdown=slowdown,
        segments=segments,
        section_weight=fill.denominator,
        fill_weight=fill.numerator,
        attached=attached,
        orderings=orderings,
        ramp=ramp,
    )
    if sizing == "closed_form" or (sizing == "auto" and _estimated_flows(plan) > MAX_FLOWS):
        return plan
    sized = lp_sized(plan, degraded)
    if sizing == "lp":
        return sized
    # auto: the LP's sizes only where the model says they gain, else the closed form;
    # the two plans differ only in their sizes, so one lowering and one flow graph time both
    schedule = sized.lower()
    graph = flow_graph(schedule)
    sized_time = makespan(schedule, degraded, graph)
    closed_time = makespan(dataclasses.replace(schedule, chunk_sizes=plan.chunk_sizes()), degraded, graph)
    return sized if sized_time < (1.0 - LP_MIN_GAIN) * closed_time else plan


def _estimated_flows(plan: OptccPlan) -> int:
    """About how many flows the lowered plan has (each section crosses ~2q links), without lowering it."""
    return plan.num_chunks * 2 * (plan.q + len(plan.attached) + 1)


def lp_sized(plan: OptccPlan, slowdowns: dict[int, float]) -> OptccPlan:
    """``plan`` with the chunk sizes of :func:`~stragglerkit.schedules.chunk_sizing.optimal_shares`
    for its own op order and the NICs ``slowdowns`` ("Sizes by linear programming" above)."""
    equal = dataclasses.replace(plan, ramp=0, weights=())
    return dataclasses.replace(equal, weights=_lp_weights(equal, tuple(sorted(slowdowns.items()))))


@functools.lru_cache(maxsize=64)
def _lp_weights(equal: OptccPlan, slowdowns: tuple[tuple[int, float], ...]) -> tuple[int, ...]:
    """The LP's weights, cached: the runtime asks for the same plan from several places (the fill
    choice, the choice between OptCC and the balanced ring, the cost model, the plan it runs)."""
    return optimal_chunk_weights(equal.lower(), dict(slowdowns))


def optcc_plan_for(situation: Situation) -> OptccPlan | None:
    """The plan :func:`~stragglerkit.schedules.registry.generate` lowers for ``situation`` when it
    has one degraded rank on one GPU per server (the single timetable that the fast simulation,
    the window proof and the one-rank plans read), else ``None``.

    Example::

        optcc_plan_for(Situation(world_size=8, slowdowns={3: 2.0}, segments=4)).num_windows
    """
    degraded = [rank for rank, slow in situation.slowdowns.items() if slow > 1.0]
    if situation.gpus_per_server != 1 or len(degraded) != 1 or situation.world_size < 3:
        return None
    return optcc_plan(
        situation.world_size,
        dict(situation.slowdowns),
        situation.segments,
        bubble_filling=situation.bubble_filling,
        sizing=situation.optcc_sizing,
    )


class PlanOptions(TypedDict, total=False):
    """The optional arguments of :func:`optcc` after ``gpus_per_server`` (:func:`optcc_plan`'s defaults)."""

    orderings: int
    bubble_filling: bool
    ramp: int | None
    sizing: str


def optcc(
    world_size: int,
    slowdowns: dict[int, float],
    segments: int = 64,
    gpus_per_server: int = 1,
    **options: Unpack[PlanOptions],
) -> Schedule:
    """OptCC AllReduce for ``world_size`` ranks of which those in ``slowdowns`` have slow NICs.

    ``slowdowns`` maps rank -> ``l`` (the rank's NIC runs at ``1/l`` of healthy bandwidth; ``l = 1``
    entries are treated as healthy); ``segments`` is the pipeline depth ``k``; ``orderings=2``
    alternates the two stage orderings per segment (one degraded rank or server only);
    ``bubble_filling=False`` keeps the ``l >= 2`` timetable for ``l < 2`` too (no fills; see
    "When filling pays" above); ``ramp`` is the number of smaller segments at each end ("The
    ramp" above; ``None``: :func:`default_ramp` for plans without fills and with one ordering, else 0);
    ``sizing`` picks the chunk sizes (:data:`SIZINGS`; "Sizes by linear programming" above).

    Example::

        sched = optcc(5, {0: 2.0}, segments=4)
        check(sched)
    """
    plan = optcc_plan(world_size, slowdowns, segments, gpus_per_server, **options)
    if gpus_per_server == 1:
        return plan.lower()

    return lower_servers(plan, gpus_per_server)

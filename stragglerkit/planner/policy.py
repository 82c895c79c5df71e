"""The situation a plan is built for, and OptCC's plan for a bucket: the planner's policy.

OptCC's segment count, bubble filling and chunk sizing for a bucket come from
:func:`optcc_situation`; the runtime, the cost model, the CLI and the bench all use it, so the plan
that is shown and simulated is the plan that runs. :func:`planned_situation` says which parts of
what is known (a straggler, degraded NICs) an algorithm's plan is built for.
:func:`slow_nic_algorithm` compares OptCC and the balanced ring without a per-message cost (the
flow-level simulator's bandwidth-only figure); which algorithm runs is chosen by the cost model
(:mod:`stragglerkit.planner.choice`).

Example::

    optcc_segments(32 * 2**20, 8)                                             # 9
    planned_situation("ring", 8, straggler=3)                                 # no straggler: ring ignores it
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

from stragglerkit.schedules.registry import NIC_ALGORITHMS, Situation, why_not

__all__ = [
    "BUBBLE_FILLING_MIN_GAIN",
    "OPTCC_MESSAGE_BYTES",
    "OPTCC_SIZING",
    "STRAGGLER_ALGORITHMS",
    "optcc_bubble_filling",
    "optcc_segments",
    "optcc_situation",
    "planned_situation",
    "slow_nic_algorithm",
]

OPTCC_SIZING = "auto"
"""How OptCC sizes its chunks: the linear program's sizes where the model says they gain at least
its ``LP_MIN_GAIN``, else the closed form (schedules/optcc.py, "Sizes by linear programming").
It relies on OptCC's short send queues (``Config.optcc.send_buffer``): the LP balances many paths
to the same length, which holds on real links only while a send holds its link about as long as
the plan has it (docs/optcc.md, "Sizes by linear programming")."""


OPTCC_MESSAGE_BYTES = 512 * 1024
"""OptCC's pipeline segments are chosen so that its messages are about this large (or larger)."""


OPTCC_MIN_SEGMENTS = 3
"""... but at least this many segments while messages stay at least ``OPTCC_SMALLEST_MESSAGE_BYTES``."""
OPTCC_SMALLEST_MESSAGE_BYTES = 128 * 1024


def optcc_segments(nbytes: int, world_size: int, most: int = 64, message_bytes: int = OPTCC_MESSAGE_BYTES) -> int:
    """OptCC's segment count k for a bucket of ``nbytes``: messages of about 512 KiB, 1 <= k <= ``most``.

    More segments shorten the pipeline's fill (time ``l·n·(k+1)/k``) but every segment is a round
    of messages, and each message costs a fixed overhead (latency, a wake-up of the receiving
    rank); at 64 segments a 32 MiB bucket on 8 ranks is cut into 75 KiB messages. With one
    segment the fill doubles the time and OptCC loses to a ring, so a bucket gets at least 3
    segments as long as its messages stay at least 128 KiB (docs/optcc.md, "In the runtime").

    Example::

        optcc_segments(32 * 2**20, 8)   # 9
        optcc_segments(7 * 2**20, 8)    # 3
    """
    per_segment = (world_size - 1) * message_bytes
    floor = min(OPTCC_MIN_SEGMENTS, nbytes // ((world_size - 1) * OPTCC_SMALLEST_MESSAGE_BYTES))
    return max(1, min(most, max(nbytes // per_segment, floor)))


BUBBLE_FILLING_MIN_GAIN = 0.01
"""The least simulated gain (a fraction of the plan's time without fills) for which the runtime
fills. The fills put flows to and from the slow rank on the healthy ranks' links next to their
ring hops, and TCP shares a link less evenly than the simulator's max-min share, so a fill that
the simulator credits with a fraction of a percent loses on real links; deep pipelines gain
enough to pay."""

SIMULATED_MAX = 1 << 26
"""Largest ``p²k`` for which the policy times OptCC's plans (:func:`optcc_bubble_filling`,
:func:`slow_nic_algorithm`). They take the exact fast path (:mod:`stragglerkit.sim.fast_optcc`),
whose cost grows so: about 0.9 s per plan at p = 1,024, k = 64 on one core here. The runtime's
buckets stay far below it (k <= 3 from p = 1,024 for buckets up to 1 GiB)."""

FULL_SIMULATED_MAX = 16 * 16 * 64
"""Largest ``p²k`` for plans without a fast path (several degraded ranks), which the simulator
lowers and flattens: about a second at p = 16, k = 64."""


def optcc_bubble_filling(
    world_size: int, slowdowns: Mapping[int, float], segments: int, gpus_per_server: int = 1
) -> bool:
    """Does OptCC's bubble filling make this plan faster? The flow-level simulator (no per-message
    cost, which only adds to the fills' cost) times the plan with and without fills on a network
    with these slowdowns; fills are used only where they are faster by at least
    :data:`BUBBLE_FILLING_MIN_GAIN`: deep pipelines with ``l`` well below 2 (schedules/optcc.py,
    "When filling pays"). Plans without a fill to choose (``l >= 2``, several degraded ranks,
    several GPUs per server) keep the default; plans above :data:`SIMULATED_MAX` (``p²k``) run
    without fills, unsimulated. Cached per arguments.

    Example::

        optcc_bubble_filling(8, {3: 1.97}, segments=9)    # False: the fills' head costs more
        optcc_bubble_filling(8, {3: 8 / 7}, segments=9)   # False: no gain over the plan with its ramp
        optcc_bubble_filling(8, {3: 8 / 7}, segments=18)  # False: they gain 0.7 %, below the 1 % asked
        optcc_bubble_filling(8, {3: 8 / 7}, segments=36)  # True: they gain 1.9 %
    """
    degraded = tuple(sorted((rank, float(slowdown)) for rank, slowdown in slowdowns.items() if slowdown > 1.0))
    return _bubble_filling_pays(world_size, degraded, segments, gpus_per_server, OPTCC_SIZING)


@functools.lru_cache(maxsize=256)
def _bubble_filling_pays(
    world_size: int, degraded: tuple[tuple[int, float], ...], segments: int, gpus_per_server: int, sizing: str
) -> bool:
    if len(degraded) != 1 or gpus_per_server != 1 or degraded[0][1] >= 2.0:
        return True
    if world_size * world_size * segments > SIMULATED_MAX:
        return False  # the fills gain most in deep pipelines on few ranks, not here
    slowdowns = dict(degraded)
    plan = Situation(world_size=world_size, slowdowns=slowdowns, segments=segments, optcc_sizing=sizing)
    filled = _bandwidth_only_seconds("optcc", plan)
    unfilled = _bandwidth_only_seconds("optcc", dataclasses.replace(plan, bubble_filling=False))
    return bool(filled < (1.0 - BUBBLE_FILLING_MIN_GAIN) * unfilled)


def _bandwidth_only_seconds(algorithm: str, situation: Situation) -> float:
    """Simulated time from the last arrival without a per-message cost, for comparing two plans:
    the ratio of two such times does not depend on the size or the bandwidth. The exact fast path
    where there is one (:mod:`stragglerkit.sim.fast`), else the whole schedule."""
    from stragglerkit.schedules.registry import generate
    from stragglerkit.sim.fast import fast_simulate
    from stragglerkit.sim.simulator import Network, simulate

    network = Network.uniform(situation.world_size, alpha=0.0, bandwidth=1e9, slowdowns=dict(situation.slowdowns))
    fast = fast_simulate(algorithm, situation, 1e9, network)
    if fast is not None:
        return fast.time_from_last_arrival
    return simulate(generate(algorithm, situation), 1e9, network).time_from_last_arrival


def slow_nic_algorithm(situation: Situation, nbytes: int) -> str:
    """For degraded NICs: ``optcc`` or ``balanced_ring``, whichever the flow-level simulator (no
    per-message cost) finds faster for the plans the runtime would run on a bucket of ``nbytes``.

    The balanced ring wins where ``l`` is near 1 (p = 8: below about 1.3; schedules/balanced_ring.py):
    it loses only what the slow links must carry, while OptCC pays its pipeline's head and tail.
    Not simulated (OptCC, the paper's algorithm, is kept): buckets whose balanced ring would send
    messages under :data:`OPTCC_SMALLEST_MESSAGE_BYTES` (the per-message cost the comparison
    leaves out would decide), several GPUs per server, and plans above
    :data:`SIMULATED_MAX` (``p²k``; :data:`FULL_SIMULATED_MAX` with several degraded ranks), where
    the simulation would stall the first call for seconds. Cached per world size, degraded ranks
    and OptCC's segment count.

    Example::

        slow_nic_algorithm(Situation(world_size=8, slowdowns={3: 8 / 7}), 32 * 2**20)  # 'balanced_ring'
        slow_nic_algorithm(Situation(world_size=8, slowdowns={3: 2.0}), 32 * 2**20)    # 'optcc'
    """
    from stragglerkit.schedules.balanced_ring import balanced_shares, default_slices

    degraded = tuple(sorted((rank, float(slow)) for rank, slow in situation.slowdowns.items() if slow > 1.0))
    if why_not("optcc", situation) is not None:
        return "balanced_ring"
    shares = balanced_shares([situation.slowdowns.get(r, 1.0) for r in range(situation.world_size)])
    if nbytes * min(shares) / default_slices(shares) < OPTCC_SMALLEST_MESSAGE_BYTES:
        return "optcc"  # the per-message cost, which the comparison leaves out, would decide
    optcc_plan = optcc_situation(situation, nbytes)
    return _faster_for_slow_nics(
        situation.world_size,
        degraded,
        optcc_plan.segments,
        optcc_plan.bubble_filling,
        situation.gpus_per_server,
        optcc_plan.optcc_sizing,
    )


@functools.lru_cache(maxsize=256)
def _faster_for_slow_nics(
    world_size: int,
    degraded: tuple[tuple[int, float], ...],
    segments: int,
    bubble_filling: bool,
    gpus_per_server: int,
    sizing: str,
) -> str:
    most = SIMULATED_MAX if len(degraded) == 1 else FULL_SIMULATED_MAX
    if gpus_per_server != 1 or world_size * world_size * segments > most:
        return "optcc"
    situation = Situation(
        world_size=world_size,
        slowdowns=dict(degraded),
        segments=segments,
        bubble_filling=bubble_filling,
        optcc_sizing=sizing,
    )
    pipeline = _bandwidth_only_seconds("optcc", situation)
    ring = _bandwidth_only_seconds("balanced_ring", situation)
    return "balanced_ring" if ring < pipeline else "optcc"


STRAGGLER_ALGORITHMS = ("stragglar", "direct")
"""Algorithms whose plan depends on which rank is late (the others ignore the straggler)."""


def planned_situation(
    algorithm: str,
    world_size: int,
    straggler: int | None = None,
    slowdowns: Mapping[int, float] | None = None,
    nbytes: int = 0,
) -> Situation:
    """The situation ``algorithm``'s plan is built for when ``straggler`` is late and ``slowdowns``
    degrade NICs: the straggler only for :data:`STRAGGLER_ALGORITHMS`, the slowdowns only for NIC
    algorithms, OptCC sized for a bucket of ``nbytes`` (:func:`optcc_situation`). The cost model
    and the calibration's fit time the same plans from it."""
    situation = Situation(
        world_size=world_size,
        straggler=straggler if algorithm in STRAGGLER_ALGORITHMS else None,
        slowdowns=dict(slowdowns or {}) if algorithm in NIC_ALGORITHMS else {},
    )
    return optcc_situation(situation, nbytes) if algorithm == "optcc" else situation


def optcc_situation(situation: Situation, nbytes: int, segments: int | None = None) -> Situation:
    """``situation`` with the OptCC segments, bubble filling and chunk sizing the runtime uses for a
    bucket of ``nbytes`` (:func:`optcc_segments`, :func:`optcc_bubble_filling`, :data:`OPTCC_SIZING`);
    the cost model, the bench and the command line build their plans from the same. ``segments``
    fixes k instead (the fills and sizes are then decided for that k)."""
    if segments is None:
        segments = optcc_segments(nbytes, situation.world_size)
    filling = optcc_bubble_filling(situation.world_size, situation.slowdowns, segments, situation.gpus_per_server)
    return dataclasses.replace(situation, segments=segments, bubble_filling=filling, optcc_sizing=OPTCC_SIZING)

"""StragglAR: AllReduce around a persistent straggler.

From the StragglAR paper (Devraj et al., "Accelerating AllReduce with a Persistent Straggler"),
§3 and appendices B and C; docs/stragglar.md describes the generator.

How it works (n ranks, n even and at least 4; logical rank ``σ = n-1`` is the straggler; the buffer
is cut into ``n-1`` equal chunks ``c_0 .. c_{n-2}``):

* Pre-phase ``reduce_scatter``, while the straggler is still busy: the ``n-1`` punctual ranks run a
  ring reduce-scatter among themselves, so punctual rank ``g`` holds ``c_g`` summed over all
  punctual ranks ("partially reduced": everything but the straggler's contribution).
* Phase ``matching``, once the straggler arrives, in rounds. In every round each rank sends at most
  one chunk and receives at most one chunk, and ranks talk in pairs (a matching).

  - Straggler pairing: in round ``r < n-1`` rank ``r`` and ``σ`` swap ``c_r`` and each adds what it
    received (receive into scratch, then reduce). Both then hold ``c_r`` *fully reduced*. After
    round ``n-2`` the straggler holds every chunk and joins the other ranks as a sender.
  - Spreading: a fully reduced chunk that has not reached every rank yet is *active*. Every other
    pair of the round copies active chunks to ranks that lack them (the receiver overwrites its
    stale copy). The goal is that every active chunk doubles its number of holders every round.

  Powers of two follow Algorithm 1 (``k = log2(n)``), which the proof of Appendix B makes exact:

  - Phase 1, rounds ``1 .. k-1`` ("everyone gets a chunk"): rank ``r-1``, which just fully reduced
    ``c_{r-1}``, sends it to rank ``r-1+k``; every other holder of an active chunk sends it to a rank
    ``g > 2(k-1)`` that holds none yet. Ranks ``1 .. 2k-2`` stay free of other chunks, so each has
    exactly the chunk it needs when its turn comes. Afterwards ``|A[c_j]| = 2^(k-1-j)``: every
    punctual rank holds exactly one active chunk.
  - Phase 2, rounds ``r >= k`` ("careful doubling"): ``P_r`` are the free ranks holding the oldest
    active chunk ``c_{r-k}`` (its deadline is this round), ``Q_r`` the free ranks holding any other
    active chunk (plus ``σ`` from round ``n-1`` on; it only ever sends ``c_{n-2}``, Remark 1).
    ``|P_r| = |Q_r|``: each ``P``–``Q`` pair swaps active chunks, so ``c_{r-k}`` completes and every
    other active chunk doubles. Ranks of the *critical window* ``r+1 .. r+k`` (the next straggler
    partners) are paired first, each with the unpaired rank outside the window that holds the
    oldest active chunk it lacks: a window rank thus only ever receives a chunk that expires before
    its own straggler round, which keeps rank ``r`` in ``P_r`` (the invariant of Lemma 2).
    Result: exactly ``n + log2(n) - 2`` rounds.

  Other even n (appendix C) use a maximum-weight matching per round instead (``K = ceil(log2 n)``):

  - Rounds ``1 .. K-1`` seed chunks as in Phase 1 (chain ``r-1 -> r-1+K``, other holders, newest
    chunk first, to chunk-less ranks beyond ``2(K-1)`` while any are left).
  - Later rounds: an edge joins two free ranks when one holds a chunk the other lacks. Its weight
    is ``(n+1)·d + y``: ``d`` counts the useful directions (2 if both gain, 1 if one does, the
    weights of appendix C) and ``y`` counts those whose chunk is *young*, reduced within the last
    ``K`` rounds and so still inside its doubling window; among the matchings with the most useful
    directions the one that keeps the young chunks doubling wins. The matching has maximum
    cardinality first. Each matched rank sends the newest chunk its partner lacks. A rank ``a``
    about to pair with the straggler (``r < a < r+K``) is only matched with ranks holding nothing
    newer than ``c_{a-K}``: the critical-window rule above.
  - Lower bound: ``c_{n-2}`` is fully reduced in round ``n-2`` on two ranks and at best doubles per
    round, so every schedule of this form needs ``n + ceil(log2 n) - 2`` rounds. This rule meets it
    for every even n up to 64 (docs/stragglar.md has the table and the reference's counts).

Cost: ``R`` rounds of one chunk (``s/(n-1)`` bytes) each after the pre-phase,
``R·alpha + R/(n-1)·s·beta`` with ``R = n + log2(n) - 2`` for powers of two (StragglAR paper, Table 1).

Nomenclature: ``σ``/``straggler`` is rank n-1; ``c_j`` is chunk j; a :class:`Transfer` is one
chunk copied from ``sender`` to ``receiver`` in a round (the straggler swap is implied by the round
number and not listed); ``holders`` is the paper's ``A`` (active chunk -> punctual ranks holding
it); ``active[g]`` is punctual rank g's active chunk in the power-of-two algorithm.

Worked example, n = 4 (``σ`` = 3; after the pre-phase rank g holds partial ``c_g``)::

    round | straggler swap | other transfers            | fully reduced chunks after the round
    ------+----------------+----------------------------+-------------------------------------
      0   | 0 <-> σ : c0   | -                          | 0:c0      1:-       2:-       σ:c0
      1   | 1 <-> σ : c1   | 0 -> 2 : c0                | 0:c0      1:c1      2:c0      σ:c0,c1
      2   | 2 <-> σ : c2   | 0 -> 1 : c0, 1 -> 0 : c1   | 0:c0,c1   1:c0,c1   2:c0,c2   σ:all
      3   | -              | 1 -> 2 : c1, 2 -> 1 : c2,  | all ranks hold c0, c1, c2
          |                | σ -> 0 : c2                |

Round 3 is Phase 2 with ``P_3 = {1, 0}`` (holders of ``c1``) and ``Q_3 = {2, σ}``; ``0``'s copy of
``c1`` would be useless to ``σ``, so only ``σ -> 0`` moves on that pair. 4 rounds = n + log2(n) - 2.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.ir import Schedule, ScheduleBuilder
from stragglerkit.schedules.ring import add_ring_reduce_scatter

__all__ = ["MATCHING_PHASE", "PRE_PHASE", "Transfer", "plan_arrays", "stragglar", "stragglar_plan"]

PRE_PHASE = "reduce_scatter"
MATCHING_PHASE = "matching"


class Transfer(NamedTuple):
    """Fully reduced chunk ``chunk`` copied from ``sender`` to ``receiver`` in one round."""

    sender: int
    receiver: int
    chunk: int


Round = list[Transfer]


def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be an int, got {world_size!r}")
    if world_size >= 4 and world_size % 2 == 0:
        return
    from stragglerkit.schedules.registry import Situation, applicable  # the registry imports generators lazily

    others = [name for name in applicable(Situation(world_size=world_size)) if name != "stragglar"]
    hint = f"algorithms that apply: {', '.join(others)}" if others else "no AllReduce applies to fewer than 2 ranks"
    raise NotApplicableError(f"StragglAR needs an even world size of at least 4, got world_size={world_size}; {hint}")


def stragglar_plan(world_size: int) -> list[Round]:
    """The matching phase as data: ``plan[r]`` lists round r's transfers besides the straggler swap.

    In round ``r < n-1`` rank ``r`` and the straggler ``n-1`` also swap chunk ``r``; that swap is not
    listed. ``len(plan)`` is the number of rounds. (:func:`plan_arrays` is the same plan as arrays,
    which is what the lowering and the simulator walk.)

    Example::

        plan = stragglar_plan(4)
        assert len(plan) == 4 and plan[1] == [Transfer(0, 2, 0)]
    """
    _check_world_size(world_size)
    if world_size & (world_size - 1):
        return _matching_plan(world_size)
    offsets, senders, receivers, chunks = plan_arrays(world_size)
    return [
        [Transfer(*move) for move in zip(senders[a:b].tolist(), receivers[a:b].tolist(), chunks[a:b].tolist())]
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())
    ]


@functools.lru_cache(maxsize=2)
def plan_arrays(world_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`stragglar_plan` as arrays, computed once per world size in a process: ``offsets``
    (round ``r``'s transfers are ``offsets[r]:offsets[r+1]``), ``senders``, ``receivers``,
    ``chunks``. At n = 1,024 the plan is a million transfers: 12 MB as arrays.

    Example::

        offsets, senders, receivers, chunks = plan_arrays(4)
        assert len(offsets) == 5 and (senders[offsets[1]], receivers[offsets[1]]) == (0, 2)
    """
    _check_world_size(world_size)
    if world_size & (world_size - 1) == 0:
        rounds = _power_of_two_rounds(world_size)
    else:
        rounds = [np.array(moves, np.int32).reshape(-1, 3) for moves in _matching_plan(world_size)]
    offsets = np.zeros(len(rounds) + 1, np.int64)
    offsets[1:] = np.cumsum([len(moves) for moves in rounds])
    flat = np.concatenate(rounds).astype(np.int32) if rounds else np.zeros((0, 3), np.int32)
    for array in (offsets, flat):
        array.setflags(write=False)
    return offsets, flat[:, 0], flat[:, 1], flat[:, 2]


# -- powers of two: Algorithm 1 ----------------------------------------------------------------


def _power_of_two_rounds(n: int) -> list[np.ndarray]:
    """Algorithm 1, one ``(moves, 3)`` array of (sender, receiver, chunk) per round.

    Phase 1 (``k`` short rounds) keeps ``A`` as lists. Phase 2 keeps it as two arrays over the
    ranks: ``active[g]``, the live chunk g holds, and ``joined[g]``, when g joined its holders, so
    ``A[c]`` is the ranks with ``active == c`` in ``joined`` order and every round is a few array
    operations (a loop over the transfers took 1.6 s at n = 1,024; this takes 0.25 s).
    """
    k = n.bit_length() - 1
    holders: dict[int, list[int]] = {}  # A; insertion order is chunk order, oldest first
    active_list = [-1] * n
    rounds: list[np.ndarray] = []
    for r in range(min(k, n + k - 2)):
        seeds = _everyone_gets_a_chunk(r, k, n, holders, active_list) if r else []
        rounds.append(np.array(seeds, np.int64).reshape(-1, 3))
        for _, receiver, chunk in seeds:
            holders[chunk].append(receiver)
            active_list[receiver] = chunk
        holders[r] = [r]  # the straggler swap fully reduced c_r on rank r
        active_list[r] = r
    active = np.array(active_list, np.int64)
    joined = np.zeros(n, np.int64)
    order = [g for ranks in holders.values() for g in ranks]
    joined[order] = np.arange(len(order))
    clock = len(order)
    for r in range(k, n + k - 2):
        doubling, clock = _careful_doubling(r, k, n, active, joined, clock)
        rounds.append(doubling)
    return rounds


def _everyone_gets_a_chunk(r: int, k: int, n: int, holders: dict[int, list[int]], active: list[int]) -> Round:
    """Phase 1 round ``r`` (``1 <= r < k``)."""
    moves = [Transfer(r - 1, r - 1 + k, r - 1)]
    chunkless = [g for g in range(2 * k - 1, n - 1) if active[g] < 0]
    receivers = iter(chunkless)  # Lemma 1: there are enough of them
    for chunk, ranks in holders.items():
        for holder in ranks:
            if holder != r - 1:
                moves.append(Transfer(holder, next(receivers), chunk))
    return moves


def _careful_doubling(
    r: int, k: int, n: int, active: np.ndarray, joined: np.ndarray, clock: int
) -> tuple[np.ndarray, int]:
    """Phase 2 round ``r`` (``r >= k``): pair ``P_r`` with ``Q_r``, critical window first. Updates
    ``active`` and ``joined`` (``A`` after the round) and returns the moves and the new clock."""
    straggler = n - 1
    oldest = r - k
    punctual = active[:straggler]
    in_a = punctual >= oldest  # chunks older than c_{r-k} have reached everyone: no longer in A
    if r < straggler:
        in_a[r] = False
    ranks = np.flatnonzero(in_a)
    # A in order: by chunk (c_{r-k}'s holders, P, first), then by when each rank joined
    ranks = ranks[np.argsort((punctual[ranks] - oldest) * clock + joined[ranks])]
    split = int(np.count_nonzero(punctual[ranks] == oldest))
    p_ranks, q_ranks = ranks[:split], ranks[split:]
    if r >= straggler:
        q_ranks = np.append(q_ranks, straggler)  # it holds everything and sends c_{n-2}, the newest chunk
    window_end = r + k
    window = range(r + 1, min(window_end, n - 2) + 1)
    window_chunks = active[window.start : window.stop].tolist()
    p_list, q_list = p_ranks.tolist(), q_ranks.tolist()
    paired: dict[int, int] = {}
    next_p = next_q = 0
    for g, chunk in zip(window, window_chunks):
        if g in paired:
            continue
        # the unpaired rank outside the window with the oldest active chunk that g lacks
        if chunk == oldest:
            while q_list[next_q] in paired or r < q_list[next_q] <= window_end:
                next_q += 1
            other = q_list[next_q]
        else:
            while p_list[next_p] in paired or r < p_list[next_p] <= window_end:
                next_p += 1
            other = p_list[next_p]
        paired[g], paired[other] = other, g
    partner = np.full(n, -1, np.int64)
    partner[list(paired)] = list(paired.values())
    rest_p = p_ranks[partner[p_ranks] < 0]
    rest_q = q_ranks[partner[q_ranks] < 0]
    pairs = min(len(rest_p), len(rest_q))
    partner[rest_p[:pairs]] = rest_q[:pairs]
    partner[rest_q[:pairs]] = rest_p[:pairs]
    q_of_p = partner[p_ranks]
    gets = np.where(q_of_p == straggler, n - 2, active[q_of_p])  # what each P rank receives
    moves = np.empty((len(p_ranks), 2, 3), np.int64)  # per P rank: p -> q (c_{r-k}), then q -> p
    moves[:, 0, 0] = moves[:, 1, 1] = p_ranks
    moves[:, 0, 1] = moves[:, 1, 0] = q_of_p
    moves[:, 0, 2] = oldest
    moves[:, 1, 2] = gets
    keep = np.ones((len(p_ranks), 2), bool)
    keep[:, 0] = q_of_p != straggler  # the straggler holds every chunk already
    # A after the round: c_{r-k} reached every rank; each P rank joins the holders of what it got
    active[p_ranks] = gets
    joined[p_ranks] = clock + np.arange(len(p_ranks))
    clock += len(p_ranks)
    if r < straggler:  # the straggler swap fully reduced c_r on rank r
        active[r], joined[r] = r, clock
        clock += 1
    return moves[keep], clock


# -- other even n: maximum-weight matching (appendix C) ----------------------------------------


def _matching_plan(n: int) -> list[Round]:
    big_k = (n - 1).bit_length()  # ceil(log2 n) for n that is not a power of two
    straggler = n - 1
    punctual = n - 1
    everything = (1 << punctual) - 1
    have = [0] * n  # bit j set: the rank holds c_j fully reduced
    plan: list[Round] = []
    r = 0
    while r < n - 1 or any(have[g] != everything for g in range(punctual)):
        if r == 0:
            moves: Round = []
        elif r < big_k:
            moves = _seed_round(r, big_k, n, have)
        else:
            moves = _weighted_matching_round(r, big_k, n, have)
            if not moves and r >= n - 1:
                raise RuntimeError(f"StragglAR matching made no progress in round {r} for n={n}")
        plan.append(moves)
        for _, receiver, chunk in moves:
            have[receiver] |= 1 << chunk
        if r < n - 1:
            have[r] |= 1 << r
            have[straggler] |= 1 << r
        r += 1
    return plan


def _seed_round(r: int, big_k: int, n: int, have: list[int]) -> Round:
    """Rounds ``1 .. K-1``: the Phase 1 rules, with as many chunk-less receivers as there are."""
    chain_sender, chain_receiver = r - 1, r - 1 + big_k
    moves = [Transfer(chain_sender, chain_receiver, r - 1)]
    senders = sorted(
        (g for g in range(n - 1) if have[g] and g not in (r, chain_sender)),
        key=lambda g: (-have[g].bit_length(), g),
    )
    chunkless = [g for g in range(2 * big_k - 1, n - 1) if not have[g]]
    for sender, receiver in zip(senders, chunkless):
        moves.append(Transfer(sender, receiver, have[sender].bit_length() - 1))
    return moves


def _window_allows(rank: int, partner_newest: int, r: int, big_k: int) -> bool:
    """A rank about to pair with the straggler (``r < rank < r+K``) only meets ranks holding nothing
    newer than ``c_{rank-K}``: whatever it receives has then spread fully before its own turn."""
    return not r < rank < r + big_k or partner_newest <= rank - big_k


def _weighted_matching_round(r: int, big_k: int, n: int, have: list[int]) -> Round:
    import networkx as nx  # only this path needs it; keeps `import stragglerkit.schedules` light

    straggler = n - 1
    free = [g for g in range(n - 1) if g != r]
    if r >= n - 1:
        free.append(straggler)
    newest = [h.bit_length() - 1 for h in have]
    young = r - big_k  # chunks newer than this are still inside their doubling window
    scale = n + 1  # exceeds any matching's total bonus: the number of useful directions decides first
    graph = nx.Graph()
    graph.add_nodes_from(free)
    guard = r < n - 1  # the critical window only matters while straggler pairings remain
    for i, u in enumerate(free):
        for v in free[i + 1 :]:
            if guard and not (_window_allows(u, newest[v], r, big_k) and _window_allows(v, newest[u], r, big_k)):
                continue
            to_v = (have[u] & ~have[v]).bit_length() - 1  # newest chunk u can give v, -1 if none
            to_u = (have[v] & ~have[u]).bit_length() - 1
            directions = (to_v >= 0) + (to_u >= 0)
            if directions:
                graph.add_edge(u, v, weight=directions * scale + (to_v > young) + (to_u > young))
    moves: Round = []
    for u, v in sorted(tuple(sorted(pair)) for pair in nx.max_weight_matching(graph, maxcardinality=True)):
        for sender, receiver in ((u, v), (v, u)):
            chunk = (have[sender] & ~have[receiver]).bit_length() - 1
            if chunk >= 0:
                moves.append(Transfer(sender, receiver, chunk))
    return moves


# -- lowering to the IR ------------------------------------------------------------------------


def stragglar(world_size: int) -> Schedule:
    """StragglAR for an even ``world_size >= 4``, with the straggler at logical rank n-1.

    The registry (:func:`stragglerkit.schedules.registry.generate`) relabels it onto the real
    straggler.

    Example::

        sched = stragglar(8)
        assert sched.rounds() == 9 and sched.num_chunks == 7
    """
    with _collector_paused():
        plan = stragglar_plan(world_size)
        return _lower(world_size, plan)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a schedule is built.

    A schedule for n = 256 is about 260,000 small immutable ops, none of which can be part of a
    reference cycle. With the collector running, their allocation triggers collections that rescan
    the growing set of live objects again and again; paused, it passes over them once, later. The
    previous collector state is restored afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _lower(n: int, plan: list[Round]) -> Schedule:
    straggler = n - 1
    punctual = list(range(n - 1))
    builder = ScheduleBuilder(n, n - 1)
    spans = [(chunk, chunk + 1) for chunk in range(n - 1)]  # shared by the ops: fewer objects
    add_ring_reduce_scatter(builder, members=punctual, owned=punctual, phase=PRE_PHASE)
    for rnd, moves in enumerate(plan):
        if rnd < straggler:
            _swap(builder, rnd, straggler, spans[rnd], rnd)
            _swap(builder, straggler, rnd, spans[rnd], rnd)
        for sender, receiver, chunk in moves:
            span = spans[chunk]
            builder.send(sender, receiver, span, round=rnd, phase=MATCHING_PHASE)
            builder.recv(receiver, sender, span, round=rnd, phase=MATCHING_PHASE)
    return builder.build("stragglar", round_phase=MATCHING_PHASE, params={"straggler": straggler, "rounds": len(plan)})


def _swap(builder: ScheduleBuilder, rank: int, peer: int, span: tuple[int, int], rnd: int) -> None:
    """``rank``'s half of a straggler swap: send ``span`` to ``peer``, receive the peer's copy into
    scratch 0 and add it in."""
    builder.send(rank, peer, span, round=rnd, phase=MATCHING_PHASE)
    builder.recv(rank, peer, span, scratch=0, round=rnd, phase=MATCHING_PHASE)
    builder.reduce(rank, 0, span, round=rnd, phase=MATCHING_PHASE)

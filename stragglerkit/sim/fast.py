"""Exact timelines of ring-shaped schedules without building them: what the loop decides with.

:func:`~stragglerkit.sim.simulator.simulate` flattens a schedule into one task per message, and a
ring on ``p`` ranks has ``2p(p-1)`` of them (4.2 million ops at p = 1024): seconds to generate and
to flatten, before any timing. Yet every link of a ring does the same thing in every step, so the
timeline is a recurrence over *steps*, each a handful of numpy operations on vectors of ``p``
ranks (or links). This module computes, from the algorithm's name and situation alone:

* ``ring`` (rounds in lockstep, as the simulator runs it with ``sync_rounds``): with ``r_i`` the
  time rank ``i`` finished its previous round, the message on link ``i -> i+1`` of the next step
  starts at ``max(r_i, r_{i+1})``, takes ``alpha + bytes / min(tx_i, rx_{i+1})``, and ``r_i``
  becomes the later of its send and its receive. ``2(p-1)`` steps, any arrivals, any slowdowns.
* ``balanced_ring`` (dataflow, ``k`` slices interleaved step by step, chunks of unequal size): a
  message starts when its sender received that chunk (the previous step of the same slice on the
  link before), when the link delivered its previous message (one connection per pair, program
  order) and when both ranks arrived. ``2(p-1)·k`` steps.
* ``direct`` (StragglAR paper's broadcast baseline): the ring AllReduce among the punctual ranks
  (the lockstep recurrence), then ``1 + ceil(log2(p-1))`` rounds of whole-buffer messages, each
  pair starting when both finished their previous round; any arrivals, any slowdowns.
* ``stragglar`` on a uniform network with every punctual rank arriving together: the pre-phase is
  the ring reduce-scatter among the ``p-1`` punctual ranks (the recurrence above), and each of the
  ``R`` matching rounds moves one chunk of ``s/(p-1)`` bytes on every busy link, every round
  waiting for the straggler's chain: the last rank finishes at ``max(T_pre, d) + R·(alpha +
  s/((p-1)·B))``, ``R = p + log2(p) - 2`` for powers of two (the generator's count otherwise).

Each is the simulator's own arithmetic on the same rules, not an approximation: the tests
(``tests/test_sim_fast.py``) compare them with :func:`simulate` on odd and even ``p``, late ranks,
absent ranks and slowdowns, to 1e-9. Where no fast path is exact (reduction costs ``gamma`` or
``delta``, servers with NVLink, other algorithms, StragglAR with slowdowns) :func:`fast_simulate`
returns ``None`` and the caller simulates the schedule.

Cost: ``O(p)`` vectorised steps of ``O(p)`` work each (the numpy call, not the arithmetic,
dominates up to a few thousand ranks); at p = 1024 a ring takes milliseconds where generating
and simulating it took about 20 s (docs/results.md, "Scale").

Example::

    net = Network.uniform(1024, alpha=3e-6, bandwidth=25e9, slowdowns={3: 2.0})
    res = fast_simulate("ring", Situation(world_size=1024, slowdowns={3: 2.0}), 2**30, net)
    res.time_from_last_arrival       # equal to simulate(ring(1024), 2**30, net).time_from_last_arrival
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from stragglerkit.schedules.registry import Situation, why_not
from stragglerkit.sim.graph import FloatArray
from stragglerkit.sim.network import Network

__all__ = ["FAST_ALGORITHMS", "FastResult", "fast_auto_delay", "fast_simulate", "stragglar_rounds"]

FAST_ALGORITHMS = ("ring", "balanced_ring", "stragglar", "direct", "optcc")
"""Algorithms with an exact fast path (under the conditions of :func:`fast_simulate`)."""


@dataclass(slots=True, kw_only=True)
class FastResult:
    """The figures of :class:`~stragglerkit.sim.simulator.SimResult` that a fast path gives.

    Example::

        fast_simulate("ring", Situation(world_size=8), 2**20, Network.uniform(8, 0.0, 1e9)).makespan
    """

    completion: FloatArray
    """Per rank: when its last op completed (for StragglAR only the latest is exact; see ``makespan``)."""
    makespan: float
    time_from_last_arrival: float
    time_from_first_arrival: float
    phase_done: dict[str, float]
    """Per phase: when its last op completed (StragglAR: ``reduce_scatter``; the rings: both phases)."""
    steps: int
    """Vectorised steps computed: the measure of the fast path's work (``O(p)``, tested)."""


def fast_simulate(
    algorithm: str,
    situation: Situation,
    size_bytes: float,
    network: Network,
    arrivals: Sequence[float] | FloatArray | None = None,
) -> FastResult | None:
    """What ``simulate(generate(algorithm, situation), size_bytes, network, arrivals)`` returns
    (its times), or ``None`` where no exact fast path applies (module docstring).

    Example::

        net = Network.uniform(16, alpha=3e-6, bandwidth=450e9)
        arrivals = [0.0] * 15 + [1e-3]
        fast_simulate("stragglar", Situation(world_size=16, straggler=15), 2**30, net, arrivals)
    """
    n = situation.world_size
    if network.world_size != n:
        raise ValueError(f"the network has {network.world_size} ranks but the situation has {n}; build it for {n}")
    if not (size_bytes >= 0 and math.isfinite(size_bytes)):
        raise ValueError(f"size_bytes = {size_bytes!r} must be a finite number >= 0")
    if algorithm not in FAST_ALGORITHMS or network.gamma or network.delta or network.gpus_per_server != 1:
        return None
    if why_not(algorithm, situation) is not None:
        return None
    arrival = np.zeros(n) if arrivals is None else np.asarray(arrivals, dtype=np.float64)
    if arrival.shape != (n,) or np.isnan(arrival).any() or np.isneginf(arrival).any() or np.isinf(arrival).all():
        return None  # let the simulator say what is wrong
    tx = np.asarray(network.tx_bandwidth, dtype=np.float64)
    rx = np.asarray(network.rx_bandwidth, dtype=np.float64)
    if algorithm == "ring":
        members = np.arange(n)
        ends, phase_ends, steps = _ring_lockstep(arrival, tx, rx, members, size_bytes / n, network.alpha, 2 * (n - 1))
        return _result(ends, arrival, {"reduce_scatter": phase_ends[0], "allgather": phase_ends[1]}, steps)
    if algorithm == "balanced_ring":
        return _balanced_ring(situation, arrival, tx, rx, size_bytes, network.alpha)
    if algorithm == "direct":
        return _direct(situation, arrival, tx, rx, size_bytes, network.alpha)
    if algorithm == "optcc":
        return _optcc(situation, arrival, size_bytes, network)
    return _stragglar(situation, arrival, tx, rx, size_bytes, network.alpha)


def fast_auto_delay(
    situation: Situation, size_bytes: float, network: Network, algorithm: str = "stragglar"
) -> float | None:
    """:func:`~stragglerkit.sim.simulator.auto_delay` of StragglAR (the punctual ranks' pre-phase
    time with the straggler absent; ``algorithm="direct"``: its ``pre_allreduce``), or ``None``
    where the fast path does not apply.

    Example::

        fast_auto_delay(Situation(world_size=8, straggler=7), 2**30, Network.uniform(8, 3e-6, 450e9))
    """
    n = situation.world_size
    straggler = situation.straggler if situation.straggler is not None else n - 1
    if not 0 <= straggler < n:
        return None
    arrivals = np.zeros(n)
    arrivals[straggler] = math.inf
    result = fast_simulate(algorithm, _with_straggler(situation, straggler), size_bytes, network, arrivals)
    phase = "pre_allreduce" if algorithm == "direct" else "reduce_scatter"
    return None if result is None or phase not in result.phase_done else result.phase_done[phase]


@functools.lru_cache(maxsize=64)
def stragglar_rounds(world_size: int) -> int:
    """StragglAR's matching rounds: ``n + log2(n) - 2`` for powers of two (Algorithm 1, proved
    exact), else the generator's count (its maximum-weight matching; computed once per size).

    Example::

        stragglar_rounds(1024)   # 1032
    """
    n = world_size
    if n & (n - 1) == 0:
        return n + n.bit_length() - 3
    from stragglerkit.schedules.stragglar import plan_arrays

    return len(plan_arrays(n)[0]) - 1


# --------------------------------------------------------------------------------------------------
def _with_straggler(situation: Situation, straggler: int) -> Situation:
    if situation.straggler == straggler:
        return situation
    return Situation(
        world_size=situation.world_size,
        straggler=straggler,
        slowdowns=dict(situation.slowdowns),
        segments=situation.segments,
        bubble_filling=situation.bubble_filling,
        gpus_per_server=situation.gpus_per_server,
        optcc_sizing=situation.optcc_sizing,
    )


def _result(ends: FloatArray, arrival: FloatArray, phase_done: dict[str, float], steps: int) -> FastResult:
    completion = np.maximum(ends, arrival)
    finite = arrival[np.isfinite(arrival)]
    end = float(completion.max())
    return FastResult(
        completion=completion,
        makespan=end,
        time_from_last_arrival=end - float(finite.max()),
        time_from_first_arrival=end - float(finite.min()),
        phase_done=phase_done,
        steps=steps,
    )


def _ring_lockstep(
    arrival: FloatArray,
    tx: FloatArray,
    rx: FloatArray,
    members: np.ndarray,
    chunk_bytes: float,
    alpha: float,
    num_steps: int,
) -> tuple[FloatArray, tuple[float, float], int]:
    """A ring of equal chunks among ``members`` in lockstep rounds: per rank its end (``-inf`` for
    ranks outside the ring), the ends of the reduce-scatter (steps ``0 .. m-2``) and of the whole
    run, and the steps computed."""
    m = members.size
    duration = alpha + chunk_bytes / np.minimum(tx[members], rx[np.roll(members, -1)])  # link j: member j -> j+1
    ready = np.empty(m + 1)  # ready[j]: member j finished its previous round; ready[m] = ready[0]
    ready[:m] = arrival[members]
    link = np.empty(m + 1)  # link[j + 1]: the end of link j's message; link[0] = link[m]
    phase_ends = [-math.inf, -math.inf]
    for step in range(num_steps):
        ready[m] = ready[0]
        np.maximum(ready[:m], ready[1:], out=link[1:])
        link[1:] += duration
        link[0] = link[m]
        np.maximum(link[1:], link[:m], out=ready[:m])  # member j: its send (link j), its receive (link j-1)
        if step == m - 2 or step == num_steps - 1:
            phase_ends[0 if step < m - 1 else 1] = float(ready[:m].max())
    out = np.full(arrival.size, -np.inf)
    if num_steps:
        out[members] = ready[:m]
    return out, (phase_ends[0], phase_ends[1]), num_steps


def _balanced_ring(
    situation: Situation, arrival: FloatArray, tx: FloatArray, rx: FloatArray, size_bytes: float, alpha: float
) -> FastResult:
    """Dataflow over ``k`` slices: on link ``i`` the slices of a step go one after another (one
    connection per pair), slice ``q`` once its chunk arrived: ``end_q = max(end_{q-1}, held_q) + dur``."""
    from stragglerkit.schedules.balanced_ring import WEIGHT_RESOLUTION, balanced_shares, default_slices

    n = situation.world_size
    per_rank = [1.0] * n
    for rank, slowdown in situation.slowdowns.items():
        per_rank[rank] = float(slowdown)
    shares = balanced_shares(per_rank)
    k = default_slices(shares)
    weights = np.array([max(1, round(c * WEIGHT_RESOLUTION)) for c in shares], dtype=np.int64)
    chunk_bytes = weights * (float(size_bytes) / (int(weights.sum()) * k))  # the simulator's arithmetic
    twice = np.concatenate([chunk_bytes, chunk_bytes])  # twice[n - s + i] = chunk_bytes[(i - s) % n]
    link_rate = np.minimum(tx, np.roll(rx, -1))  # link i: rank i -> i+1
    link_free = np.maximum(arrival, np.roll(arrival, -1))  # both ranks arrived; later: last delivery
    held = np.full((k, n + 1), -np.inf)  # held[q, i + 1]: rank i+1 received slice q's chunk over link i
    duration = np.empty(n)
    phase_done = {}
    for phase in ("reduce_scatter", "allgather"):
        for step in range(n - 1):
            shift = step + 1 if phase == "reduce_scatter" else step  # link i sends chunk i - shift
            np.divide(twice[n - shift : 2 * n - shift], link_rate, out=duration)
            duration += alpha
            for piece in range(k):
                row = held[piece]
                row[0] = row[n]  # rank 0 received over link n-1
                np.maximum(link_free, row[:n], out=link_free)  # the chunk rank i sends is there
                link_free += duration
                row[1:] = link_free
        phase_done[phase] = float(link_free.max())
    ends = np.maximum(link_free, np.roll(link_free, 1))  # rank i: its last send (link i), last receive (link i-1)
    return _result(ends, arrival, phase_done, 2 * (n - 1) * k)


def _stragglar(
    situation: Situation, arrival: FloatArray, tx: FloatArray, rx: FloatArray, size_bytes: float, alpha: float
) -> FastResult | None:
    n = situation.world_size
    straggler = situation.straggler if situation.straggler is not None else n - 1
    if not 0 <= straggler < n:
        return None
    bandwidth = float(tx[0])
    if not (np.all(tx == bandwidth) and np.all(rx == bandwidth)):
        return None  # slowdowns: the matching rounds are not uniform
    punctual = np.delete(np.arange(n), straggler)
    if straggler != n - 1:  # generate() swaps logical ranks straggler and n-1
        punctual[straggler] = n - 1
    if not np.all(arrival[punctual] == arrival[punctual[0]]) or not math.isfinite(arrival[punctual[0]]):
        return None  # punctual ranks out of step: the matching rounds are not uniform
    chunk = float(size_bytes) / (n - 1)
    _, (pre_done, _), steps = _ring_lockstep(arrival, tx, rx, punctual, chunk, alpha, n - 2)
    late = float(arrival[straggler])
    rounds = stragglar_rounds(n) if math.isfinite(late) else 0  # absent: only the pre-phase ends
    end = max(pre_done, late) + rounds * (alpha + chunk / bandwidth)
    completion = np.full(n, end)
    phase_done = {"reduce_scatter": pre_done, "matching": end}
    return _result(completion, arrival, phase_done, steps + rounds)


def _optcc(situation: Situation, arrival: FloatArray, size_bytes: float, network: Network) -> FastResult | None:
    from stragglerkit.schedules.optcc import optcc_plan_for
    from stragglerkit.sim.fast_optcc import fast_optcc

    plan = optcc_plan_for(situation)  # None: several GPUs per server or attached stragglers
    return None if plan is None else fast_optcc(plan, size_bytes, network, arrival)


def _direct(
    situation: Situation, arrival: FloatArray, tx: FloatArray, rx: FloatArray, size_bytes: float, alpha: float
) -> FastResult | None:
    n = situation.world_size
    straggler = situation.straggler if situation.straggler is not None else n - 1
    if not 0 <= straggler < n:
        return None
    logical = np.arange(n)  # logical rank -> rank: generate() swaps logical ranks straggler and n-1
    logical[straggler], logical[n - 1] = n - 1, straggler
    punctual = logical[: n - 1]
    ready = arrival.copy()
    steps, pre_done = 0, -math.inf
    if n - 1 >= 2:
        ends, (_, pre_done), steps = _ring_lockstep(arrival, tx, rx, punctual, size_bytes / (n - 1), alpha, 2 * (n - 2))
        ready[punctual] = ends[punctual]
    phase_done = {"pre_allreduce": pre_done} if n - 1 >= 2 else {}
    # exchange: logical 0 and the straggler swap buffers (one flow each way), then broadcast by doubling
    first, last = int(logical[0]), int(logical[n - 1])
    start = max(ready[first], ready[last])
    end = max(
        start + alpha + size_bytes / min(tx[first], rx[last]), start + alpha + size_bytes / min(tx[last], rx[first])
    )
    ready[first] = ready[last] = end
    holders, waiting = [0, n - 1], list(range(1, n - 1))
    rounds = 1
    while waiting:
        receivers, waiting = waiting[: len(holders)], waiting[len(holders) :]
        senders = logical[holders[: len(receivers)]]
        targets = logical[receivers]
        begin = np.maximum(ready[senders], ready[targets])
        done = begin + (alpha + size_bytes / np.minimum(tx[senders], rx[targets]))
        ready[senders] = done
        ready[targets] = done
        holders += receivers
        rounds += 1
    phase_done["broadcast"] = float(ready.max())
    return _result(ready, arrival, phase_done, steps + rounds)

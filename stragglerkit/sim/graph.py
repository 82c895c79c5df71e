"""A schedule flattened once into arrays: the task graph that the simulator and the cost model share.

Both consumers need the same picture of *what may happen when*, so it is derived here once, with
numpy, from the IR (a per-op Python loop would be far too slow for n = 1024, where ring alone has
about four million ops).

Tasks. Every matched message (the k-th ``send`` a->b paired with the k-th receive on b from a) is
one *message task*; every ``reduce``/``copy`` is one *local task*. A send op and its receive op
share the message task's times, except that a ``recv_reduce`` finishes after the transfer plus its
reduction time.

Execution rules, as edges ``u -> v`` ("v may not start before u is done, plus a weight"):

* data dependencies: an op waits for the ops in its ``depends`` (weight: the receive-side
  reduction time of the dependency, if it is a ``recv_reduce``);
* one connection per ordered rank pair: the messages from a to b are posted in program order and
  delivered one after another, so message k+1 on a pair starts after message k is delivered;
* rounds in order (``sync_rounds``, on by default): a rank starts the sends and receives of a round
  only after all its sends and receives of the previous round (the previous run of ops with another
  ``(phase, round)`` tag in its program order) are complete. This is how round-based AllReduce is
  executed by the papers' implementations (one grouped send/recv per round) and what the alpha-beta
  analysis assumes; with it a checked round schedule never has two flows on one NIC direction.
  Untagged ops are not constrained by it.

A task also has a *release* time: a message can start only when both ranks have arrived, a local op
when its rank has.

Per-op byte accounting (used for gamma/delta and for the cost model's C and D terms): ``recv_reduce``
and ``reduce`` reduce ``b`` bytes and move ``3b`` bytes through memory (read two operands, write
one); ``copy`` moves ``2b``; a plain ``recv`` or ``send`` moves none (the NIC reads/writes the
buffer directly).
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules.ir import OpKind, Schedule

__all__ = ["KIND_CODES", "TaskGraph", "build_task_graph", "longest_path"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

KIND_CODES: dict[OpKind, int] = {
    OpKind.SEND: 0,
    OpKind.RECV: 1,
    OpKind.RECV_REDUCE: 2,
    OpKind.REDUCE: 3,
    OpKind.COPY: 4,
}
_SEND, _RECV, _RECV_REDUCE, _REDUCE, _COPY = range(5)
_CODE_BY_ID = {id(kind): code for kind, code in KIND_CODES.items()}
_NONE_AS_MINUS_ONE: dict[int | None, int] = {None: -1}


@dataclass(slots=True, kw_only=True)
class TaskGraph:
    """Arrays describing one schedule's ops, messages and execution constraints (see module doc)."""

    world_size: int
    num_messages: int
    """Message tasks are ``0 .. num_messages-1``; local tasks follow."""
    num_tasks: int
    # --- per op (global op index: rank-major, program order) ---
    op_rank: IntArray
    op_kind: IntArray
    op_weight: IntArray
    """Sum of the op's chunk weights; bytes = op_weight * size / total_weight."""
    op_phase: IntArray
    """Index into :attr:`phases`."""
    op_task: IntArray
    rank_offsets: IntArray
    """Ops of rank r are ``rank_offsets[r] : rank_offsets[r+1]``."""
    phases: list[str]
    total_weight: int
    # --- per task ---
    task_src: IntArray
    """Sending rank of a message task; the rank of a local task."""
    task_dst: IntArray
    """Receiving rank of a message task; the rank of a local task."""
    task_weight: IntArray
    task_op: IntArray
    """A representative op: the send op of a message, the op itself for a local task."""
    recv_op: IntArray
    """Receive op of each message task (length ``num_messages``)."""
    # --- edges, sorted by source task (CSR) ---
    edge_ptr: IntArray
    edge_dst: IntArray
    edge_from_op: IntArray
    """The op whose completion the edge waits for (-1: the transfer end of the source message)."""
    one_flow_per_nic: bool
    """True when the rules guarantee that no NIC direction ever carries two flows at once: rounds run
    in order and every send and receive is round-tagged, at most one of each per rank and round."""

    def op_reduced_bytes(self, size_bytes: float) -> FloatArray:
        """Bytes reduced by each op (``reduce`` and ``recv_reduce``)."""
        reduces = (self.op_kind == _REDUCE) | (self.op_kind == _RECV_REDUCE)
        return np.where(reduces, self.op_bytes(size_bytes), 0.0).astype(np.float64)

    def op_memory_bytes(self, size_bytes: float) -> FloatArray:
        """Bytes each op moves through memory (3b for a reduction, 2b for a copy)."""
        b = self.op_bytes(size_bytes)
        reduces = (self.op_kind == _REDUCE) | (self.op_kind == _RECV_REDUCE)
        return np.where(reduces, 3.0 * b, np.where(self.op_kind == _COPY, 2.0 * b, 0.0)).astype(np.float64)

    def op_bytes(self, size_bytes: float) -> FloatArray:
        return np.multiply(self.op_weight, float(size_bytes) / self.total_weight, dtype=np.float64)

    def task_bytes(self, size_bytes: float) -> FloatArray:
        return np.multiply(self.task_weight, float(size_bytes) / self.total_weight, dtype=np.float64)

    def phase_mask(self, names: tuple[str, ...] | list[str]) -> npt.NDArray[np.bool_]:
        """Per-op mask of the ops whose phase is one of ``names``."""
        codes = [i for i, name in enumerate(self.phases) if name in names]
        return np.isin(self.op_phase, codes)


def _flatten_ops(sched: Schedule) -> tuple[list[object], IntArray]:
    counts = np.fromiter(map(len, sched.ops), dtype=np.int64, count=sched.world_size)
    offsets = np.zeros(sched.world_size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return list(chain.from_iterable(sched.ops)), offsets


_Fields = tuple[IntArray, IntArray, IntArray, IntArray, IntArray, IntArray, list[str], IntArray, IntArray, int]


_NATIVE_MIN_OPS = 200_000
"""Below this many ops the Python reader is fast enough not to pay for importing torch (which _C needs)."""


def _native_module(num_ops: int) -> Any:
    """``stragglerkit._C`` when it is built and worth loading for ``num_ops`` ops, else ``None``."""
    if num_ops < _NATIVE_MIN_OPS and "torch" not in sys.modules:
        return None
    try:
        importlib.import_module("torch")  # loads the libraries stragglerkit._C links against
        return importlib.import_module("stragglerkit._C")
    except ImportError:
        return None


def _native_extractor(num_ops: int) -> Callable[..., tuple[Any, ...]] | None:
    extractor: Callable[..., tuple[Any, ...]] | None = getattr(_native_module(num_ops), "sim_extract_ops", None)
    return extractor


def _extract_fields(sched: Schedule, native: bool = True) -> _Fields:
    """Every op's fields as arrays: offsets, kind, weight, peer, round, phase, names, deps, total weight.

    Uses the native extension's one-pass reader (csrc/sim_core.cpp) when it is built and the
    schedule is large (``native``), else C-level iteration over the op objects (no per-op Python
    code, but several passes over them; about 5x slower).
    """
    extract = _native_extractor(sum(map(len, sched.ops))) if native else None
    if extract is None:
        return _extract_fields_python(sched)
    if not isinstance(sched.ops, list) or not all(isinstance(rank_ops, list) for rank_ops in sched.ops):
        raise ScheduleError("schedule.ops must be a list of per-rank op lists")
    try:
        offsets, kind, start, stop, peer, rnd, phase, names, dep_counts, deps = extract(sched.ops, tuple(KIND_CODES))
    except (ValueError, TypeError, AttributeError) as err:
        raise ScheduleError(f"malformed op: {err}; run stragglerkit.schedules.check() on the schedule") from None
    weight, total = _chunk_weights(sched, np.stack([start, stop], axis=1))
    return offsets, kind, weight, peer, rnd, phase, list(names), dep_counts, deps, total


def _chunk_weights(sched: Schedule, chunk_pairs: IntArray) -> tuple[IntArray, int]:
    weights = np.asarray(sched.chunk_weights(), dtype=np.int64)
    prefix = np.zeros(weights.size + 1, dtype=np.int64)
    np.cumsum(weights, out=prefix[1:])
    if chunk_pairs.size and (chunk_pairs.min() < 0 or chunk_pairs.max() > weights.size):
        raise ScheduleError(f"an op's chunk range lies outside 0..{weights.size}; run check() on the schedule")
    return prefix[chunk_pairs[:, 1]] - prefix[chunk_pairs[:, 0]], int(prefix[-1])


def _extract_fields_python(sched: Schedule) -> _Fields:
    ops, offsets = _flatten_ops(sched)
    num_ops = len(ops)
    try:
        op_kind = np.fromiter(
            map(_CODE_BY_ID.__getitem__, map(id, map(attrgetter("kind"), ops))), dtype=np.int64, count=num_ops
        )
    except KeyError:
        raise ScheduleError("schedule holds an op whose kind is not an OpKind") from None
    chunk_pairs = np.fromiter(
        chain.from_iterable(map(attrgetter("chunks"), ops)), dtype=np.int64, count=2 * num_ops
    ).reshape(num_ops, 2)
    op_weight, total = _chunk_weights(sched, chunk_pairs)
    peers = list(map(attrgetter("peer"), ops))
    op_peer = np.fromiter(map(_NONE_AS_MINUS_ONE.get, peers, peers), dtype=np.int64, count=num_ops)
    rounds = list(map(attrgetter("round"), ops))
    op_round = np.fromiter(map(_NONE_AS_MINUS_ONE.get, rounds, rounds), dtype=np.int64, count=num_ops)
    phase_list = list(map(attrgetter("phase"), ops))
    phase_names = {name: code for code, name in enumerate(dict.fromkeys(phase_list))}
    op_phase = np.fromiter(map(phase_names.__getitem__, phase_list), dtype=np.int64, count=num_ops)
    dep_lists = list(map(attrgetter("depends"), ops))
    dep_counts = np.fromiter(map(len, dep_lists), dtype=np.int64, count=num_ops)
    dep_local = np.fromiter(chain.from_iterable(dep_lists), dtype=np.int64, count=int(dep_counts.sum()))
    return offsets, op_kind, op_weight, op_peer, op_round, op_phase, list(phase_names), dep_counts, dep_local, total


def build_task_graph(sched: Schedule, sync_rounds: bool = True, native: bool = True) -> TaskGraph:
    """Flatten ``sched`` into a :class:`TaskGraph` (see the module docstring for the rules).

    The schedule is assumed to have passed :func:`stragglerkit.schedules.check`; unmatched messages
    raise :class:`ScheduleError` here too. ``native=False`` skips the native reader of
    ``stragglerkit._C`` (used automatically when the extension is built).

    Example::

        graph = build_task_graph(ring(4))
        assert graph.num_messages == 4 * 6
    """
    n = sched.world_size
    if len(sched.ops) != n:
        raise ScheduleError(f"schedule has {len(sched.ops)} rank op lists for world_size {n}")
    was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived lists: the cyclic collector would dominate the run time
    try:
        fields = _extract_fields(sched, native)
    finally:
        if was_enabled:
            gc.enable()
    offsets, op_kind, op_weight, op_peer, op_round, op_phase, phase_names, dep_counts, dep_local, total = fields
    num_ops = op_kind.size
    op_rank = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))

    module = _native_module(num_ops) if native else None
    if module is not None and hasattr(module, "sim_build_edges"):
        try:
            edges = module.sim_build_edges(
                offsets, op_kind, op_peer, op_round, op_phase, dep_counts, dep_local, sync_rounds
            )
        except ValueError as err:
            raise ScheduleError(f"{err}; run stragglerkit.schedules.check() on the schedule for the details") from None
    else:
        edges = _edges_numpy(
            n, offsets, op_rank, op_kind, op_peer, op_round, op_phase, dep_counts, dep_local, sync_rounds
        )
    send_ops, recv_ops, local_ops, op_task, edge_ptr, edge_dst, edge_from, one_flow_per_nic = edges
    if not np.array_equal(op_weight[send_ops], op_weight[recv_ops]):
        raise ScheduleError("a send and its matching receive move different chunk ranges; run check() for details")
    num_messages = int(send_ops.size)
    task_src = np.concatenate([op_rank[send_ops], op_rank[local_ops]])
    task_dst = np.concatenate([op_rank[recv_ops], op_rank[local_ops]])
    task_op = np.concatenate([send_ops, local_ops])

    return TaskGraph(
        world_size=n,
        num_messages=num_messages,
        num_tasks=int(task_op.size),
        op_rank=op_rank,
        op_kind=op_kind,
        op_weight=op_weight,
        op_phase=op_phase,
        op_task=op_task,
        rank_offsets=offsets,
        phases=phase_names,
        total_weight=total,
        task_src=task_src,
        task_dst=task_dst,
        task_weight=op_weight[task_op],
        task_op=task_op,
        recv_op=recv_ops,
        edge_ptr=edge_ptr,
        edge_dst=edge_dst,
        edge_from_op=edge_from,
        one_flow_per_nic=bool(one_flow_per_nic),
    )


def _edges_numpy(
    n: int,
    offsets: IntArray,
    op_rank: IntArray,
    op_kind: IntArray,
    op_peer: IntArray,
    op_round: IntArray,
    op_phase: IntArray,
    dep_counts: IntArray,
    dep_local: IntArray,
    sync_rounds: bool,
) -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray, IntArray, IntArray, bool]:
    """Messages and edges with numpy: (send_ops, recv_ops, local_ops, op_task, edge_ptr, edge_dst, edge_from,
    one_flow_per_nic).

    The same result as ``sim_build_edges`` of csrc/sim_core.cpp (the tests compare them).
    """
    num_ops = op_kind.size
    comm = op_kind <= _RECV_REDUCE
    bad_peer = comm & ((op_peer < 0) | (op_peer >= n) | (op_peer == op_rank))
    if bad_peer.any():
        i = int(np.argmax(bad_peer))
        raise ScheduleError(
            f"rank {op_rank[i]} op {i - offsets[op_rank[i]]} has peer {op_peer[i]}, not another rank of 0..{n - 1}"
        )
    # --- messages: k-th send a->b with k-th receive on b from a ---
    send_ops = np.flatnonzero(op_kind == _SEND)
    recv_ops = np.flatnonzero((op_kind == _RECV) | (op_kind == _RECV_REDUCE))
    send_key = op_rank[send_ops] * n + op_peer[send_ops]
    recv_key = op_peer[recv_ops] * n + op_rank[recv_ops]
    send_ops = send_ops[np.argsort(send_key, kind="stable")]
    recv_ops = recv_ops[np.argsort(recv_key, kind="stable")]
    send_key = op_rank[send_ops] * n + op_peer[send_ops]
    recv_key = op_peer[recv_ops] * n + op_rank[recv_ops]
    if send_key.shape != recv_key.shape or not np.array_equal(send_key, recv_key):
        raise ScheduleError(
            f"sends and receives do not pair up ({send_ops.size} sends, {recv_ops.size} receives); "
            "run stragglerkit.schedules.check() on the schedule for the details"
        )
    num_messages = int(send_ops.size)
    local_ops = np.flatnonzero(op_kind >= _REDUCE)
    num_tasks = num_messages + int(local_ops.size)
    op_task = np.empty(num_ops, dtype=np.int64)
    op_task[send_ops] = np.arange(num_messages)
    op_task[recv_ops] = np.arange(num_messages)
    op_task[local_ops] = np.arange(num_messages, num_tasks)

    # --- edges ---
    dep_of = np.repeat(np.arange(num_ops, dtype=np.int64), dep_counts)
    dep_global = offsets[op_rank[dep_of]] + dep_local
    if dep_local.size and (np.any(dep_local < 0) or np.any(dep_global >= dep_of)):
        raise ScheduleError("an op depends on an op that is not an earlier op of its rank; run check() for details")
    srcs = [op_task[dep_global]]
    dsts = [op_task[dep_of]]
    froms = [dep_global]

    same_pair = send_key[1:] == send_key[:-1]
    fifo_to = np.flatnonzero(same_pair) + 1
    srcs.append(fifo_to - 1)
    dsts.append(fifo_to)
    froms.append(np.full(fifo_to.size, -1, dtype=np.int64))

    if sync_rounds:
        r_src, r_dst = _round_edges(op_kind, op_rank, op_round, op_phase)
        srcs.append(op_task[r_src])
        dsts.append(op_task[r_dst])
        froms.append(r_src)

    edge_src = np.concatenate(srcs)
    edge_dst = np.concatenate(dsts)
    edge_from = np.concatenate(froms)
    keep = edge_src != edge_dst
    edge_src, edge_dst, edge_from = edge_src[keep], edge_dst[keep], edge_from[keep]
    order = np.argsort(edge_src, kind="stable")
    edge_ptr = np.zeros(num_tasks + 1, dtype=np.int64)
    np.cumsum(np.bincount(edge_src, minlength=num_tasks), out=edge_ptr[1:])

    one_flow = sync_rounds and _one_flow_per_nic(op_kind, op_rank, op_round, op_phase)
    return send_ops, recv_ops, local_ops, op_task, edge_ptr, edge_dst[order], edge_from[order], one_flow


def _one_flow_per_nic(op_kind: IntArray, op_rank: IntArray, op_round: IntArray, op_phase: IntArray) -> bool:
    """Every send/receive round-tagged, at most one send and one receive per rank and round group."""
    comm = op_kind <= _RECV_REDUCE
    if (op_round[comm] < 0).any():
        return False
    sel = np.flatnonzero(comm)
    if sel.size == 0:
        return True
    rank = op_rank[sel]
    key = op_phase[sel] * (int(op_round.max()) + 1) + op_round[sel]
    new_group = np.ones(sel.size, dtype=bool)
    new_group[1:] = (key[1:] != key[:-1]) | (rank[1:] != rank[:-1])
    starts = np.flatnonzero(new_group)
    is_send = (op_kind[sel] == _SEND).astype(np.int64)
    sends = np.add.reduceat(is_send, starts)
    recvs = np.add.reduceat(1 - is_send, starts)
    return bool(sends.max() <= 1 and recvs.max() <= 1)


def _round_edges(
    op_kind: IntArray, op_rank: IntArray, op_round: IntArray, op_phase: IntArray
) -> tuple[IntArray, IntArray]:
    """Edges from every comm op of a rank's previous round group to every comm op of the next one."""
    sel = np.flatnonzero((op_kind <= _RECV_REDUCE) & (op_round >= 0))
    if sel.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    rank = op_rank[sel]
    key = op_phase[sel] * (int(op_round.max()) + 1) + op_round[sel]
    new_group = np.ones(sel.size, dtype=bool)
    new_group[1:] = (key[1:] != key[:-1]) | (rank[1:] != rank[:-1])
    group_of = np.cumsum(new_group) - 1
    group_start = np.flatnonzero(new_group)
    group_end = np.append(group_start[1:], sel.size)
    group_rank = rank[group_start]
    # an op follows the previous group when that group belongs to the same rank
    has_prev = group_of > 0
    has_prev[has_prev] = group_rank[group_of[has_prev] - 1] == rank[has_prev]
    members = np.flatnonzero(has_prev)
    prev = group_of[members] - 1
    counts = group_end[prev] - group_start[prev]
    total = int(counts.sum())
    first = np.repeat(group_start[prev], counts)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return sel[first + within], sel[np.repeat(members, counts)]


def longest_path(
    graph: TaskGraph, release: FloatArray, duration: FloatArray, op_extra: FloatArray, native: bool = True
) -> FloatArray:
    """Earliest completion time of every task when nothing competes for bandwidth.

    ``done[t] = max(release[t], max over edges u->t of (done[u] + extra)) + duration[t]``, where
    ``extra`` is ``op_extra`` of the edge's op (the receive-side reduction of a ``recv_reduce``).
    Kahn's algorithm: in C++ (``sim_longest_path``) when ``stragglerkit._C`` is built and the graph
    is large (``native``), else level by level on whole frontiers with numpy. Raises
    :class:`ScheduleError` when the constraints form a cycle (the schedule would deadlock).

    Example::

        done = longest_path(graph, np.zeros(graph.num_tasks), durations, np.zeros(op_count))
    """
    num_tasks = graph.num_tasks
    edge_extra = np.where(graph.edge_from_op >= 0, op_extra[np.maximum(graph.edge_from_op, 0)], 0.0)
    module = _native_module(num_tasks) if native else None
    if module is not None and hasattr(module, "sim_longest_path"):
        done, processed = module.sim_longest_path(graph.edge_ptr, graph.edge_dst, edge_extra, release, duration)
    else:
        done, processed = _longest_path_numpy(graph, edge_extra, release, duration)
    if processed < num_tasks:
        stuck = np.flatnonzero(np.isnan(done))[:3]
        where = ", ".join(
            f"rank {graph.task_src[t]} op {graph.task_op[t] - graph.rank_offsets[graph.task_src[t]]}" for t in stuck
        )
        raise ScheduleError(
            f"deadlock: {num_tasks - processed} of {num_tasks} messages/ops can never start under the execution "
            f"rules (e.g. {where}); run stragglerkit.schedules.check() on the schedule"
        )
    return done


def _longest_path_numpy(
    graph: TaskGraph, edge_extra: FloatArray, release: FloatArray, duration: FloatArray
) -> tuple[FloatArray, int]:
    """Level by level (Kahn's algorithm on whole frontiers); returns (done, tasks processed)."""
    num_tasks = graph.num_tasks
    indeg = np.bincount(graph.edge_dst, minlength=num_tasks).astype(np.int64)
    ready = release.astype(np.float64, copy=True)
    done = np.full(num_tasks, np.nan)
    frontier = np.flatnonzero(indeg == 0)
    processed = 0
    ptr, edge_dst = graph.edge_ptr, graph.edge_dst
    while frontier.size:
        processed += frontier.size
        finish = ready[frontier] + duration[frontier]
        done[frontier] = finish
        starts = ptr[frontier]
        counts = ptr[frontier + 1] - starts
        total = int(counts.sum())
        if total == 0:
            break
        offsets = np.cumsum(counts) - counts
        edges = np.repeat(starts - offsets, counts) + np.arange(total, dtype=np.int64)
        targets = edge_dst[edges]
        np.maximum.at(ready, targets, np.repeat(finish, counts) + edge_extra[edges])
        uniq, hits = np.unique(targets, return_counts=True)
        indeg[uniq] -= hits
        frontier = uniq[indeg[uniq] == 0]
    return done, processed

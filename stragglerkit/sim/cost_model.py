"""GenModel cost model of a schedule, computed from its IR, and its fitting.

GenModel (Xiong et al., "Revisiting the Time Cost Model of AllReduce") predicts an AllReduce's time as::

    T = A·alpha + B·beta + C·gamma + D·delta + max(w - w_t, 0)·B·epsilon

with A the messages, B the bytes, C the bytes reduced and D the bytes of memory traffic on the
critical path, and w the incast degree (most flows into one rank at once) against a threshold w_t.

The terms come from the schedule, never from per-algorithm formulas: the schedule is flattened
into the same task graph the simulator uses (:mod:`stragglerkit.sim.graph`: data dependencies,
messages delivered in order on each rank pair, and rounds run in order on each rank), each message
weighs ``alpha + bytes·beta`` and each local op ``gamma·reduced + delta·memory`` bytes, and the
*critical path* is the heaviest path through that DAG (found level by level with numpy and traced
back along tight edges). A, B, C and D are summed along it. Bandwidth sharing is not modelled
here: with rounds run in order a checked round schedule never puts two flows on one NIC direction,
and incast is charged by the epsilon term instead. ``hidden_phases`` names phases that complete
before the last rank arrives (StragglAR's ``reduce_scatter``, direct's ``pre_allreduce``): their
ops count as done at time 0, which is how the StragglAR paper's Table 1 counts.

The critical path is chosen with the weights of a :class:`CostModelParams` (``weights``; the
defaults when omitted), since which path is heaviest can depend on alpha versus beta.

Measured runs (``arrivals``, ``slowdowns``): each rank starts at its arrival (a message when both
of its ranks arrived) and a message between NICs slowed by ``l`` carries its bytes ``max(l_src,
l_dst)`` times in B (its bandwidth term). The path then starts at some rank's arrival,
:attr:`CostTerms.start`, and the time from the last arrival that GenModel predicts is ``start +
T(terms) - max(arrivals)`` (:meth:`CostModel.predict_from_last_arrival`). This is how
:mod:`stragglerkit.detect.model_comparison` fits the models to runs with a straggler or a slow NIC.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from scipy.optimize import nnls

from stragglerkit.schedules.ir import Schedule
from stragglerkit.sim.graph import FloatArray, TaskGraph, build_task_graph, longest_path

__all__ = [
    "MODELS",
    "CostModel",
    "CostModelParams",
    "CostTerms",
    "FitResult",
    "cost_terms",
    "fit",
    "graph_cost_terms",
    "identifiable_params",
]

_RECV_REDUCE_CODE = 2
_PARAMS = ("alpha", "beta", "gamma", "delta", "epsilon")


@dataclass(slots=True, kw_only=True, frozen=True)
class CostTerms:
    """The GenModel terms of one schedule at one buffer size (critical path quantities).

    Example::

        terms = cost_terms(ring(8), 2**30)
        assert terms.A == 14
    """

    A: float
    """Messages on the critical path."""
    B: float
    """Bytes sent on the critical path."""
    C: float
    """Bytes reduced on the critical path."""
    D: float
    """Bytes of local memory traffic on the critical path (3 per reduced byte, 2 per copied byte)."""
    w: int
    """Incast degree: the most flows into one rank at once (1 when there is none)."""
    start: float = 0.0
    """Seconds: the arrival of the rank the critical path starts on (0 without ``arrivals``)."""


@dataclass(kw_only=True, slots=True)
class CostModelParams:
    """The weights of GenModel's terms (:class:`CostModel`'s parameters).

    Example::

        CostModel(CostModelParams(alpha=3e-6, beta=1 / 450e9))
    """

    alpha: float = 3e-6
    """Seconds per message (latency), default: NVLink-class 3 us (StragglAR paper, §4.3)."""
    beta: float = 1.0 / 450e9
    """Seconds per byte on a link, default: 1 / 450 GB/s (H100 NVLink, one direction)."""
    gamma: float = 0.0
    """Seconds per byte reduced (0: reductions hidden or free)."""
    delta: float = 0.0
    """Seconds per byte of local memory traffic."""
    epsilon: float = 0.0
    """Extra seconds per byte on the critical path per flow of incast above the threshold."""
    incast_threshold: float = 1.0
    """w_t: incast degree the fabric absorbs without the epsilon penalty."""

    def __post_init__(self) -> None:
        for name in (*_PARAMS, "incast_threshold"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"CostModelParams.{name} = {value!r} must be a finite number >= 0")


class CostModel:
    """Predicts a schedule's time with GenModel (see the module docstring).

    Example::

        model = CostModel(CostModelParams(alpha=3e-6, beta=1 / 450e9))
        seconds = model.predict(ring(8), 2**30)
    """

    Config: TypeAlias = CostModelParams
    """Deprecated name of :class:`CostModelParams` (kept for code and pickles that name it)."""

    __slots__ = ("config",)

    def __init__(self, config: CostModelParams | None = None) -> None:
        self.config = config if config is not None else CostModelParams()

    def predict(self, schedule: Schedule, size_bytes: float, hidden_phases: Sequence[str] = ()) -> float:
        """Predicted seconds for ``schedule`` on ``size_bytes`` (from the last arrival, if phases are hidden).

        Example::

            CostModel().predict(stragglar(8), 2**30, hidden_phases=("reduce_scatter",))
        """
        return self.predict_terms(cost_terms(schedule, size_bytes, hidden_phases, weights=self.config))

    def predict_from_last_arrival(self, terms: CostTerms, last_arrival: float) -> float:
        """Seconds from ``last_arrival`` to the end of the path of ``terms`` (see the module docstring)."""
        return terms.start + self.predict_terms(terms) - last_arrival

    def predict_terms(self, terms: CostTerms) -> float:
        """GenModel's formula on already computed terms.

        Example::

            CostModel().predict_terms(CostTerms(A=14, B=1.9e9, C=0, D=0, w=1))
        """
        c = self.config
        incast = max(terms.w - c.incast_threshold, 0.0)
        return (
            terms.A * c.alpha + terms.B * c.beta + terms.C * c.gamma + terms.D * c.delta + incast * terms.B * c.epsilon
        )


def cost_terms(
    schedule: Schedule,
    size_bytes: float,
    hidden_phases: Sequence[str] = (),
    *,
    weights: CostModelParams | None = None,
    sync_rounds: bool = True,
    arrivals: Sequence[float] | None = None,
    slowdowns: Mapping[int, float] | None = None,
) -> CostTerms:
    """The GenModel terms of ``schedule`` for a buffer of ``size_bytes`` (see the module docstring).

    Example::

        terms = cost_terms(stragglar(8), 2**30, hidden_phases=("reduce_scatter",))
        assert terms.A == 9   # n + log2(n) - 2
    """
    if not (size_bytes >= 0 and math.isfinite(size_bytes)):
        raise ValueError(f"size_bytes = {size_bytes!r} must be a finite number >= 0")
    graph = build_task_graph(schedule, sync_rounds=sync_rounds)
    unknown = [p for p in hidden_phases if p not in graph.phases]
    if unknown:
        raise ValueError(
            f"hidden phase {unknown[0]!r} is not a phase of {schedule.algorithm!r} "
            f"(its phases: {', '.join(graph.phases) or 'none'})"
        )
    return graph_cost_terms(graph, size_bytes, hidden_phases, weights=weights, arrivals=arrivals, slowdowns=slowdowns)


def graph_cost_terms(
    graph: TaskGraph,
    size_bytes: float,
    hidden_phases: Sequence[str] = (),
    *,
    weights: CostModelParams | None = None,
    arrivals: Sequence[float] | None = None,
    slowdowns: Mapping[int, float] | None = None,
) -> CostTerms:
    """:func:`cost_terms` of an already flattened schedule (one graph, many sizes and runs).

    Example::

        graph = build_task_graph(ring(4))
        terms = graph_cost_terms(graph, 2**20, arrivals=[0, 0, 0, 0.01], slowdowns={1: 2.0})
    """
    if not (size_bytes >= 0 and math.isfinite(size_bytes)):
        raise ValueError(f"size_bytes = {size_bytes!r} must be a finite number >= 0")
    n = graph.world_size
    arrival = np.zeros(n) if arrivals is None else np.asarray(arrivals, dtype=np.float64)
    if arrival.shape != (n,) or not np.isfinite(arrival).all():
        raise ValueError(f"arrivals must be {n} finite times (one per rank), got {arrivals!r}")
    slow = np.ones(n)
    for rank, factor in (slowdowns or {}).items():
        if not (0 <= int(rank) < n and math.isfinite(factor) and factor >= 1.0):
            raise ValueError(f"slowdowns: rank {rank} -> {factor} must name a rank of 0..{n - 1} and a factor >= 1")
        slow[int(rank)] = factor
    unknown = [p for p in hidden_phases if p not in graph.phases]
    if unknown:
        raise ValueError(f"hidden phase {unknown[0]!r} is not a phase of the schedule (its phases: {graph.phases})")
    return _critical_path(graph, size_bytes, tuple(hidden_phases), weights or CostModelParams(), arrival, slow)


def _critical_path(
    graph: TaskGraph,
    size_bytes: float,
    hidden: tuple[str, ...],
    cfg: CostModelParams,
    arrival: FloatArray,
    slow: FloatArray,
) -> CostTerms:
    m = graph.num_messages
    src, dst = graph.task_src, graph.task_dst
    release = np.concatenate([np.maximum(arrival[src[:m]], arrival[dst[:m]]), arrival[src[m:]]])
    visible_op = ~graph.phase_mask(hidden)
    visible_task = visible_op[graph.task_op]
    # per-task and per-op term vectors: rows A, B, C, D
    task_terms = np.zeros((4, graph.num_tasks))
    task_terms[0, :m] = 1.0
    task_terms[1, :m] = graph.task_bytes(size_bytes)[:m] * np.maximum(slow[src[:m]], slow[dst[:m]])
    op_c = graph.op_reduced_bytes(size_bytes)
    op_d = graph.op_memory_bytes(size_bytes)
    local = graph.task_op[m:]
    task_terms[2, m:] = op_c[local]
    task_terms[3, m:] = op_d[local]
    task_terms[:, ~visible_task] = 0.0
    is_rr = (graph.op_kind == _RECV_REDUCE_CODE) & visible_op
    op_terms = np.zeros((4, graph.op_kind.size))
    op_terms[2] = np.where(is_rr, op_c, 0.0)
    op_terms[3] = np.where(is_rr, op_d, 0.0)

    weight = np.array([cfg.alpha, cfg.beta, cfg.gamma, cfg.delta])
    duration = weight @ task_terms
    op_extra = weight @ op_terms
    done = longest_path(graph, release, duration, op_extra)
    op_done = done[graph.op_task] + op_extra
    totals = op_terms[:, int(np.argmax(op_done))].copy() if op_done.size else np.zeros(4)
    first = -1
    if op_done.size:
        path = _trace_back(graph, done, duration, op_extra, release, int(graph.op_task[np.argmax(op_done)]))
        for task, edge_op in path:
            totals += task_terms[:, task]
            first = task
            if edge_op >= 0:
                totals += op_terms[:, edge_op]
    start = float(release[first]) if first >= 0 else 0.0
    incast = _incast_degree(
        graph.task_dst[:m][visible_task[:m]], done[:m][visible_task[:m]], duration[:m][visible_task[:m]]
    )
    return CostTerms(
        A=float(totals[0]), B=float(totals[1]), C=float(totals[2]), D=float(totals[3]), w=incast, start=start
    )


def _trace_back(
    graph: TaskGraph, done: FloatArray, duration: FloatArray, op_extra: FloatArray, release: FloatArray, last: int
) -> Iterable[tuple[int, int]]:
    """Walk from ``last`` back along tight edges to a task that started at its release; yield
    (task, op of the edge that led into it)."""
    edge_src = np.repeat(np.arange(graph.num_tasks), np.diff(graph.edge_ptr))
    by_dst = np.argsort(graph.edge_dst, kind="stable")
    in_ptr = np.zeros(graph.num_tasks + 1, dtype=np.int64)
    np.cumsum(np.bincount(graph.edge_dst, minlength=graph.num_tasks), out=in_ptr[1:])
    extra = np.where(graph.edge_from_op >= 0, op_extra[np.maximum(graph.edge_from_op, 0)], 0.0)
    scale = max(float(done.max()), 1e-300)
    task, via = last, -1
    for _ in range(graph.num_tasks):
        yield task, via
        start = done[task] - duration[task]
        if start <= release[task] + 1e-12 * scale:
            return
        edges = by_dst[in_ptr[task] : in_ptr[task + 1]]
        arrive = done[edge_src[edges]] + extra[edges]
        best = int(np.argmax(arrive))
        if arrive[best] < start - 1e-9 * scale:
            return
        task, via = int(edge_src[edges[best]]), int(graph.edge_from_op[edges[best]])


def _incast_degree(dst: np.ndarray, end: FloatArray, duration: FloatArray) -> int:
    """Most messages in progress into one rank at the same time (in the contention-free timeline)."""
    live = (duration > 0) & np.isfinite(end)
    if not live.any():
        return 1
    dst, end, start = dst[live], end[live], (end - duration)[live]
    # snap to a grid far below any message time so that back-to-back messages do not overlap by rounding
    grid = 1e-9 * float(end.max())
    times = np.round(np.concatenate([start, end]) / grid)
    ranks = np.concatenate([dst, dst])
    step = np.concatenate([np.ones(start.size, dtype=np.int64), -np.ones(end.size, dtype=np.int64)])
    order = np.lexsort((step, times, ranks))  # at equal times a flow ends before another starts
    ranks, step = ranks[order], step[order]
    running = np.cumsum(step)
    group_start = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
    base = np.repeat(running[group_start] - step[group_start], np.diff(np.r_[group_start, ranks.size]))
    return max(int((running - base).max()), 1)


# ------------------------------------------------------------------------------------------------
@dataclass(slots=True, kw_only=True, frozen=True)
class FitResult:
    """Parameters estimated by :func:`fit` and how well they explain the samples.

    Example::

        result = fit(samples)
        model = result.model()
    """

    config: CostModelParams
    """The fitted parameters (``incast_threshold`` as given to :func:`fit`)."""
    relative_rms: float
    """Root mean square of (predicted - measured) / measured over the samples."""
    max_relative_error: float
    """Largest |predicted - measured| / measured over the samples."""
    num_samples: int
    unidentified: tuple[str, ...]
    """Requested parameters that no sample exercises (their column is all zero); fixed at 0."""

    def model(self) -> CostModel:
        return CostModel(self.config)


def fit(
    samples: Sequence[tuple[CostTerms, float]],
    incast_threshold: float = 1.0,
    params: Sequence[str] = _PARAMS,
) -> FitResult:
    """Estimate non-negative alpha, beta, gamma, delta, epsilon from ``(terms, measured seconds)`` pairs.

    Non-negative least squares (``scipy.optimize.nnls``) on the *relative* error (each row divided
    by its measured time, so small and large buffers count alike), with columns scaled to unit
    norm. Only ``params`` are estimated (the others stay 0); of those, parameters that no sample
    exercises are reported in ``unidentified`` and fixed at 0. Note that schedules whose only local
    work is reductions have D = 3·C, so gamma and delta cannot both be fitted from them: pass
    ``params=("alpha", "beta", "gamma")`` (or delta instead of gamma).
    Raises ``ValueError`` for non-positive or non-finite times, for fewer samples than free
    parameters plus one, and for samples that cannot separate the parameters (e.g. every schedule
    has the same A/B ratio: vary the buffer size).

    Example::

        samples = [(cost_terms(ring(8), s), measured[s]) for s in sizes]
        result = fit(samples)
        print(result.config.alpha, result.relative_rms)
    """
    rows = list(samples)
    for i, row in enumerate(rows):
        if not (isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], CostTerms)):
            raise ValueError(f"sample {i} must be a (CostTerms, measured seconds) pair, got {row!r}")
        seconds = row[1]
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"sample {i}: measured time {seconds!r} must be a positive finite number of seconds")
    unknown = [p for p in params if p not in _PARAMS]
    if unknown or not params:
        raise ValueError(f"params must name some of {', '.join(_PARAMS)}; got {list(params)!r}")
    if not (math.isfinite(incast_threshold) and incast_threshold >= 0):
        raise ValueError(f"incast_threshold = {incast_threshold!r} must be a finite number >= 0")
    design = np.array(
        [[t.A, t.B, t.C, t.D, max(t.w - incast_threshold, 0.0) * t.B] for t, _ in rows], dtype=np.float64
    ).reshape(len(rows), len(_PARAMS))
    measured = np.array([s for _, s in rows], dtype=np.float64)
    if not np.isfinite(design).all() or (design < 0).any():
        raise ValueError("sample terms must be finite and non-negative")
    wanted = np.array([name in params for name in _PARAMS])
    exercised = np.abs(design).sum(axis=0) > 0
    used = np.flatnonzero(wanted & exercised)
    unidentified = tuple(_PARAMS[j] for j in np.flatnonzero(wanted & ~exercised))
    if used.size == 0:
        raise ValueError("every sample has zero terms (empty schedules?); nothing to fit")
    if len(rows) < used.size + 1:
        raise ValueError(
            f"fit needs at least {used.size + 1} samples to estimate {', '.join(_PARAMS[j] for j in used)} "
            f"and measure the error, got {len(rows)}; measure more buffer sizes or algorithms"
        )
    weighted = design[:, used] / measured[:, None]
    norms = np.linalg.norm(weighted, axis=0)
    scaled = weighted / norms
    singular = np.linalg.svd(scaled, compute_uv=False)
    if singular[-1] < 1e-9 * singular[0]:
        raise ValueError(
            f"the samples cannot tell {', '.join(_PARAMS[j] for j in used)} apart (some of their terms are "
            "proportional across all samples); add samples with other buffer sizes or algorithms, or fit fewer "
            "parameters (params=...)"
        )
    solution, _ = nnls(scaled, np.ones(len(rows)))
    estimate = np.zeros(len(_PARAMS))
    estimate[used] = solution / norms
    config = CostModelParams(
        **{name: float(estimate[j]) for j, name in enumerate(_PARAMS)}, incast_threshold=incast_threshold
    )
    relative = design @ estimate / measured - 1.0
    return FitResult(
        config=config,
        relative_rms=float(np.sqrt(np.mean(relative**2))),
        max_relative_error=float(np.abs(relative).max()),
        num_samples=len(rows),
        unidentified=unidentified,
    )


MODELS: dict[str, tuple[str, ...]] = {
    "alpha-beta": ("alpha", "beta"),
    "alpha-beta-gamma": ("alpha", "beta", "gamma"),
    "genmodel": ("alpha", "beta", "gamma", "delta", "epsilon"),
}
"""The cost models the loop and the calibration fit, by the parameters each may use (alpha-beta,
alpha-beta-gamma, GenModel; stragglerkit.detect.model_comparison compares them)."""

_ORDER = ("alpha", "beta", "gamma", "delta", "epsilon")
_RANK_TOLERANCE = 1e-6


def _columns(terms: CostTerms, threshold: float) -> list[float]:
    return [terms.A, terms.B, terms.C, terms.D, max(terms.w - threshold, 0.0) * terms.B]


def identifiable_params(
    rows: list[tuple[CostTerms, float]], wanted: Sequence[str], threshold: float = 1.0
) -> tuple[list[str], dict[str, str]]:
    """The parameters of ``wanted`` the rows can tell apart (in :data:`_ORDER`), and why the others not."""
    design = (
        np.array([_columns(t, threshold) for t, _ in rows], dtype=np.float64) / np.array([s for _, s in rows])[:, None]
    )
    kept: list[int] = []
    folded: dict[str, str] = {}
    for j, name in enumerate(_ORDER):
        if name not in wanted:
            continue
        column = design[:, j]
        if not np.any(column):
            folded[name] = "no sample exercises it (its term is 0 on every critical path)"
            continue
        trial = design[:, [*kept, j]]
        trial = trial / np.linalg.norm(trial, axis=0)
        singular = np.linalg.svd(trial, compute_uv=False)
        if singular[-1] < _RANK_TOLERANCE * singular[0]:
            others = ", ".join(_ORDER[k] for k in kept)
            folded[name] = f"its term is a combination of {others}'s on every sample (not separable)"
            continue
        kept.append(j)
    return [_ORDER[k] for k in kept], folded

"""The report's figures, drawn with matplotlib (Agg) into PNG bytes.

One function per figure, each taking a :class:`~.run_data.RunData` and returning a
:class:`Figure`: the PNG, or -- when the run has no data for it -- the one-line reason it is
left out (the HTML shows that line instead of the figure). The figures:

* ``report_lateness_cdf``: per rank, the distribution (CDF) of its arrival delay after the
  step's first arrival;
* ``report_last_rank``: which rank arrived last at each step, and how often each rank did;
* ``report_allreduce``: the AllReduce part per step (the step time where that is all there is),
  coloured by the algorithm that ran, with a line at every detection, switch, verification,
  rollback and clearing;
* ``report_nic_rates``: each rank's achieved NIC rate over the steps (and the detector's slowdown l);
* ``report_predicted``: the cost model's prediction against the measured AllReduce time.

Example::

    for figure in figures(run):
        print(figure.name, figure.reason or len(figure.png))
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

from stragglerkit.report.inputs import load
from stragglerkit.report.run_data import DETECTIONS, RunData, last_ranks

__all__ = ["FIGURES", "Figure", "event_log_figures", "figures"]

_DECISION_STYLE = {
    "detected_straggler": ("#d62728", "detected straggler"),
    "detected_degraded": ("#ff7f0e", "detected degraded NIC"),
    "switch": ("#2ca02c", "switch"),
    "would_switch": ("#bcbd22", "would switch (observing only)"),
    "verified": ("#1f77b4", "verified"),
    "rollback": ("#9467bd", "rollback"),
    "cleared": ("#7f7f7f", "cleared"),
}
_MAX_LABELLED = 12
"""Ranks beyond which a figure names only the few that stand out."""
_HIGHLIGHTED = 5
_ALGORITHM_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure: its file stem, title, a caption, and the PNG or the reason it is absent."""

    name: str
    title: str
    caption: str
    png: bytes | None = None
    reason: str | None = None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9,
            "axes.titlesize": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "legend.frameon": False,
        }
    )
    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    _pyplot().close(fig)
    return buffer.getvalue()


def _rank_colors(n: int) -> list[Any]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if n <= 10 else "viridis")
    return [cmap(i if n <= 10 else i / max(1, n - 1)) for i in range(n)]


def _no_lateness(run: RunData) -> str:
    if run.kind == "event log":
        return "no per-rank arrival times: the event log has no window lines (rank 0 writes them)"
    return "no per-rank arrival times in these inputs"


def lateness_cdf(run: RunData) -> Figure:
    title, name = "Arrival delay per rank", "report_lateness_cdf"
    caption = "Each rank's arrival at the AllReduce after the step's first arrival, as a CDF over the steps."
    n = run.world_size or 0
    series: list[list[float]] = [[] for _ in range(n)]
    for record in run.steps:
        for rank, value in enumerate(record.lateness_s or []):
            if value is not None and rank < n:
                series[rank].append(value * 1e3)
    if not any(series):
        return Figure(name, title, caption, reason=_no_lateness(run))
    if run.lateness_note:
        caption += " " + run.lateness_note[0].upper() + run.lateness_note[1:] + "."
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    colors = _rank_colors(n)
    shown = [rank for rank, values in enumerate(series) if values]
    if len(shown) > _MAX_LABELLED:  # many ranks: the latest few in colour, the others grey
        medians = {rank: sorted(series[rank])[len(series[rank]) // 2] for rank in shown}
        named = sorted(shown, key=lambda r: -medians[r])[:_HIGHLIGHTED]
        palette = _rank_colors(len(named))
        colors = [palette[named.index(r)] if r in named else "#c8c8c8" for r in range(n)]
        caption += f" The {len(named)} ranks with the largest median delay in colour, the other ranks in grey."
    else:
        named = shown
    for rank in sorted(shown, key=lambda r: r in named):  # the coloured ones on top
        values = sorted(series[rank])
        fractions = [(i + 1) / len(values) for i in range(len(values))]
        label = f"rank {rank}" if rank in named else ("other ranks" if rank == min(set(shown) - set(named)) else None)
        ax.step(values, fractions, where="post", color=colors[rank], label=label, lw=1.4 if rank in named else 0.8)
    ax.set_xlabel("arrival delay after the first rank (ms)")
    ax.set_ylabel("fraction of steps")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    return Figure(name, title, caption, png=_png(fig))


def last_rank(run: RunData) -> Figure:
    title, name = "Last rank to arrive", "report_last_rank"
    caption = "Which rank arrived last at each step (left) and how many steps each rank was last (right)."
    pairs = last_ranks(run)
    if not pairs:
        return Figure(name, title, caption, reason=_no_lateness(run))
    n = run.world_size or (max(r for _, r in pairs) + 1)
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [3, 1]})
    colors = _rank_colors(n)
    left.scatter([s for s, _ in pairs], [r for _, r in pairs], s=10, c=[colors[r] for _, r in pairs])
    left.set_xlabel("step")
    left.set_ylabel("last rank")
    left.set_ylim(-0.5, n - 0.5)
    if n <= 16:
        left.set_yticks(range(n))
    counts = [sum(1 for _, r in pairs if r == rank) for rank in range(n)]
    right.barh(range(n), counts, color=colors)
    right.set_xlabel("steps last")
    right.set_ylim(-0.5, n - 0.5)
    if n <= 16:
        right.set_yticks(range(n))
    fig.suptitle(title, fontsize=10)
    return Figure(name, title, caption, png=_png(fig))


def _algorithm_colors(run: RunData) -> dict[str, str]:
    names = list(dict.fromkeys(r.algorithm or "?" for r in run.steps))
    return {a: _ALGORITHM_COLORS[i % len(_ALGORITHM_COLORS)] for i, a in enumerate(names)}


def _mark_decisions(ax: Any, run: RunData) -> None:
    seen: set[str] = set()
    for decision in run.decisions:
        kind = decision["kind"]
        if kind not in _DECISION_STYLE:
            continue
        color, label = _DECISION_STYLE[kind]
        style = "--" if kind in DETECTIONS else ":" if kind == "would_switch" else "-"
        ax.axvline(decision["step"], color=color, ls=style, lw=1.1, alpha=0.85, label=None if kind in seen else label)
        seen.add(kind)


def allreduce_time(run: RunData) -> Figure:
    name = "report_allreduce"
    use_allreduce = any(r.allreduce_s is not None for r in run.steps)
    what = "AllReduce time" if use_allreduce else "Step time"
    title = f"{what} per step"
    caption = (
        "The AllReduce part of each step (last arrival to last finish), coloured by the algorithm that ran; "
        "lines mark the loop's decisions (dashed: detections)."
        if use_allreduce
        else f"Each step's time, coloured by the algorithm that ran; lines mark the loop's decisions "
        f"({run.step_time_note or 'no AllReduce times in these inputs'})."
    )
    points: list[tuple[int, float, str]] = []
    for r in run.steps:
        value = r.allreduce_s if use_allreduce else r.step_time_s
        if value is not None:
            points.append((r.step, value, r.algorithm or "?"))
    if not points:
        return Figure(name, title, caption, reason="no AllReduce or step times in these inputs")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.8))
    if not use_allreduce and any(r.baseline_step_s is not None for r in run.steps):
        base = [(r.step, r.baseline_step_s * 1e3) for r in run.steps if r.baseline_step_s is not None]
        ax.plot([s for s, _ in base], [v for _, v in base], color="#b0b0b0", lw=1.0, label="without stragglerkit")
    colors = _algorithm_colors(run)
    for algorithm, color in colors.items():
        mine = [(s, v * 1e3) for s, v, a in points if a == algorithm]
        if mine:
            ax.scatter([s for s, _ in mine], [v for _, v in mine], s=12, color=color, label=algorithm, zorder=3)
    _mark_decisions(ax, run)
    ax.set_xlabel("step" if run.kind != "bench (allreduce)" else "measured AllReduce (cases in order)")
    ax.set_ylabel(f"{what} (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    return Figure(name, title, caption, png=_png(fig))


def nic_rates(run: RunData) -> Figure:
    title, name = "NIC rate per rank", "report_nic_rates"
    caption = (
        "Each rank's achieved NIC rate as the stats exchanges measured it on its links (MB/s, 1 MB = 1e6 B; "
        "docs/event_log.md)."
    )
    samples = [s for s in run.nic if any(v is not None for v in s.rates_Bps)]
    if not samples:
        why = "no NIC rates: no probe ran" if run.kind == "event log" else f"no NIC rates in a {run.kind} input"
        return Figure(name, title, caption, reason=why)
    n = max(len(s.rates_Bps) for s in samples)
    slowdowns = [s for s in samples if s.slowdown and any(v is not None for v in s.slowdown)]
    plt = _pyplot()
    if slowdowns:
        fig, (ax, lower) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
        caption += " Below: the detector's slowdown estimate l per rank (1: healthy)."
    else:
        fig, ax = plt.subplots(figsize=(9, 3.4))
        lower = None
    colors = _rank_colors(n)
    named = list(range(n))
    if n > _MAX_LABELLED:  # many ranks: the slowest few in colour, the others grey
        rates = {
            r: sorted(v for s in samples if r < len(s.rates_Bps) and (v := s.rates_Bps[r]) is not None) for r in named
        }
        named = sorted((r for r in named if rates[r]), key=lambda r: rates[r][len(rates[r]) // 2])[:_HIGHLIGHTED]
        palette = _rank_colors(len(named))
        colors = [palette[named.index(r)] if r in named else "#c8c8c8" for r in range(n)]
        caption += f" The {len(named)} ranks with the lowest median rate in colour, the other ranks in grey."
    top = 1.0
    labelled_other = False
    for rank in sorted(range(n), key=lambda r: r in named):  # the coloured ones on top
        mine = [(s.step, s.rates_Bps[rank]) for s in samples if rank < len(s.rates_Bps)]
        points = [(step, v / 1e6) for step, v in mine if v is not None]
        if points:
            xs, ys = [s for s, _ in points], [v for _, v in points]
            label = f"rank {rank}" if rank in named else (None if labelled_other else "other ranks")
            labelled_other = labelled_other or rank not in named
            ax.plot(xs, ys, marker="o", ms=3 if rank in named else 0, color=colors[rank], label=label)
        if lower is not None:
            ls = [(s.step, s.slowdown[rank]) for s in slowdowns if s.slowdown and rank < len(s.slowdown)]
            known = [(step, v) for step, v in ls if v is not None]
            if known:
                lower.plot([s for s, _ in known], [v for _, v in known], marker=".", ms=3, color=colors[rank])
                top = max(top, *(v for _, v in known))
    _mark_decisions(ax, run)
    ax.set_ylabel("achieved rate (MB/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title)
    if lower is not None:
        _mark_decisions(lower, run)
        threshold = degraded_threshold(run.config)
        if isinstance(threshold, int | float):
            lower.axhline(threshold, color="#555555", ls=":", lw=0.9)
            lower.annotate("degraded above", (0.005, threshold), xycoords=("axes fraction", "data"), fontsize=7,
                           va="bottom", color="#555555")  # fmt: skip
            top = max(top, threshold)
        lower.set_ylim(0.8, top * 1.1 + 0.1)  # noise around 1 is not zoomed into a crisis
        lower.set_ylabel("slowdown l")
        lower.set_xlabel("step")
    else:
        ax.set_xlabel("step")
    return Figure(name, title, caption, png=_png(fig))


def degraded_threshold(config: dict[str, Any]) -> float | None:
    """The slowdown above which the run's loop called a NIC degraded: ``Config.detection`` in its
    header, or the ``detector`` section of a log written by 0.2.0."""
    for section in ("detection", "detector"):
        value = (config.get(section) or {}).get("degraded_threshold")
        if isinstance(value, int | float):
            return float(value)
    return None


def predicted_vs_measured(run: RunData) -> Figure:
    title, name = "Predicted against measured AllReduce time", "report_predicted"
    caption = (
        "The cost model's prediction of the AllReduce part for the plan that ran, against the measured one; "
        "on the dotted line they agree."
    )
    points: list[tuple[float | None, float | None, str]]
    if run.comparisons:
        points = [(c.predicted_s, c.measured_s, c.algorithm) for c in run.comparisons]
        caption = "Per bench case: the simulator's prediction against the measured time (the bench's median)."
    else:
        points = [(r.predicted_s, r.allreduce_s, r.algorithm or "?") for r in run.steps]
    pairs = [(p * 1e3, m * 1e3, a) for p, m, a in points if p is not None and m is not None]
    if not pairs:
        return Figure(name, title, caption, reason="no predictions: the inputs carry no cost-model prediction")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    colors = _algorithm_colors(run)
    for algorithm in dict.fromkeys(a for _, _, a in pairs):
        mine = [(p, m) for p, m, a in pairs if a == algorithm]
        ax.scatter(
            [p for p, _ in mine], [m for _, m in mine], s=14, label=algorithm, color=colors.get(algorithm), zorder=3
        )
    top = max(max(p, m) for p, m, _ in pairs) * 1.08
    ax.plot([0, top], [0, top], color="#555555", lw=0.8, ls=":", label="predicted = measured")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("predicted (ms)")
    ax.set_ylabel("measured (ms)")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title)
    return Figure(name, title, caption, png=_png(fig))


FIGURES = (allreduce_time, lateness_cdf, last_rank, nic_rates, predicted_vs_measured)
"""Every figure, in the report's order."""


def figures(run: RunData) -> list[Figure]:
    """All figures of ``run``, drawn or with the reason each is absent."""
    return [draw(run) for draw in FIGURES]


def event_log_figures(path: str | os.PathLike[str]) -> list[tuple[str, bytes]]:
    """The figures of the run in the event log ``path`` as ``(name, PNG bytes)``, those that could
    be drawn (what the W&B logger logs when the loop closes: telemetry/wandb.py)."""
    loaded = load([os.fspath(path)])
    if loaded.run is None:
        return []
    return [(figure.name, figure.png) for figure in figures(loaded.run) if figure.png is not None]

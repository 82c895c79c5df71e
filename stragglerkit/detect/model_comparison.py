"""GenModel against the alpha-beta-gamma model, fitted to measured AllReduces and compared.

The models. All three predict an AllReduce's time from its schedule's critical path
(:func:`stragglerkit.sim.cost_model.graph_cost_terms`) as ``T = A·alpha + B·beta + C·gamma +
D·delta + max(w - w_t, 0)·B·epsilon``; they differ in which parameters they may use:

* ``alpha-beta``: latency and bandwidth only (what the loop fitted online before this comparison);
* ``alpha-beta-gamma``: the classic model (Hockney's plus a per-byte reduction cost);
* ``genmodel``: GenModel (Xiong et al.), adding the memory-access term ``delta`` and the incast
  term ``epsilon`` (threshold ``w_t = 1``: any incast pays).

Measured runs have a straggler and slow NICs, so the terms are those of the path that is critical
*in that run*: every rank starts at its measured arrival and a message through a NIC slowed by
``l`` counts ``l`` times its bytes in B. Which path is critical depends on the parameters, so the
fit alternates: terms under the current parameters, then non-negative least squares on the
relative error (:func:`stragglerkit.sim.cost_model.fit`), until the parameters settle (at most
:data:`FIT_ROUNDS` rounds).

Identifiability. A parameter is fitted only if its column of terms adds information to those
before it (in the order alpha, beta, gamma, delta, epsilon); otherwise it is *folded* into them
and reported. On this executor that happens to both of GenModel's extra terms: its reductions
are pairwise (``recv_reduce``: D = 3·C on every path, so delta cannot be told from gamma), and its
checked round schedules never put two flows on one NIC direction (w = 1: epsilon never applies).
The comparison reports that rather than inventing a difference.

The comparison (:func:`compare`). Per network (each emulated NIC rate, loopback), the samples are
split by a stable hash of their setting: one in three is held out. Each model is fitted on the
rest and its relative error ``(predicted - measured) / measured`` on the held-out samples is
reported (median and worst of its absolute value) per algorithm and overall. *Decisions*: in each
measured setting (network, world size, scenario, size) with several algorithms, each model picks
the one it predicts fastest; the summary counts where the models disagree and what their picks
measured against the fastest measured algorithm.

Example::

    summary = compare(samples)        # samples: stragglerkit bench --mode calibrate's records
    print(format_comparison(summary))
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import zlib
from collections.abc import Sequence
from typing import Any

from stragglerkit.planner.policy import planned_situation
from stragglerkit.planner.schedules import schedule_for
from stragglerkit.sim.cost_model import MODELS, CostModel, CostTerms, fit, graph_cost_terms, identifiable_params
from stragglerkit.sim.graph import TaskGraph, build_task_graph

__all__ = [
    "FIT_ROUNDS",
    "MODELS",
    "ModelFit",
    "compare",
    "fit_model",
    "format_comparison",
    "identifiable_params",
    "predict",
]

PAPER = {"genmodel": 0.026, "alpha-beta-gamma": 0.198}
"""The GenModel paper's prediction errors (GenModel about 2.6 %, alpha-beta-gamma up to 19.8 %)."""
FIT_ROUNDS = 8
HELD_OUT_EVERY = 3
LARGE_BYTES = 1 << 20
"""Buffers from this size on are reported apart: gradient buckets are this size and larger, and on
a CPU testbed the smaller ones are timed mostly by process scheduling, not by the network."""


@dataclasses.dataclass(slots=True, kw_only=True)
class ModelFit:
    """One model fitted to one network's samples."""

    model: str
    config: CostModel.Config
    fitted: tuple[str, ...]
    """Parameters estimated (the others are 0)."""
    folded: dict[str, str]
    """Parameters the samples cannot tell apart from the fitted ones -> why."""
    rounds: int
    """Fit rounds until the critical paths settled."""


class _Graphs:
    """Task graphs of the schedules the samples ran, built once each."""

    def __init__(self) -> None:
        self._graphs: dict[tuple[object, ...], TaskGraph] = {}

    def of(self, sample: dict[str, Any]) -> TaskGraph:
        algorithm = sample["algorithm"]
        slowdowns = {int(k): float(v) for k, v in sample["slowdowns"].items()}
        situation = planned_situation(
            algorithm, int(sample["world_size"]), sample["straggler"], slowdowns, int(sample["size_bytes"])
        )
        key = (algorithm, situation.key())
        graph = self._graphs.get(key)
        if graph is None:
            graph = build_task_graph(schedule_for(algorithm, situation))
            self._graphs[key] = graph
        return graph


def _terms(graphs: _Graphs, sample: dict[str, Any], weights: CostModel.Config) -> CostTerms:
    slowdowns = {int(k): float(v) for k, v in sample["slowdowns"].items()}
    return graph_cost_terms(
        graphs.of(sample), sample["size_bytes"], weights=weights, arrivals=sample["arrivals_s"], slowdowns=slowdowns
    )


def predict(graphs: _Graphs, sample: dict[str, Any], config: CostModel.Config) -> float:
    """Predicted seconds from the last arrival of ``sample``'s run under ``config``."""
    terms = _terms(graphs, sample, config)
    return CostModel(config).predict_from_last_arrival(terms, max(sample["arrivals_s"]))


def fit_model(
    model: str, samples: Sequence[dict[str, Any]], prior: CostModel.Config, graphs: _Graphs | None = None
) -> ModelFit:
    """Fit ``model``'s parameters to ``samples`` of one network (see the module docstring)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
    graphs = graphs or _Graphs()
    config = dataclasses.replace(prior, **{p: 0.0 for p in ("gamma", "delta", "epsilon") if p not in MODELS[model]})
    fitted: list[str] = []
    folded: dict[str, str] = {}
    rounds = 0
    for rounds in range(1, FIT_ROUNDS + 1):  # noqa: B007 (the count is reported)
        rows = []
        # a token reduction cost when tracing the paths: among paths of equal length the one
        # through the reductions is taken, so that gamma has a column to be fitted from
        token = config.beta * 1e-3 if "gamma" in MODELS[model] else 0.0
        tracing = dataclasses.replace(config, gamma=max(config.gamma, token))
        for sample in samples:
            terms = _terms(graphs, sample, tracing)
            # the path's length is what the parameters explain: the time from the last arrival
            # plus the wait between the path's start and the last arrival
            rows.append((terms, sample["time_s"] + max(sample["arrivals_s"]) - terms.start))
        fitted, folded = identifiable_params(rows, MODELS[model], config.incast_threshold)
        result = fit(rows, incast_threshold=config.incast_threshold, params=fitted)
        new = dataclasses.replace(result.config)
        change = max(abs(getattr(new, p) - getattr(config, p)) / max(abs(getattr(config, p)), 1e-30) for p in fitted)
        config = new
        if change < 1e-4:
            break
    return ModelFit(model=model, config=config, fitted=tuple(fitted), folded=folded, rounds=rounds)


def _held_out(sample: dict[str, Any]) -> bool:
    key = (
        f"{sample['network']}|{sample['world_size']}|{sample['scenario']}|{sample['algorithm']}|{sample['size_bytes']}"
    )
    return zlib.crc32(key.encode()) % HELD_OUT_EVERY == 0


def _prior(samples: Sequence[dict[str, Any]]) -> CostModel.Config:
    alphas = [s["alpha_ping_s"] for s in samples if s.get("alpha_ping_s")]
    rates = [s["bandwidth_Bps"] for s in samples if s.get("bandwidth_Bps")]
    return CostModel.Config(
        alpha=statistics.median(alphas) if alphas else 50e-6, beta=1.0 / (statistics.median(rates) if rates else 1e9)
    )


def _errors(values: list[float]) -> dict[str, Any]:
    absolute = [abs(v) for v in values]
    return {
        "samples": len(values),
        "median_abs": statistics.median(absolute) if absolute else None,
        "worst_abs": max(absolute) if absolute else None,
        "mean_signed": statistics.fmean(values) if values else None,
    }


def compare(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Fit every model per network, errors on the held-out samples, and the models' decisions."""
    usable = [s for s in samples if s["time_s"] > 0 and math.isfinite(s["time_s"])]
    if not usable:
        raise ValueError("no samples with a positive measured time to fit; run stragglerkit bench --mode calibrate")
    graphs = _Graphs()
    networks = sorted({s["network"] for s in usable})
    per_network: dict[str, Any] = {}
    overall: dict[str, list[float]] = {m: [] for m in MODELS}
    by_algorithm: dict[str, dict[str, list[float]]] = {m: {} for m in MODELS}
    by_scenario: dict[str, dict[str, list[float]]] = {m: {} for m in MODELS}
    by_size: dict[str, dict[int, list[float]]] = {m: {} for m in MODELS}
    decisions: list[dict[str, Any]] = []
    for network in networks:
        mine = [s for s in usable if s["network"] == network]
        train = [s for s in mine if not _held_out(s)]
        test = [s for s in mine if _held_out(s)]
        prior = _prior(mine)
        fits: dict[str, ModelFit] = {}
        entry: dict[str, Any] = {"train": len(train), "held_out": len(test), "models": {}}
        for model in MODELS:
            try:
                fits[model] = fit_model(model, train, prior, graphs)
            except ValueError as err:
                entry["models"][model] = {"error": str(err)}
                continue
            found = fits[model]
            relative = []
            for sample in test:
                error = predict(graphs, sample, found.config) / sample["time_s"] - 1.0
                relative.append(error)
                by_algorithm[model].setdefault(sample["algorithm"], []).append(error)
                by_scenario[model].setdefault(sample["scenario"], []).append(error)
                by_size[model].setdefault(int(sample["size_bytes"]), []).append(error)
            overall[model].extend(relative)
            entry["models"][model] = {
                "params": {p: getattr(found.config, p) for p in MODELS["genmodel"]},
                "fitted": list(found.fitted),
                "folded": found.folded,
                "fit_rounds": found.rounds,
                "held_out_error": _errors(relative),
                "held_out_error_large": _errors(
                    [e for e, sample in zip(relative, test, strict=True) if sample["size_bytes"] >= LARGE_BYTES]
                ),
            }
        per_network[network] = entry
        decisions.extend(_decisions(graphs, mine, fits, network))
    return {
        "models": {m: list(p) for m, p in MODELS.items()},
        "paper": PAPER,
        "networks": per_network,
        "overall": {m: _errors(v) for m, v in overall.items()},
        "by_algorithm": {m: {a: _errors(v) for a, v in sorted(d.items())} for m, d in by_algorithm.items()},
        "by_scenario": {m: {s: _errors(v) for s, v in sorted(d.items())} for m, d in by_scenario.items()},
        "by_size": {m: {str(s): _errors(v) for s, v in sorted(d.items())} for m, d in by_size.items()},
        "large": {
            m: _errors([e for size, v in d.items() if size >= LARGE_BYTES for e in v]) for m, d in by_size.items()
        },
        "decisions": _decision_summary(decisions),
        "loop_choice": _loop_choice(usable),
    }


def _loop_choice(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the loop's online model (:class:`stragglerkit.detect.model.OnlineModel`) picks when fed
    the fault-free baseline runs of one network and world size, of bucket sizes (from
    :data:`LARGE_BYTES`), as probes, iteration by iteration (each a step: every size of every
    baseline), refitted after each step."""
    from stragglerkit.detect.model import BASELINES, OnlineModel

    out = []
    settings = sorted({(s["network"], s["world_size"]) for s in samples})
    for network, n in settings:
        probes = [
            s
            for s in samples
            if (s["network"], s["world_size"], s["scenario"]) == (network, n, "none")
            and s["algorithm"] in BASELINES
            and s["size_bytes"] >= LARGE_BYTES
        ]
        if not probes:
            continue
        online = OnlineModel(n, _prior(probes))
        runs = {id(s): s.get("times_s") or [s["time_s"]] for s in probes}
        for iteration in range(max(len(times) for times in runs.values())):
            for sample in sorted(probes, key=lambda s: (s["size_bytes"], s["algorithm"])):
                times = runs[id(sample)]
                if iteration < len(times) and times[iteration] > 0:
                    online.add(sample["algorithm"], int(sample["size_bytes"]), float(times[iteration]))
            online.refit()
        info = online.fit_info
        out.append(
            {
                "network": network,
                "world_size": n,
                "probes": info.get("samples"),
                "model": info.get("model"),
                "model_errors": info.get("model_errors"),
                "candidates": info.get("candidates"),
            }
        )
    return out


def _decisions(
    graphs: _Graphs, samples: list[dict[str, Any]], fits: dict[str, ModelFit], network: str
) -> list[dict[str, Any]]:
    """Per measured setting with several algorithms: each model's pick and what it measured."""
    settings: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for sample in samples:
        settings.setdefault((sample["world_size"], sample["scenario"], sample["size_bytes"]), []).append(sample)
    out = []
    for (n, scenario, size), group in sorted(settings.items()):
        if len(group) < 2:
            continue
        best = min(group, key=lambda s: s["time_s"])
        picks = {}
        for model, found in fits.items():
            pick = min(group, key=lambda s: predict(graphs, s, found.config))
            picks[model] = {"algorithm": pick["algorithm"], "measured_s": pick["time_s"]}
        out.append(
            {
                "network": network,
                "world_size": n,
                "scenario": scenario,
                "size_bytes": size,
                "fastest": best["algorithm"],
                "fastest_s": best["time_s"],
                "picks": picks,
            }
        )
    return out


def _decision_summary(decisions: list[dict[str, Any]]) -> dict[str, Any]:
    models = sorted({m for d in decisions for m in d["picks"]})
    summary: dict[str, Any] = {"settings": len(decisions), "per_model": {}, "large": {}, "disagreements": []}
    for key, chosen in (("per_model", decisions), ("large", [d for d in decisions if d["size_bytes"] >= LARGE_BYTES])):
        for model in models:
            mine = [d for d in chosen if model in d["picks"]]
            ratios = [d["picks"][model]["measured_s"] / d["fastest_s"] for d in mine]
            summary[key][model] = {
                "settings": len(mine),
                "picked_fastest": sum(1 for d in mine if d["picks"][model]["algorithm"] == d["fastest"]),
                "mean_slowdown_vs_fastest": statistics.fmean(ratios) if ratios else None,
                "worst_slowdown_vs_fastest": max(ratios) if ratios else None,
            }
    for d in decisions:
        if len({p["algorithm"] for p in d["picks"].values()}) > 1:
            summary["disagreements"].append(d)
    return summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def format_comparison(summary: dict[str, Any]) -> str:
    """The comparison as text tables (held-out errors, fitted parameters, decisions)."""
    models = list(summary["models"])
    lines = ["held-out relative prediction error |predicted - measured| / measured: median (worst)", ""]
    head = f"{'':24}" + "".join(f"{m:>24}" for m in models)
    lines.append(head)

    def row(label: str, stats: dict[str, dict[str, Any]]) -> str:
        cells = []
        for m in models:
            s = stats.get(m)
            cells.append(
                "-" if not s or s["median_abs"] is None else f"{_pct(s['median_abs'])} ({_pct(s['worst_abs'])})"
            )
        return f"{label:24}" + "".join(f"{c:>24}" for c in cells)

    lines.append(row("all samples", summary["overall"]))
    lines.append(row(f"  buffers >= {LARGE_BYTES >> 20} MiB", summary["large"]))
    algorithms = sorted({a for m in models for a in summary["by_algorithm"][m]})
    for a in algorithms:
        lines.append(row(f"  {a}", {m: summary["by_algorithm"][m].get(a, {}) for m in models}))
    sizes = sorted({int(s) for m in models for s in summary["by_size"][m]})
    for size in sizes:
        label = f"  {size >> 20} MiB" if size >= 1 << 20 else f"  {size >> 10} KiB"
        lines.append(row(label, {m: summary["by_size"][m].get(str(size), {}) for m in models}))
    scenarios = sorted({s for m in models for s in summary["by_scenario"][m]})
    for s in scenarios:
        lines.append(row(f"  scenario {s}", {m: summary["by_scenario"][m].get(s, {}) for m in models}))
    for network, entry in summary["networks"].items():
        stats = {m: e.get("held_out_error", {}) for m, e in entry["models"].items()}
        lines.append(row(f"  {network}", stats))
        stats = {m: e.get("held_out_error_large", {}) for m, e in entry["models"].items()}
        lines.append(row(f"    >= {LARGE_BYTES >> 20} MiB", stats))
    lines.append(
        f"{'paper':24}"
        + "".join(f"{('~' + _pct(summary['paper'].get(m))) if m in summary['paper'] else '':>24}" for m in models)
    )
    lines += ["", "fitted parameters per network (alpha us, bandwidth MB/s, gamma/delta ns/B, epsilon):"]
    for network, entry in summary["networks"].items():
        for m, e in entry["models"].items():
            if "error" in e:
                lines.append(f"  {network:22} {m:18} not fitted: {e['error']}")
                continue
            p = e["params"]
            bw = "-" if p["beta"] <= 0 else f"{1 / p['beta'] / 1e6:.1f}"
            folded = "; ".join(f"{k} folded: {v}" for k, v in e["folded"].items())
            lines.append(
                f"  {network:22} {m:18} alpha {p['alpha'] * 1e6:8.1f}  bw {bw:>8}  gamma {p['gamma'] * 1e9:6.3f}  "
                f"delta {p['delta'] * 1e9:6.3f}  eps {p['epsilon']:.3g}" + (f"  ({folded})" if folded else "")
            )
    d = summary["decisions"]
    lines += ["", f"decisions: {d['settings']} measured settings with several algorithms"]
    for key, title in (("per_model", "all sizes"), ("large", f"buffers >= {LARGE_BYTES >> 20} MiB")):
        for m, s in d[key].items():
            if not s["settings"]:
                continue
            lines.append(
                f"  {title:16} {m:18} picked the fastest in {s['picked_fastest']}/{s['settings']}, its picks "
                f"measured {s['mean_slowdown_vs_fastest']:.3f}x the fastest on average "
                f"({s['worst_slowdown_vs_fastest']:.2f}x worst)"
            )
    lines.append(f"  the models disagree in {len(d['disagreements'])} settings")
    lines += [
        "",
        f"the loop's choice, fed each network's fault-free ring/rhd/direct runs from {LARGE_BYTES >> 20} MiB as probes "
        "(median error on unseen probes):",
    ]
    for choice in summary.get("loop_choice", []):
        errors = ", ".join(f"{m} {_pct(e)}" for m, e in (choice["model_errors"] or {}).items())
        lines.append(f"  {choice['network']:22} n={choice['world_size']}: {choice['model']} ({errors})")
    return "\n".join(lines)

"""Render every results table of docs/results.md and README.md from ``profiling/results/*.json``.

The pages keep their figures only inside generated blocks::

    <!-- results:NAME -->
    ...what this script renders for NAME...
    <!-- /results:NAME -->

Nothing between the markers is typed by hand: after a benchmark has overwritten its summary, run
this script and commit the pages with the summary. ``--check`` rewrites nothing and exits with 1,
naming each block whose text differs from what the summaries render (tests/test_results_pages.py
runs it). The rules every table follows (profiling/_provenance.py): one CPU model per table, named
with the commit; a figure whose measured code changed since its commit, whose commit is not in the
history, or whose summary records no CPU model renders as stale; where a summary carries an A/A
control, a difference smaller than the control's spread is called noise, not met or missed.

Example::

    python profiling/render_results.py            # rewrite the blocks in place
    python profiling/render_results.py --check    # exit 1 if a page differs from its data
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import ROOT, Stamp, one_machine, staleness, stamp_of

RESULTS = ROOT / "profiling" / "results"
PAGES = (ROOT / "docs" / "results.md", ROOT / "README.md")
BLOCK = re.compile(r"<!-- results:(?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /results:(?P=name) -->", re.S)
# A figure typed by hand: a number with the unit of a measured ratio, share or time.
FIGURE = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?\s?(?:x|%|ms|s|us|min)(?![\w/])")


# --- formatting -------------------------------------------------------------------------------


def fx(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def fpct(value: float | None, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f} %" if signed else f"{100 * value:.1f} %"


def fsec(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10:
        return f"{value:.0f} s"
    if value >= 1:
        return f"{value:.1f} s"
    if value >= 0.01:
        return f"{value:.2f} s"
    return f"{value * 1e3:.1f} ms"


def steps(values: Sequence[int | None]) -> str:
    return ", ".join("-" if v is None else str(v) for v in values)


def verdict(met: bool | None, noise: float | None = None, measured: float | None = None,
            threshold: float | None = None) -> str:
    """yes, **no**, or noise: where an A/A control's spread (``noise``: how far the two identical
    copies' ratio landed from one) is at least the figure's distance from its ``threshold``, the
    run cannot tell whether the target is met or missed."""
    if noise is not None and measured is not None and threshold is not None and abs(measured - threshold) <= noise:
        return f"noise (A/A ±{100 * noise:.1f} %)"
    if met is None:
        return "-"
    return "yes" if met else "**no**"


# --- tables -----------------------------------------------------------------------------------


@dataclass
class Row:
    cells: list[str]
    stamp: Stamp


def _stamp_cell(stamp: Stamp) -> str:
    why = staleness(stamp)
    text = f"`{stamp.short_commit}`, {stamp.cpu}, {stamp.day}"
    return f"{text}; **{why}**" if why else text


def machine_line(stamps: Sequence[Stamp], table: str) -> str:
    """The caption: the table's one CPU model (refusing two), cores, kernel, load, commands."""
    machine = one_machine(stamps, table)
    if machine is None:
        return ""
    loads = [s.load for s in stamps if s.load is not None]
    load_text = "" if not loads else f", load {min(loads):.1f}" + (
        "" if max(loads) == min(loads) else f"-{max(loads):.1f}"
    )
    kernel = f", Linux {machine.kernel}" if machine.kernel else ""
    cores = f", {machine.cores} cores" if machine.cores else ""
    modified = any(s.modified for s in stamps)
    commands = list(dict.fromkeys(s.command for s in stamps if s.command))
    text = f"*Machine: {machine.cpu}{cores}{kernel}{load_text}.*"
    if modified:
        text += " *Measured on a tree with uncommitted changes.*"
    if len(commands) == 1:
        text += f" Command: `{commands[0]}`."
    return text


def table(name: str, header: Sequence[str], rows: Sequence[Row], shared: Stamp | None = None) -> str:
    """A Markdown table under its machine caption. With ``shared`` every row comes from one
    measurement, which the caption names; otherwise each row names its own commit, CPU and date."""
    stamps = [shared] if shared is not None else [r.stamp for r in rows]
    lines = [machine_line(stamps, name), ""]
    if shared is not None:
        lines[0] += f" Every row: {_stamp_cell(shared)}."
        cols = list(header)
    else:
        cols = [*header, "commit, CPU, date"]
    lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for row in rows:
        cells = row.cells if shared is not None else [*row.cells, _stamp_cell(row.stamp)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


# --- docs/results.md --------------------------------------------------------------------------


def _acceptance_value(value: float, unit: str) -> str:
    return fx(value) if unit == "x" else fpct(value)


def acceptance() -> str:
    record = load("bench_acceptance.json")
    stamp = stamp_of(record)
    rows = [
        Row(
            [
                f["figure"],
                f["target"],
                f"**{_acceptance_value(f['measured'], f['unit'])}**",
                ", ".join(_acceptance_value(v, f["unit"]) for v in f["runs"]),
                _acceptance_value(f["model"], f["unit"]),
                verdict(f["met"]),
            ],
            stamp,
        )
        for f in record["figures"]
    ]
    return table("acceptance", ["figure", "target", "measured (median)", "runs", "model", "met"], rows, stamp)


_PLAIN = {
    "ddp": "plain DDP step / hooked step",
    "horovod": "plain Horovod step / straggler_aware step",
    "megatron": "plain megatron-core step / flag-on step",
}


def _scenario_stamp(record: dict[str, Any], scenario: dict[str, Any]) -> Stamp:
    """A training scenario's runs: their own command, commit and date, on the summary's machine."""
    return stamp_of(record, {"command": scenario["command"], "commit": scenario["commit"],
                             "date": scenario["dates"][0],
                             "machine": scenario.get("machine") or record.get("machine", {})})


def train(name: str) -> Callable[[], str]:
    def render() -> str:
        record = load(name)
        rows = []
        for s in record["scenarios"]:
            stamp = _scenario_stamp(record, s)
            switched = ", ".join(sorted({str(a or "-") for a in s["switched_to"]}))
            control = s.get("control")
            rows.append(
                Row(
                    [
                        s["description"],
                        s["target"],
                        f"**{fx(s['speedup_steady'])}**",
                        ", ".join(fx(v) for v in s["runs"]),
                        "-" if control is None else f"{fx(control)} (±{100 * s['control_spread']:.1f} %)",
                        steps(s["detected_step"]),
                        steps(s.get("switched_step", [])),
                        switched,
                        _train_verdict(s),
                    ],
                    stamp,
                )
            )
        header = ["scenario", "target", f"{_PLAIN[record.get('framework', 'ddp')]} (median)", "runs",
                  "A/A control (median, spread)", "detected at step", "switched at step", "switched to", "met"]
        return table(name, header, rows)

    return render


NO_FAULT_CONTROL = 0.01
"""A no-fault figure counts as met or missed only where every run's A/A control is within 1 % of
parity: a cost of 1 % cannot be told apart in a launch whose two identical copies land further
apart."""


def _train_verdict(scenario: dict[str, Any]) -> str:
    """A training scenario's verdict: noise where its A/A control's spread reaches the figure's
    distance from its target, or (with nothing wrong) exceeds 1 %."""
    spread = scenario.get("control_spread")
    if scenario["scenario"] == "no_fault" and spread is not None and spread > NO_FAULT_CONTROL:
        return f"noise (A/A ±{100 * spread:.1f} %)"
    return verdict(scenario["met"], spread, scenario["speedup_steady"], scenario.get("lowest"))


HOOK_TARGET = 0.98
"""Plain DDP's step over the hook's with nothing wrong: the hook costs at most 2 %."""


def _hook_noise(record: dict[str, Any]) -> float:
    """The A/A spread: how far torch's own hook, which does plain DDP's work, lands from one."""
    return max(
        abs(r["plain_over_copy_median"] - 1.0)
        for run in record["per_run"]
        for r in run["rows"]
        if r["copy"] == "builtin_allreduce_hook"
    )


def hook_overhead() -> str:
    record = load("bench_hook_overhead.json")
    stamp = stamp_of(record)
    names = {
        "builtin_allreduce_hook": "torch's built-in C++ allreduce hook (A/A control: the same work as plain DDP)",
        "python_allreduce_hook": "the smallest Python hook (divide, all_reduce)",
        "hook_quiet": "stragglerkit's hook, no exchange, no probes",
        "hook_exchange_only": "the same with the stats exchange and the controller",
        "hook_default": "stragglerkit's hook, defaults (exchange, probes)",
    }
    noise = _hook_noise(record)
    target = HOOK_TARGET
    rows = []
    for r in record["rows"]:
        if r["copy"] == "plain":
            continue
        per_run = [next(x for x in run["rows"] if x["copy"] == r["copy"]) for run in record["per_run"]]
        is_target = r["copy"] == "hook_default"
        rows.append(
            Row(
                [
                    names.get(r["copy"], r["copy"]),
                    f"**{r['plain_over_copy_median']:.3f}**" if is_target else f"{r['plain_over_copy_median']:.3f}",
                    ", ".join(f"{x['plain_over_copy_median']:.3f}" for x in per_run),
                    f"{r['plain_over_copy_mean']:.3f}",
                    f">= {target}" if is_target else "-",
                    verdict(r["plain_over_copy_median"] >= target, noise, r["plain_over_copy_median"], target)
                    if is_target
                    else "-",
                ],
                stamp,
            )
        )
    return table(
        "hook-overhead",
        ["copy", "plain step / copy's step, by median step", "per launch", "by mean step", "target", "met"],
        rows,
        stamp,
    )


def link_estimate() -> str:
    record = load("bench_link_estimate.json")
    stamp = stamp_of(record)
    s = record["summary"]
    rows = [
        Row(
            [
                label,
                f"{s[key]['degraded_min']:.2f}-{s[key]['degraded_max']:.2f}",
                f"{s[key]['degraded_median']:.2f}",
                f"{s[key]['others_max']:.2f}",
            ],
            stamp,
        )
        for key, label in (("busy", "while the ring is busy (what the loop reads)"), ("first", "first ring only"))
        if key in s
    ]
    return table("link-estimate", ["read", "rank 3's l, range", "rank 3's l, median", "largest l of any other rank"],
                 rows, stamp)


def executor() -> str:
    record = load("bench_executor.json")
    stamp = stamp_of(record)
    targets = record["targets"]
    rows = []
    for r in record["rows"]:
        key = "64MiB_ratio_max" if r["size_bytes"] >= 1 << 20 else "1KiB_ratio_max"
        size = f"{r['size_bytes'] >> 20} MiB" if r["size_bytes"] >= 1 << 20 else f"{r['size_bytes'] >> 10} KiB"
        ratio = r["ratio_of_medians"]
        control = r.get("control_ratio_of_medians")  # gloo against itself, interleaved the same way
        noise = None if control is None else abs(control - 1.0)
        rows.append(
            Row(
                [size, fsec(r["gloo"]["median_s"]), fsec(r["ours"]["median_s"]), f"**{ratio:.2f}x**",
                 "-" if control is None else f"{control:.2f}x", f"<= {targets[key]:g}x", str(r["wrong"]),
                 verdict(ratio <= targets[key], noise, ratio, targets[key])],
                stamp,
            )
        )
    return table("executor", ["size", "gloo", "our ring", "ours / gloo", "gloo / gloo (A/A)", "target", "#wrong",
                              "met"], rows, stamp)


def schedules() -> str:
    record = load("bench_schedules.json")
    stamp = stamp_of(record)
    gen = record["stragglar"]["generation"]
    paper = record["stragglar"]["paper_seconds_n256"]
    rows = [
        Row([f"StragglAR schedule, n = {g['n']}", f"{g['rounds']} rounds", fsec(g["wall_s_median"]),
             f"paper: {paper:g} s" if g["n"] == 256 else "-"], stamp)
        for g in gen
    ]
    budget = record["optcc"]["budget_ms"]
    for o in record["optcc"]["rows"]:
        rows.append(Row([f"OptCC plan, p = {o['p']}, k = {o['segments']}, l = {o['slowdown']:.3g}",
                         f"{o['num_windows']} windows", f"{o['plan_ms']:.3f} ms", f"budget {budget:g} ms"], stamp))
    sim = record["simulator"]
    for r in sim["rows"]:
        rows.append(Row([f"simulate {r['algorithm']}, n = {r['world_size']}", f"{r['num_ops']} ops",
                         fsec(r["simulate_median_s"]), "-"], stamp))
    rows.append(Row(["simulate ring + StragglAR, n = 1024, together", "-",
                     f"**{fsec(sim['simulate_total_median_s'])}**", "target 10 s"], stamp))
    return table("schedules", ["what", "size", "time (median)", "reference"], rows, stamp)


def scale(stages: Sequence[str]) -> Callable[[], str]:
    def render() -> str:
        record = load("scale.json")
        sizes = [p for p in record["sizes"] if p >= 64 or p == 8]
        rows = []
        for stage in stages:
            for case in record["stages"].get(stage, []):
                by_p = {r["p"]: r for r in case["rows"]}
                cells = []
                for p in sizes:
                    r = by_p.get(p)
                    if r is None or r.get("seconds") is None:
                        cells.append(f"> {record['timeout_s']:g} s" if r is not None else "-")
                        continue
                    text = fsec(r["seconds"])
                    cells.append(f"**{text}**" if p == 1024 else text)
                slope = case.get("slope")  # bench_scale.py's least squares of log time on log p
                done = [r for r in case["rows"] if r.get("seconds") is not None and r.get("rss_mb") is not None]
                memory = "-" if not done else f"{done[-1]['rss_mb']:,.0f} MB (p = {done[-1]['p']})"
                rows.append(Row([stage, case["case"], *cells, "-" if slope is None else f"{slope:.2f}", memory],
                                stamp_of(record, case.get("measured"))))
        header = ["stage", "case", *[f"p = {p}" for p in sizes], "slope", "peak RSS, largest p measured"]
        return table(f"scale-{'-'.join(stages)}", header, rows)

    return render


def selective_sim() -> str:
    from _selective_summary import tables

    record = load("selective_sim.json")
    stamp = stamp_of(record)
    body = tables(record).split("\n", 2)[2]  # without its own "Measured:" line: the caption names it
    return machine_line([stamp], "selective-sim") + f" Every table: {_stamp_cell(stamp)}.\n\n" + body.rstrip()


def selective_train() -> str:
    from _selective_train_summary import table as method_table

    record = load("train_selective.json")
    stamp = stamp_of(record)
    return machine_line([stamp], "selective-train") + f" Every row: {_stamp_cell(stamp)}.\n\n" + method_table(record)


def calibration() -> str:
    record = load("calibration.json")
    stamp = stamp_of(record)
    # GenModel's own terms are not separable on this executor (see the text): its column would
    # repeat alpha-beta-gamma's, so only the two models that are really compared are shown.
    models = [m for m in ("alpha-beta", "alpha-beta-gamma") if m in record["models"]]

    def cells(stats: dict[str, Any]) -> list[str]:
        out = []
        for m in models:
            s = stats.get(m) or {}
            out.append("-" if s.get("median_abs") is None else
                       f"{fpct(s['median_abs'], False)} ({fpct(s['worst_abs'], False)})")
        return out

    rows = [Row([f"all sizes ({record['overall'][models[0]]['samples']})", *cells(record["overall"])], stamp),
            Row([f"buffers >= 1 MiB ({record['large'][models[0]]['samples']})", *cells(record["large"])], stamp)]
    for size in sorted(record["by_size"][models[0]], key=int):
        label = f"{int(size) >> 20} MiB" if int(size) >= 1 << 20 else f"{int(size) >> 10} KiB"
        rows.append(Row([f"size {label}", *cells({m: record["by_size"][m].get(size) for m in models})], stamp))
    for algorithm in sorted(record["by_algorithm"][models[0]]):
        rows.append(Row([algorithm, *cells({m: record["by_algorithm"][m].get(algorithm) for m in models})], stamp))
    for scenario in sorted(record["by_scenario"][models[0]]):
        rows.append(Row([f"scenario: {scenario}", *cells({m: record["by_scenario"][m].get(scenario) for m in models})],
                        stamp))
    for network, entry in record["networks"].items():
        held = {m: entry["models"][m].get("held_out_error") for m in models}
        large = {m: entry["models"][m].get("held_out_error_large") for m in models}
        rows.append(Row([network, *cells(held)], stamp))
        rows.append(Row([f"{network}, >= 1 MiB", *cells(large)], stamp))
    paper = record["paper"]
    rows.append(Row(["paper (GenModel's own testbeds; GenModel itself: "
                     f"{fpct(paper.get('genmodel'), False)})",
                     *[fpct(paper[m], False) if m in paper else "-" for m in models]], stamp))
    return table("calibration", ["held-out samples: median (worst) error", *models], rows, stamp)


def gpu_check() -> str:
    record = load("bench_cuda_reduce.json")
    stamp = stamp_of(record)
    share = record["target_share_of_copy"]
    rows = [
        Row([dtype, f"{r['copy_GBps']:.0f}", f"{r['kernel_GBps']:.0f}", f"**{fpct(r['kernel_share_of_copy'], False)}**",
             fpct(r["torch_add_share_of_copy"], False), verdict(r["kernel_share_of_copy"] >= share)], stamp)
        for dtype, r in record["results"].items()
    ]
    text = table("gpu-check", ["dtype", "copy GB/s", "kernel GB/s", "share of copy", "torch `add_` share",
                               f"met (>= {fpct(share, False)})"], rows, stamp)
    return f"Device: {record['device']}; {record['buffer_MiB']} MiB buffers, median of {record['repeats']} " \
        f"timings of {record['iters']} launches.\n\n" + text


_FT_SCENARIO = {"no_fault": "no fault", "straggler": "rank 7's backward slowed (delay auto)",
                "degraded": "rank 3's NIC at 1/2"}
_FT_TARGET = {"no_fault": 0.98, "straggler": 1.1, "degraded": 1.2}


def _cell_stamp(stamps: Sequence[Stamp]) -> Stamp:
    """A figure of several runs: stale if any of its runs is (that run's stamp), else its newest run's."""
    return next((s for s in stamps if staleness(s)), None) or max(stamps, key=lambda s: s.date)


def _finetune_controls(entry: dict[str, Any]) -> tuple[str, list[float]]:
    """A cell's control and its runs' values: the A/A control (plain over its second copy, time to
    target) where the runs trained one, else the compute-only ratio of runs made before it."""
    runs = entry["runs"]
    aa = [r["control_speedup_to_target"] for r in runs if r.get("control_speedup_to_target") is not None]
    if aa:
        return "A/A", aa
    return "compute", [r["compute_speedup_steady"] for r in runs if r.get("compute_speedup_steady") is not None]


def _finetune_verdict(scenario: str, entry: dict[str, Any]) -> str:
    """A cell's verdict, with its runs' controls as the spread."""
    _, controls = _finetune_controls(entry)
    noise = max((abs(c - 1.0) for c in controls), default=None)
    return verdict(entry["met"], noise, entry["median_speedup_to_target"], _FT_TARGET.get(scenario))


def _run_stamp(record: dict[str, Any], run: dict[str, Any]) -> Stamp:
    measured = dict(run["measured"])
    if run.get("cpu_model"):
        measured["machine"] = {"cpu_model": run["cpu_model"]}
    return stamp_of(record, measured)


def finetune() -> str:
    record = load("bench_finetune.json")
    rows = []
    for key, e in record["results"].items():
        example, framework, scenario = key.split("/")
        runs = e["runs"]
        kind, controls = _finetune_controls(e)
        median_control = statistics.median(controls) if controls else None
        ratio = e["median_speedup_to_target"]
        switched = sorted({f"{r['algorithm']} at {r['switched_step']}" for r in runs if r.get("switched_step")})
        rows.append(
            Row(
                [
                    f"{example}, {framework}",
                    _FT_SCENARIO.get(scenario, scenario),
                    f">= {_FT_TARGET.get(scenario, 0):g}x",
                    f"**{fx(ratio)}** ({', '.join(fx(r['speedup_to_target']) for r in runs)})",
                    f"{fx(e['median_speedup_steady'])} ({', '.join(fx(r['speedup_steady']) for r in runs)})",
                    f"{fx(median_control)} ({', '.join(fx(c) for c in controls)})"
                    + ("" if kind == "A/A" else ", compute-only"),
                    "; ".join(switched) or "nothing",
                    _finetune_verdict(scenario, e),
                ],
                _cell_stamp([_run_stamp(record, r) for r in runs]),
            )
        )
    return table(
        "finetune",
        ["example, framework", "scenario", "target", "time to target (median; runs)", "steady step",
         "control (A/A: plain / its second copy, time to target)", "switches (run's final plan)", "met"],
        rows,
    )


_FRAMEWORK_PATH = {
    "ddp": "DDP, `ddp_hook`",
    "horovod": "Horovod, `straggler_aware`",
    "megatron": "megatron-core, the flag",
}


def _no_harm_verdict(cell: dict[str, Any], lowest: float) -> str:
    """met or missed only where every launch's A/A control is within 1 % of parity."""
    if cell["control_spread"] > NO_FAULT_CONTROL:
        return f"noise (A/A ±{100 * cell['control_spread']:.1f} %)"
    return verdict(cell["met"], cell["control_spread"], cell["median_speedup_steady"], lowest)


def no_harm() -> str:
    record = load("bench_no_harm.json")
    rows = []
    for cell in record["results"].values():
        launches = cell["launches"]
        warmup = cell["median_warmup"]
        rows.append(
            Row(
                [
                    _FRAMEWORK_PATH.get(cell["framework"], cell["framework"]),
                    cell["model_size"],
                    f"**{fx(cell['median_speedup_steady'])}** ({', '.join(fx(x['speedup_steady']) for x in launches)})",
                    f"{fx(cell['median_control'])} ({', '.join(fx(x['control']) for x in launches)}; "
                    f"±{100 * cell['control_spread']:.1f} %)",
                    f"{fx(warmup)} (control {fx(cell['median_control_warmup'])})",
                    f"{cell['launches_that_switched']} of {len(launches)}",
                    _no_harm_verdict(cell, record["lowest"]),
                    "-" if cell["warmup_met"] is None else ("yes" if cell["warmup_met"] else "**no**"),
                ],
                _cell_stamp([_run_stamp(record, x) for x in launches]),
            )
        )
    return table(
        "no-harm",
        ["framework, path", "gradients", "plain step / stragglerkit step (median; launches)",
         "A/A control (median; launches; spread)", "warm-up steps (median)", "launches that switched",
         f">= {record['lowest']:g}x, no switch", f"warm-up within {100 * record['warmup_within']:g} %"],
        rows,
    )


def finetune_costs() -> str:
    record = load("bench_finetune.json")
    results = record["results"]
    rows = []
    for key, e in results.items():
        example, framework, scenario = key.split("/")
        if scenario == "no_fault":
            continue
        base = results.get(f"{example}/{framework}/no_fault", {})
        stamps = [_run_stamp(record, r) for r in e["runs"]]
        cost = e.get("fault_cost")
        rows.append(Row([f"{example}, {framework}", _FT_SCENARIO.get(scenario, scenario),
                         f"{base.get('median_plain_steady_ms', 0):.0f} ms",
                         f"{e.get('median_plain_steady_ms', 0):.0f} ms",
                         "-" if cost is None else fpct(cost)], _cell_stamp(stamps)))
    return table("finetune-costs", ["example, framework", "fault", "plain step, no fault (median)",
                                    "plain step, fault (median)", "fault cost"], rows)


def test_times() -> str:
    path = RESULTS / "test_times.json"
    if not path.exists():
        return "*No measurement yet: `RECORD_TEST_TIMES=1 bash scripts/test.sh` writes one.*"
    record = load("test_times.json")
    stamp = stamp_of(record)
    rows = [Row([f"`{g['group']}`", str(g["tests"]), f"{g['seconds'] / 60:.1f} min"], stamp)
            for g in record["groups"]]
    outcomes = ", ".join(f"{count} {outcome}" for outcome, count in sorted(record["outcomes"].items()))
    rows.append(Row([f"**all of pytest** ({outcomes})", str(record["tests"]),
                     f"**{record['pytest_seconds'] / 60:.1f} min**"], stamp))
    return table("test-times", ["group: tests/test_&lt;group&gt;[_*].py", "tests", "time"], rows, stamp)


# --- README -----------------------------------------------------------------------------------


def _headline(capability: str, section: str, setting: str, measured: str, target: str, met: str,
              stamps: Iterable[Stamp]) -> str:
    s = _cell_stamp(list(stamps))
    return (f"| [{capability}](docs/results.md#{section}) | {setting} | {measured} | {target} | {met} | "
            f"{_stamp_cell(s)} |")


def readme_results() -> str:
    acc = load("bench_acceptance.json")
    figs = {f["key"]: f for f in acc["figures"]}
    acc_stamp = stamp_of(acc)
    ex = load("bench_executor.json")
    big = next(r for r in ex["rows"] if r["size_bytes"] >= 1 << 20)
    hook = load("bench_hook_overhead.json")
    hook_default = next(r for r in hook["rows"] if r["copy"] == "hook_default")
    lines = [
        "| capability | setting | measured (median) | target | met | commit, CPU, date |",
        "| --- | --- | --- | --- | --- | --- |",
        _headline("Executor", "executor-on-loopback", "ring vs gloo, 4 ranks on loopback, 64 MiB",
                  f"{big['ratio_of_medians']:.2f}x gloo's time", f"<= {ex['targets']['64MiB_ratio_max']:g}x",
                  verdict(big["ratio_of_medians"] <= ex["targets"]["64MiB_ratio_max"],
                          None if big.get("control_ratio_of_medians") is None
                          else abs(big["control_ratio_of_medians"] - 1.0),
                          big["ratio_of_medians"], ex["targets"]["64MiB_ratio_max"]), [stamp_of(ex)]),
    ]
    for key, capability, setting in (
        ("stragglar_from_straggler", "StragglAR", "8 emulated hosts at 1 Gbit/s, 32 MiB, one late rank; "
                                                  "from its arrival"),
        ("optcc_l2_speedup", "OptCC", "8 emulated hosts at 1 Gbit/s, 32 MiB, one NIC at 1/2"),
    ):
        f = figs[key]
        lines.append(_headline(capability, "acceptance-on-the-emulated-cluster", setting,
                               _acceptance_value(f["measured"], f["unit"]), f["target"], verdict(f["met"]),
                               [acc_stamp]))
    near = [figs["balanced_ring_l8_7_over_healthy"], figs["optcc_l8_7_over_healthy"]]
    lines.append(_headline("Balanced ring / OptCC near full rate", "acceptance-on-the-emulated-cluster",
                           "one NIC at 7/8, over fault-free gloo (`auto` runs the balanced ring)",
                           " / ".join(_acceptance_value(f["measured"], f["unit"]) for f in near),
                           " / ".join(f["target"] for f in near), " / ".join(verdict(f["met"]) for f in near),
                           [acc_stamp]))
    lines.append(_headline("Hook cost, nothing wrong", "hook-overhead", "DDP hook with defaults, 8 ranks, 8 MiB model",
                           f"{hook_default['plain_over_copy_median']:.3f}x plain DDP's step", f">= {HOOK_TARGET}x",
                           verdict(hook_default["plain_over_copy_median"] >= HOOK_TARGET, _hook_noise(hook),
                                   hook_default["plain_over_copy_median"], HOOK_TARGET), [stamp_of(hook)]))
    for name, capability, section in (
        ("bench_train.json", "DDP training", "training-with-ddp-on-the-emulated-cluster"),
        ("bench_train_horovod.json", "Horovod training", "training-with-horovod-on-the-emulated-cluster"),
        ("bench_train_megatron.json", "megatron-core training", "training-with-megatron-core-on-the-emulated-cluster"),
    ):
        record = load(name)
        scenarios = record["scenarios"]
        stamps = [_scenario_stamp(record, s) for s in scenarios]
        lines.append(_headline(
            capability, section, " / ".join(s["scenario"].replace("_", " ") for s in scenarios),
            " / ".join(fx(s["speedup_steady"]) for s in scenarios),
            " / ".join(s["target"] for s in scenarios),
            " / ".join(verdict(s["met"]) for s in scenarios), stamps))
    ft = load("bench_finetune.json")
    counts = {"yes": 0, "**no**": 0, "noise": 0}
    ft_stamps = []
    for key, e in ft["results"].items():
        v = _finetune_verdict(key.rsplit("/", 1)[1], e)
        counts["noise" if v.startswith("noise") else v] += 1
        ft_stamps += [_run_stamp(ft, r) for r in e["runs"]]
    lines.append(_headline("Fine-tuning, time to target", "fine-tuning-examples-time-to-a-target-loss",
                           f"BERT and Llama, DDP and Horovod, {len(ft['results'])} cells",
                           f"met in {counts['yes']}, missed in {counts['**no**']}, noise in {counts['noise']}",
                           "no fault >= 0.98x, straggler >= 1.1x, NIC >= 1.2x",
                           "**no**" if counts["**no**"] else "yes", ft_stamps))
    cal = load("calibration.json")
    gig = cal["networks"]["emulated 1 Gbit/s"]["models"]["alpha-beta"]["held_out_error_large"]
    every = cal["large"]["alpha-beta"]["median_abs"]
    lines.append(_headline("Cost model", "cost-model-on-real-runs",
                           "alpha-beta, held-out runs of every algorithm from 1 MiB, emulated 1 Gbit/s",
                           f"{fpct(gig['median_abs'], False)} median error ({fpct(every, False)} over all networks)",
                           "-", "-", [stamp_of(cal)]))
    sc = load("scale.json")
    decisions = {c["case"]: c for c in sc["stages"]["decision"]}
    at = {name: next(r["seconds"] for r in c["rows"] if r["p"] == 1024) for name, c in decisions.items()}
    lines.append(_headline("Scale", "scale", "the loop's decision at p = 1024 (straggler / slow NIC)",
                           f"{fsec(at['straggler'])} / {fsec(at['slow_nic'])}", "<= 1 s",
                           verdict(max(at.values()) <= 1.0),
                           [stamp_of(sc, c.get("measured")) for c in decisions.values()]))
    sel = load("train_selective.json")
    it = sel["ratios"]["iterations_selective_over_partial"]
    lines.append(_headline("Selective reduce", "selective-reduce-on-real-ranks",
                           "8 emulated hosts, NICs at u x 1 Gbit/s; iterations, selective over partial",
                           fx(it["median"], 2), f"> 1 (paper: {it['paper']})", verdict(it["median"] > 1.0),
                           [stamp_of(sel)]))
    return "\n".join(lines)


def readme_cost_model() -> str:
    cal = load("calibration.json")
    gig = cal["networks"]["emulated 1 Gbit/s"]["models"]["alpha-beta"]["held_out_error_large"]
    slow = cal["networks"]["emulated 250 Mbit/s"]["models"]["alpha-beta"]["held_out_error_large"]
    every = cal["large"]["alpha-beta"]
    return (
        f"On held-out runs of every algorithm from 1 MiB on 8 emulated hosts, alpha-beta predicts the time "
        f"to {fpct(gig['median_abs'], False)} (median) at 1 Gbit/s and {fpct(slow['median_abs'], False)} at "
        f"250 Mbit/s; over all four networks {fpct(every['median_abs'], False)} (worst "
        f"{fpct(every['worst_abs'], False)}), and far worse below 1 MiB."
    )


BLOCKS: dict[str, Callable[[], str]] = {
    "test-times": test_times,
    "acceptance": acceptance,
    "train-ddp": train("bench_train.json"),
    "train-horovod": train("bench_train_horovod.json"),
    "train-megatron": train("bench_train_megatron.json"),
    "hook-overhead": hook_overhead,
    "link-estimate": link_estimate,
    "executor": executor,
    "schedules": schedules,
    "scale-simulate": scale(["simulate", "decision"]),
    "scale-schedule": scale(["schedule", "plan"]),
    "selective-sim": selective_sim,
    "selective-train": selective_train,
    "calibration": calibration,
    "finetune": finetune,
    "finetune-costs": finetune_costs,
    "gpu-check": gpu_check,
    "readme-results": readme_results,
    "readme-cost-model": readme_cost_model,
}


# --- the pages --------------------------------------------------------------------------------


def render_page(text: str, blocks: dict[str, Callable[[], str]] = BLOCKS) -> str:
    """``text`` with every generated block's body replaced by its rendering. An unknown block name
    is an error (a typo would otherwise leave a hand-made block unchecked)."""

    def body(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in blocks:
            raise KeyError(f"no renderer for the block {name!r}; known: {', '.join(blocks)}")
        return f"<!-- results:{name} -->\n{blocks[name]().rstrip()}\n<!-- /results:{name} -->"

    return BLOCK.sub(body, text)


def differing_blocks(text: str, rendered: str) -> list[str]:
    """The names of the blocks whose bodies differ between two versions of a page."""
    ours = {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}
    theirs = {m.group("name"): m.group("body") for m in BLOCK.finditer(rendered)}
    return [name for name in ours if ours[name] != theirs.get(name)]


def figures_outside_blocks(text: str) -> list[str]:
    """Figures (x, %, ms, s, us, min) that stand outside the generated blocks, with their line, for
    the part of the page that holds results: all of docs/results.md, README's "Results" section."""
    def blank(match: re.Match[str]) -> str:
        return "\n" * match.group(0).count("\n")

    lines = text.splitlines()
    # generated blocks, then code spans (commands and settings) and link targets, kept line for line
    prose = re.sub(r"`[^`]*`|\]\([^)]*\)", blank, BLOCK.sub(blank, text))
    found = []
    for number, line in enumerate(prose.splitlines(), 1):
        for match in FIGURE.finditer(line):
            found.append(f"line {number}: {match.group(0)!r} in {lines[number - 1].strip()[:100]!r}")
    return found


def readme_results_section(text: str) -> str:
    """The README's results section (from "## Results" to the next "## " heading), with the
    cost-model sentence of "When it helps"."""
    start = text.index("\n## Results")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 if a page differs")
    parser.add_argument("pages", nargs="*", type=Path, default=list(PAGES))
    args = parser.parse_args(argv)
    status = 0
    for page in args.pages:
        text = page.read_text(encoding="utf-8")
        rendered = render_page(text)
        changed = differing_blocks(text, rendered)
        if args.check:
            for name in changed:
                print(f"{page}: block {name!r} differs from what profiling/results renders: "
                      "run python profiling/render_results.py", file=sys.stderr)
            status |= bool(changed)
        elif changed:
            page.write_text(rendered, encoding="utf-8")
            print(f"{page}: rendered {', '.join(changed)}")
    return status


if __name__ == "__main__":
    sys.exit(main())

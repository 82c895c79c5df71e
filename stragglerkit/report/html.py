"""One self-contained HTML page: the verdict, the summary, the figures, the decisions, the problems.

The page opens offline and anywhere: the figures are PNGs embedded as base64 ``data:`` URIs, the
style sheet is inline, and there are no scripts and no external URLs (a decision's full evidence
folds out with the browser's own ``<details>``). Every text that came from an input is escaped.

Sections, top to bottom: the run (what was read, who ran it), the verdict in one sentence (what
was detected and what the loop did about it, or "no straggler or degraded NIC was detected; N
steps"), the summary table (:mod:`.run_data`: time lost to stragglers, time saved per plan
change), the figures (:mod:`.plots`; each absent one as a line saying why), the decisions with
their evidence, the problems met while reading (file and line), the files left out, the inputs.

Example::

    page = render(run, figures(run), problems=[], left_out=[], read=[], title="llama-8B, rank 7 slow")
    Path("report.html").write_text(page)
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import math
from typing import Any

from stragglerkit.report.plots import Figure
from stragglerkit.report.run_data import DETECTIONS, RunData, lost_to_stragglers, plan_label, savings
from stragglerkit.version import __version__

__all__ = ["render", "verdict"]

_CSS = """
body { font: 14px/1.5 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1d2330; margin: 0;
       background: #f4f5f7; }
main { max-width: 1080px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; min-height: 100vh; }
h1 { font-size: 24px; margin: 8px 0 2px; }
h2 { font-size: 17px; margin: 30px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #e1e4e8; }
.sub { color: #5b6472; margin: 0 0 16px; }
.verdict { padding: 12px 16px; border-radius: 6px; margin: 16px 0; font-size: 15px; }
.verdict.ok { background: #eaf6ec; border-left: 4px solid #2e7d32; }
.verdict.found { background: #fff4e5; border-left: 4px solid #e67e00; }
.verdict.none { background: #eef1f5; border-left: 4px solid #6b7785; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; font-size: 13px; }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid #eceef1; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.kv th { width: 28%; background: none; font-weight: 500; color: #5b6472; }
figure { margin: 18px 0 26px; }
figure img { max-width: 100%; border: 1px solid #eceef1; border-radius: 4px; }
figcaption { color: #5b6472; font-size: 13px; margin-top: 4px; }
.omitted { color: #6b7785; font-size: 13px; margin: 4px 0; }
.problems li { color: #8a1f11; }
code, pre { font: 12px/1.4 SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; max-height: 320px; }
details summary { cursor: pointer; color: #3b5b8c; }
.kind { font-weight: 600; white-space: nowrap; }
.kind.detected_straggler, .kind.detected_degraded { color: #b3261e; }
.kind.switch { color: #2e7d32; }
.kind.would_switch { color: #7a8f2e; }
.kind.rollback { color: #6a3ea1; }
.kind.verified { color: #1f5fa8; }
footer { color: #8a929e; font-size: 12px; margin-top: 36px; }
"""

_EVIDENCE_KEYS = {
    "detected_straggler": ("ranks", "fraction", "median_delay_s", "critical_delay_s", "window", "moved_from"),
    "detected_degraded": ("ranks", "l_median"),
    "switch": ("to", "predicted_before_s", "predicted_after_s", "measure", "measured_before_s"),
    "verified": ("measure", "measured_before_s", "measured_after_s", "predicted_after_s"),
    "rollback": ("rejected", "measure", "measured_before_s", "measured_after_s", "blocked_until_step"),
    "cleared": ("cleared", "rank", "ranks"),
    "would_switch": ("to", "predicted_running_s", "predicted_after_s", "predicted_gain"),
    "observing": ("act", "backend", "reason"),
}


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _ms(seconds: float | None, digits: int = 2) -> str:
    """Milliseconds, or a dash for unknown (None; NaN, as the log writes an unknown evidence field)."""
    return "–" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:.{digits}f} ms"


def _seconds(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds:.3f} s" if abs(seconds) >= 1 else f"{seconds * 1e3:.1f} ms"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        if "buckets" in value and "default" in value:  # a plan
            buckets = value.get("buckets") or [value.get("default")]
            who = []
            if value.get("straggler") is not None:
                who.append(f"straggler {value['straggler']}")
            if value.get("slowdowns"):
                who.append("slow " + ", ".join(f"{r} (l={v})" for r, v in value["slowdowns"].items()))
            return "/".join(map(str, dict.fromkeys(buckets))) + (f" ({'; '.join(who)})" if who else "")
        return ", ".join(f"{k}: {_short(v)}" for k, v in list(value.items())[:6])
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(map(str, value[:8])) + ", …]"
    return str(value)


def _evidence_summary(decision: dict[str, Any]) -> str:
    evidence = decision.get("evidence") or {}
    keys = _EVIDENCE_KEYS.get(decision["kind"])
    if keys is None:
        keys = tuple(k for k, v in evidence.items() if not isinstance(v, dict | list))[:4]
    parts = []
    ranks = evidence.get("ranks")
    if isinstance(ranks, dict) and decision["kind"] in DETECTIONS:
        if decision["kind"] == "detected_straggler":
            parts += [f"rank {r} late by {_ms(v)}" for r, v in ranks.items() if isinstance(v, int | float)]
        else:
            parts += [f"rank {r} at l = {v:.3g}" for r, v in ranks.items() if isinstance(v, int | float)]
        keys = tuple(k for k in keys if k != "ranks")
    for key in keys:
        if key in evidence and evidence[key] is not None:
            value = evidence[key]
            text = _short(value) if not key.endswith("_s") or not isinstance(value, int | float) else _ms(value)
            parts.append(f"{key.removesuffix('_s')}: {text}")
    return "; ".join(parts)


def verdict(run: RunData) -> tuple[str, str]:
    """(CSS class, one sentence) saying what the run shows."""
    steps = len(run.steps)
    if run.kind == "bench (allreduce)":
        cases = len(run.comparisons)
        return "none", f"AllReduce benchmark: {cases} case{'s' * (cases != 1)}, {steps} measured AllReduces."
    detections = run.detections()
    if not detections:
        counted = f"{steps} steps" if steps else "no per-step records"
        return "ok", f"No straggler or degraded NIC was detected; {counted}."
    parts = []
    for d in detections:
        ranks = ", ".join(sorted((d.get("evidence") or {}).get("ranks", {}) or {})) or "?"
        what = "persistent straggler" if d["kind"] == "detected_straggler" else "degraded NIC"
        parts.append(f"{what} on rank {ranks} at step {d['step']}")
    verbs = {
        "switch": "switched to {}",
        "rollback": "rolled back to {}",
        "verified": "verified {}",
        "cleared": "cleared",
        "would_switch": "would have switched to {} (observing only)",
    }
    actions = [
        verbs[d["kind"]].format(_would_run(run, d) if d["kind"] == "would_switch" else plan_label(run, d))
        + f" at step {d['step']}"
        for d in run.decisions
        if d["kind"] in verbs
    ]
    sentence = "Detected a " + "; a ".join(parts) + "."
    if actions:
        sentence += " The loop " + ", ".join(actions) + "."
    else:
        sentence += " No plan change followed."
    return "found", sentence


def _would_run(run: RunData, decision: dict[str, Any]) -> str:
    """The plan a ``would_switch`` names (what ran stays the baseline: :func:`plan_label` says that)."""
    if isinstance((decision.get("evidence") or {}).get("to"), dict):
        return plan_label(run, {**decision, "kind": "switch"})  # its "to" is what a switch's would be
    return "another plan"


def _kv(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>'


def _run_table(run: RunData, offsets_note: list[str]) -> str:
    rows: list[tuple[str, str]] = [("read from", _e(run.kind))]
    if run.run_id:
        rows.append(("run id", f"<code>{_e(run.run_id)}</code>"))
    if run.world_size is not None:
        seen = run.ranks_seen
        have = f"{len(seen)} of {run.world_size}" if seen and len(seen) != run.world_size else "all"
        per_rank = not run.kind.startswith("bench")
        rows.append(("ranks", f"{run.world_size}" + (f" (files for {_e(have)})" if per_rank else "")))
    if run.framework:
        rows.append(("framework", _e(run.framework)))
    if run.hosts:
        rows.append(("hosts", _e(_short(run.hosts))))
    if run.started:
        when = datetime.datetime.fromtimestamp(run.started, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        rows.append(("started", when))
    if run.version:
        rows.append(("stragglerkit", _e(run.version)))
    if run.steps:
        rows.append(("steps", f"{len(run.steps)} ({run.steps[0].step}–{run.steps[-1].step})"))
    rows += [("note", _e(note)) for note in offsets_note]
    return _kv(rows)


def _summary_table(run: RunData) -> str:
    rows: list[tuple[str, str]] = []
    lost = lost_to_stragglers(run)
    if lost is not None:
        known = [r.step_time_s for r in run.steps if r.step_time_s is not None]
        share = f" ({lost / sum(known) * 100:.1f} % of the steps' time)" if known and sum(known) > 0 else ""
        what = "the last rank's lateness, summed over steps"
        rows.append(("time lost to stragglers", f"{_seconds(lost)}{share}: {what}"))
    else:
        rows.append(("time lost to stragglers", "unknown: no per-rank arrival times"))
    if run.bench_saving:
        s = run.bench_saving
        speedup = s.get("speedup")
        rows.append(
            (
                "time saved (bench, steady state)",
                f"plain {s['plain_ms']:.1f} ms against hooked {s['hooked_ms']:.1f} ms per step"
                + (f" ({speedup:.3f}x)" if speedup else "")
                + f"; {'saved' if s['saved_s'] >= 0 else 'cost'} {_seconds(abs(s['saved_s']))} over steps "
                f"{s['steps'][0]}–{s['steps'][1]} ({_e(s['why'])})",
            )
        )
    for saving in savings(run):
        step_text = ""
        if saving.step_before_s is not None and saving.step_after_s is not None:
            step_text = f"; step {_ms(saving.step_before_s)} → {_ms(saving.step_after_s)}"
        ranges = ""
        if saving.before_steps and saving.after_steps:
            ranges = (
                f" (steps {saving.before_steps[0]}–{saving.before_steps[1]} against "
                f"{saving.after_steps[0]}–{saving.after_steps[1]})"
            )
        saved = ""
        if saving.saved_s is not None:
            verb = "saved" if saving.saved_s >= 0 else "cost"
            saved = f"; {verb} {_seconds(abs(saving.saved_s))}"
        allreduce = ""
        if saving.allreduce_before_s is not None or saving.allreduce_after_s is not None:
            allreduce = f"; AllReduce {_ms(saving.allreduce_before_s)} → {_ms(saving.allreduce_after_s)}"
        text = f"{allreduce}{step_text}{saved}".removeprefix("; ")
        rows.append((f"{saving.kind} to {saving.algorithm} at step {saving.step}", (text or "no times") + ranges))
    for rank, (count, total) in sorted(run.kernels.items()):
        rows.append((f"rank {rank}: collective kernels", f"{count} kernels, {_seconds(total)} on the GPU"))
    return _kv(rows)


def _comparison_table(run: RunData) -> str:
    if not run.comparisons:
        return ""
    body = "".join(
        f"<tr><td>{_e(c.label)}</td><td>{_e(c.algorithm)}</td><td class='num'>{_ms(c.measured_s, 3)}</td>"
        f"<td class='num'>{_ms(c.predicted_s, 3)}</td>"
        f"<td class='num'>{'–' if c.speedup is None else f'{c.speedup:.2f}x'}</td></tr>"
        for c in run.comparisons
    )
    return (
        "<h2>Bench cases</h2><table><tr><th>case</th><th>algorithm</th><th>measured</th><th>predicted</th>"
        f"<th>vs gloo</th></tr>{body}</table>"
    )


def _figures(figures: list[Figure]) -> str:
    out = []
    omitted = []
    for figure in figures:
        if figure.png is None:
            omitted.append(f'<p class="omitted">{_e(figure.title)}: omitted — {_e(figure.reason)}.</p>')
            continue
        data = base64.b64encode(figure.png).decode("ascii")
        out.append(
            f'<figure id="{_e(figure.name)}"><img alt="{_e(figure.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(figure.caption)}</figcaption></figure>"
        )
    return "".join(out) + "".join(omitted)


def _decisions(run: RunData) -> str:
    shown = [d for d in run.decisions if d["kind"] not in ("exchange", "probing")]
    routine = len(run.decisions) - len(shown)
    if not run.decisions:
        if run.kind == "bench (allreduce)":
            return "<p>None: the AllReduce bench runs each algorithm as asked.</p>"
        return "<p>No decisions were recorded.</p>"
    rows = []
    for d in shown:
        evidence = d.get("evidence") or {}
        full = _e(json.dumps(evidence, indent=1, sort_keys=True, default=str))
        detail = f"<details><summary>{_e(_evidence_summary(d)) or 'evidence'}</summary><pre>{full}</pre></details>"
        rows.append(
            f"<tr><td class='num'>{_e(d['step'])}</td><td class='kind {_e(d['kind'])}'>{_e(d['kind'])}</td>"
            f"<td>{_e(plan_label(run, d))}</td><td>{detail}</td></tr>"
        )
    note = f"<p class='omitted'>{routine} routine events (probing, exchange) not listed.</p>" if routine else ""
    table = ""
    if rows:
        table = (
            "<table><tr><th>step</th><th>decision</th><th>plan</th><th>evidence</th></tr>" + "".join(rows) + "</table>"
        )
    return table + note


def _list(title: str, items: list[str], css: str = "") -> str:
    if not items:
        return ""
    body = "".join(f"<li>{_e(item)}</li>" for item in items)
    return f'<h2>{_e(title)}</h2><ul class="{css}">{body}</ul>'


def render(
    run: RunData,
    figures: list[Figure],
    *,
    problems: list[str],
    left_out: list[str],
    read: list[str],
    title: str | None = None,
) -> str:
    """The whole page as a string (see the module docstring)."""
    css_class, sentence = verdict(run)
    heading = title or "stragglerkit report"
    subtitle = f"{run.kind}" + (f", {run.world_size} ranks" if run.world_size else "")
    if any(d["kind"] in DETECTIONS for d in run.decisions) or run.comparisons or run.steps:
        subtitle += f", {len(run.steps)} {'AllReduces' if run.kind == 'bench (allreduce)' else 'steps'}"
    generated = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(heading)}</title><style>{_CSS}</style></head><body><main>",
        f"<h1>{_e(heading)}</h1><p class='sub'>{_e(subtitle)}</p>",
        f'<div class="verdict {css_class}">{_e(sentence)}</div>',
        "<h2>Summary</h2>",
        _summary_table(run),
        _comparison_table(run),
        "<h2>Figures</h2>",
        _figures(figures),
        "<h2>Decisions</h2>",
        _decisions(run),
        _list("Problems", problems, "problems"),
        _list("Left out", left_out),
        "<h2>Run</h2>",
        _run_table(run, run.notes),
        _list("Inputs", read),
        f"<footer>Written by stragglerkit {_e(__version__)} report on {generated}. "
        "Figures are also saved as PNG files next to this page.</footer>",
        "</main></body></html>",
    ]
    return "\n".join(p for p in parts if p)

"""Print the acceptance and training tables of docs/results.md from the summaries.

After ``bench_acceptance.sh`` or one of the ``bench_train*.sh`` scripts has overwritten its
summary, paste this script's output over the matching table in docs/results.md (and the
figure in the README's table).

Example::

    python profiling/_results_tables.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _text(value: float, unit: str) -> str:
    return f"{value:.3f}x" if unit == "x" else f"{value * 100:+.1f} %"


def _stamp(record: dict[str, Any], commit: str | None = None) -> str:
    commit = commit or (record.get("source") or {}).get("commit") or "?"
    return f"commit `{commit[:7]}`, {record['date'][:16].replace('T', ' ')} UTC"


def acceptance(record: dict[str, Any]) -> str:
    lines = [
        f"Measured: {_stamp(record)}; `{record['command']}`",
        "",
        "| figure | target | measured (median) | runs | model | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for f in record["figures"]:
        runs = ", ".join(_text(v, f["unit"]) for v in f["runs"])
        lines.append(
            f"| {f['figure']} | {f['target']} | **{_text(f['measured'], f['unit'])}** | {runs} | "
            f"{_text(f['model'], f['unit'])} | {'yes' if f['met'] else 'no'} |"
        )
    rates = record.get("at_link_rates")
    if rates:
        lines += [
            "",
            f"At l = 8/7 by link rate ({_stamp(rates, rates['commit'])}):",
            "",
            "| link rate | balanced ring (model) | OptCC (model) |",
            "| --- | --- | --- |",
        ]
        for rate, entries in rates["rates"].items():
            ring, optcc = entries["balanced_ring_l8_7_over_healthy"], entries["optcc_l8_7_over_healthy"]
            lines.append(
                f"| {rate} | {_text(ring['measured'], '')} ({_text(ring['model'], '')}) | "
                f"{_text(optcc['measured'], '')} ({_text(optcc['model'], '')}) |"
            )
    return "\n".join(lines)


def train(record: dict[str, Any]) -> str:
    plain = {
        "ddp": "plain DDP step / hooked step",
        "horovod": "plain Horovod step / straggler_aware step",
        "megatron": "plain megatron-core step / flag-on step",
    }
    lines = [
        f"| scenario | target | {plain.get(record.get('framework', 'ddp'), 'plain step / stragglerkit step')} "
        "(median) | runs | detected at step | switched at step | switched to | met | commit, date |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in record["scenarios"]:
        runs = ", ".join(f"{v:.3f}x" for v in s["runs"])
        detected = ", ".join("-" if d is None else str(d) for d in s["detected_step"])
        switched_at = ", ".join("-" if d is None else str(d) for d in s.get("switched_step", []))
        switched = ", ".join(sorted({str(a or "-") for a in s["switched_to"]}))
        commit = (s.get("commit") or "?")[:7]
        met = "yes" if s["met"] else "**no**"
        lines.append(
            f"| {s['description']} | {s['target']} | **{s['speedup_steady']:.3f}x** | {runs} | {detected} | "
            f"{switched_at or '?'} | {switched} | {met} | `{commit}`, {s['dates'][0][:10]} |"
        )
    return "\n".join(lines)


def main() -> int:
    for name, render in (
        ("bench_acceptance.json", acceptance),
        ("bench_train.json", train),
        ("bench_train_horovod.json", train),
        ("bench_train_megatron.json", train),
    ):
        if not (RESULTS / name).exists():
            continue
        record = json.loads((RESULTS / name).read_text(encoding="utf-8"))
        print(f"<!-- {name} -->\n{render(record)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

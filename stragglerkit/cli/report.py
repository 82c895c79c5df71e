"""``stragglerkit report``: one HTML page (and PNG figures) about one run, from whatever it left behind.

Reads event logs, bench JSON, torch.profiler traces and Nsight Systems SQLite exports, files or
folders in any mix (:mod:`stragglerkit.report.inputs`), draws the figures
(:mod:`stragglerkit.report.plots`) and writes the page (:mod:`stragglerkit.report.html`), the
figures as PNG files next to it (or in ``--png-dir``). Problems met on the way (a truncated line,
a missing rank, files of another run) are printed on stderr and listed in the page. Exit status:
0 when a report was written, 2 when nothing could be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stragglerkit.cli.options import command_parser

__all__ = ["add_parser", "cmd_report"]


def cmd_report(args: argparse.Namespace) -> int:
    from stragglerkit.report.html import render
    from stragglerkit.report.inputs import load
    from stragglerkit.report.plots import figures

    loaded = load(list(args.inputs))
    for line in loaded.read:
        print(f"read {line}")
    for problem in loaded.problems:
        print(f"stragglerkit report: problem: {problem}", file=sys.stderr)
    for line in loaded.left_out:
        print(f"stragglerkit report: left out: {line}", file=sys.stderr)
    run = loaded.run
    if run is None:
        print("stragglerkit report: error: nothing could be read; no report written", file=sys.stderr)
        return 2
    drawn = figures(run)
    if not run.steps and not run.decisions and not run.comparisons and not any(f.png for f in drawn):
        print(
            "stragglerkit report: error: the inputs hold no steps, decisions or measurements; no report written",
            file=sys.stderr,
        )
        return 2
    ranks = f"ranks {', '.join(map(str, run.ranks_seen))}" if run.ranks_seen else "no rank files"
    size = f" of {run.world_size}" if run.world_size else ""
    print(f"run: {run.kind}{size}; {ranks}; {len(run.steps)} steps; {len(run.decisions)} decisions")
    output = Path(args.output)
    png_dir = Path(args.png_dir) if args.png_dir else output.parent
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        png_dir.mkdir(parents=True, exist_ok=True)
        page = render(
            run, drawn, problems=loaded.problems, left_out=loaded.left_out, read=loaded.read, title=args.title
        )
        output.write_text(page, encoding="utf-8")
        for figure in drawn:
            if figure.png is not None:
                (png_dir / f"{figure.name}.png").write_bytes(figure.png)
    except OSError as err:
        print(f"stragglerkit report: error: cannot write {err.filename}: {err.strerror}", file=sys.stderr)
        return 2
    for figure in drawn:
        if figure.png is None:
            print(f"figure {figure.name}: omitted ({figure.reason})")
        else:
            print(f"wrote {png_dir / (figure.name + '.png')}")
    print(f"wrote {output}")
    return 0


HELP = {
    "help": "write an HTML report (and PNG figures) about one run",
    "description": "Read a run's event logs (STRAGGLERKIT_EVENT_LOG), bench JSON (stragglerkit bench --json), "
    "torch.profiler chrome traces and Nsight Systems SQLite exports -- files or folders, in any mix -- and "
    "write one self-contained HTML page with the figures: arrival delay per rank, the last rank per step, "
    "AllReduce time per step with the loop's decisions, NIC rates, predicted against measured time.",
    "epilog": "examples:\n"
    "  stragglerkit report run/ -o report.html\n"
    "  stragglerkit report run/events.rank0.jsonl run/trace.rank*.json --title 'rank 7 late'\n"
    "  stragglerkit report bench.json -o out/bench.html --png-dir out/figures\n"
    "docs/report.md says what each figure shows and how ranks' clocks are aligned.",
}
"""The command's help, description and examples."""


def add_parser(sub: Any) -> None:
    """Add ``report`` to the subcommands ``sub``."""
    report = command_parser(sub, "report", **HELP)
    report.add_argument("inputs", nargs="+", metavar="INPUT", help="files or folders (folders are scanned)")
    report.add_argument("-o", "--output", default="report.html", help="the HTML file (default report.html)")
    report.add_argument("--png-dir", metavar="DIR", help="where the PNG figures go (default: next to the HTML)")
    report.add_argument("--title", help="the page's title (default: stragglerkit report)")
    report.set_defaults(func=cmd_report)

"""The ``stragglerkit`` command line.

``stragglerkit schedule``  builds, checks and prints (or saves) one algorithm's schedule.
``stragglerkit simulate``  predicts AllReduce times of several algorithms on a simulated network.
``stragglerkit bench``     measures them on real ranks: emulated cluster, loopback, or torchrun.
``stragglerkit report``    writes an HTML page with figures about one run from its logs and traces.

One module per command (:mod:`.schedule`, :mod:`.simulate`, :mod:`.bench`, :mod:`.report`), each with its
``add_parser`` and ``cmd_*``; :mod:`.options` holds the value parsers they share. Run
``stragglerkit COMMAND --help`` for the options of each.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from stragglerkit.cli import bench, report, schedule, simulate
from stragglerkit.errors import NotApplicableError, ScheduleError
from stragglerkit.units import parse_time

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    parser = argparse.ArgumentParser(
        prog="stragglerkit",
        description="Straggler-aware AllReduce: build and check schedules, simulate them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    schedule.add_parser(sub)
    simulate.add_parser(sub)
    bench.add_parser(sub)
    report.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    if args.command == "simulate" and args.delay not in (None, "auto"):
        try:
            parse_time(args.delay)
        except ValueError as err:
            parser.error(f"--delay: {err}")
    try:
        code: int = args.func(args, arguments[1:]) if args.command == "bench" else args.func(args)
    except (NotApplicableError, ScheduleError, ValueError) as err:
        print(f"stragglerkit {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``| head``): stop quietly, as other tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the exit's flush goes nowhere instead of raising again
        return 0
    return code

"""Argument parsing shared by the ``stragglerkit`` commands: value parsers and the situation options."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from stragglerkit.bench.config import argument_type
from stragglerkit.errors import NotApplicableError
from stragglerkit.planner.policy import optcc_situation
from stragglerkit.schedules.registry import Situation, names

__all__ = [
    "add_situation_options",
    "algorithm_list",
    "command_parser",
    "degrade",
    "int_list",
    "situation_from_args",
    "unit",
]


def degrade(text: str) -> tuple[int, float]:
    try:
        rank_text, slow_text = text.split(":")
        rank, slowdown = int(rank_text), float(slow_text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--degrade takes RANK:L (e.g. 3:2.0 = rank 3's NIC runs at half bandwidth), got {text!r}"
        ) from None
    if slowdown < 1.0:
        raise argparse.ArgumentTypeError(f"--degrade slowdown L must be >= 1 (1/L of the bandwidth), got {slowdown}")
    return rank, slowdown


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 8,16,256; got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def algorithm_list(text: str) -> list[str]:
    chosen = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in chosen if a not in names()]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown algorithm(s) {unknown}; choose from {', '.join(names())}")
    return chosen


unit = argument_type
"""A value parser as an argparse ``type`` (its ``ValueError`` becomes a usage error)."""


def situation_from_args(args: argparse.Namespace, world_size: int, nbytes: int) -> Situation:
    """The situation the options describe, with OptCC's plan as the runtime would run it on a
    bucket of ``nbytes`` (the same segments, fills and chunk sizes; ``--segments`` fixes k)."""
    slowdowns = dict(args.degrade or [])
    bad = [rank for rank in slowdowns if not 0 <= rank < world_size]
    if bad:
        raise NotApplicableError(f"--degrade names rank {bad[0]}, which is not a rank of 0..{world_size - 1}")
    if args.straggler is not None and not 0 <= args.straggler < world_size:
        raise NotApplicableError(f"--straggler {args.straggler} is not a rank of 0..{world_size - 1}")
    situation = Situation(
        world_size=world_size,
        straggler=args.straggler,
        slowdowns=slowdowns,
        gpus_per_server=args.gpus_per_server,
    )
    if not any(slow > 1.0 for slow in slowdowns.values()) or world_size < 3:
        return situation if args.segments is None else replace(situation, segments=args.segments)
    return optcc_situation(situation, nbytes, segments=args.segments)


def add_situation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--straggler",
        type=int,
        metavar="RANK",
        help="rank of the persistent straggler (StragglAR/direct put it at logical rank n-1; default n-1)",
    )
    parser.add_argument(
        "--degrade",
        type=degrade,
        action="append",
        metavar="RANK:L",
        help="a degraded rank whose NIC runs at 1/L of the bandwidth (repeatable), e.g. --degrade 3:2.0",
    )
    parser.add_argument(
        "--segments",
        type=int,
        help="OptCC pipeline segments k (default: what stragglerkit.all_reduce runs for the bucket size)",
    )
    parser.add_argument(
        "--gpus-per-server",
        type=int,
        default=1,
        help="GPUs per server (default 1): ranks v*g..v*g+g-1 share a server, talk over NVLink, and a degraded "
        "rank degrades its whole server (PXN); OptCC plans on the servers",
    )


def command_parser(sub: Any, name: str, **options: Any) -> argparse.ArgumentParser:
    """Add the command ``name`` to the subcommands ``sub``, its epilog printed as written."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, formatter_class=argparse.RawDescriptionHelpFormatter, **options
    )
    return parser

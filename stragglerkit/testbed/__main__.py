"""``python -m stragglerkit.testbed check|cleanup``: check the emulated cluster's shaping, remove leftovers.

check
    Builds an emulated cluster, measures every host's send and receive rate, prints the figures
    (``--json`` for one JSON object), tears the cluster down; exit status 1 if a link is off by
    more than the tolerance, 2 if the cluster cannot be built here.
cleanup
    Deletes namespaces left by runs that were killed outright (``--all``: also those of running
    processes using the prefix).
"""

from __future__ import annotations

import argparse
import json
import sys

from stragglerkit.testbed.inject import NicDegradation
from stragglerkit.testbed.iproute import DEFAULT_PREFIX, TestbedError, remove_leftovers
from stragglerkit.testbed.netns import EmulatedCluster
from stragglerkit.testbed.shaping import ShapingError
from stragglerkit.units import parse_bandwidth

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stragglerkit.testbed", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="build a cluster, measure every shaped link, tear it down")
    check.add_argument("--hosts", type=int, default=4)
    check.add_argument("--bandwidth", type=parse_bandwidth, default=parse_bandwidth("1Gbit"), help="e.g. 1Gbit")
    check.add_argument("--degrade", type=NicDegradation.parse, default=NicDegradation({}), help="HOST:L,...")
    check.add_argument("--tolerance", type=float, default=0.15)
    check.add_argument("--prefix", default=DEFAULT_PREFIX)
    check.add_argument("--json", action="store_true", help="print the report as one JSON object")
    cleanup = sub.add_parser("cleanup", help="delete namespaces left behind by killed runs")
    cleanup.add_argument("--prefix", default=DEFAULT_PREFIX)
    cleanup.add_argument("--all", action="store_true", help="also namespaces of running processes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ok, reason = EmulatedCluster.available()
    if not ok:
        print(f"emulated cluster unavailable: {reason}", file=sys.stderr)
        return 2
    if args.command == "cleanup":
        removed = remove_leftovers(args.prefix, include_live=args.all)
        print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
        return 0
    config = EmulatedCluster.Config(
        hosts=args.hosts,
        bandwidth=args.bandwidth,
        slowdowns=args.degrade.slowdowns,
        tolerance=args.tolerance,
        prefix=args.prefix,
        verify=False,
    )
    try:
        with EmulatedCluster(config) as cluster:
            report = cluster.measure()
    except (TestbedError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict()) if args.json else report.describe())
    if not report.ok:
        print(str(ShapingError("shaping is off by more than the tolerance", report)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The test suite's time per group of test files, from pytest's JUnit XML.

``RECORD_TEST_TIMES=1 bash scripts/test.sh`` runs pytest with ``--junitxml`` and then this script,
which overwrites ``profiling/results/test_times.json``: pytest's wall time, the number of tests,
and per group of test files (``tests/test_<group>.py`` and ``tests/test_<group>_*.py``) their tests and
summed time, slowest first. docs/results.md renders it ("Test suite").

Example::

    python profiling/_test_times.py /tmp/junit.xml --wall-seconds 1745 --command "bash scripts/test.sh"
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary


def group_of(classname: str) -> str:
    """``tests.test_sim_fast.TestX`` -> ``sim``: the first word after ``test_`` of the test file's
    name names its group (tests/test_sim.py and tests/test_sim_*.py)."""
    module = next((part for part in classname.split(".") if part.startswith("test_")), classname)
    words = module.split("_")
    return words[1] if len(words) > 1 else module


def summarise(junit: Path) -> dict[str, Any]:
    root = ET.parse(junit).getroot()
    seconds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    outcomes: dict[str, int] = defaultdict(int)
    for case in root.iter("testcase"):
        group = group_of(case.get("classname", ""))
        seconds[group] += float(case.get("time", 0.0))
        counts[group] += 1
        kinds = {child.tag for child in case}
        outcome = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcomes[outcome] += 1
    groups = [
        {"group": g, "tests": counts[g], "seconds": round(seconds[g], 1)}
        for g in sorted(seconds, key=lambda g: -seconds[g])
    ]
    return {"tests": sum(counts.values()), "outcomes": dict(outcomes), "groups": groups}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="pytest's --junitxml file")
    parser.add_argument("--wall-seconds", type=float, required=True, help="pytest's wall time")
    parser.add_argument("--command", default="RECORD_TEST_TIMES=1 bash scripts/test.sh")
    parser.add_argument("--out", default=str(RESULTS / "test_times.json"))
    args = parser.parse_args()
    summary = summarise(args.junit)
    summary["pytest_seconds"] = round(args.wall_seconds, 1)
    write_summary(args.out, "test_times", summary, command=args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Growth with the world size: time and memory of every stage against p, from 8 to 4,096 ranks.

Each *stage* (a row of :data:`STAGES`) is one thing a user or the runtime does at world size p,
for each of its cases (usually one per algorithm):

* ``schedule``: ``stragglerkit schedule ALG --world-size P --summary-json`` as the command line
  runs it (generation plus the correctness proof the command reports); target at p = 1,024: 10 s.
* ``plan``: one rank's executor plan for a 32 MiB float32 bucket, as ``Runtime`` builds it
  (target at p = 1,024: 0.5 s and 100 MB).
* ``simulate``: ``stragglerkit simulate --algorithms ALG --world-sizes P --size 1GiB --alpha 3us
  --bandwidth 25GB/s --json -`` (a straggler at the auto delay; ``--degrade 3:2.0 --segments 64``
  for the NIC algorithms); target at p = 1,024: 10 s.
* ``decision``: what the closed loop computes to choose a 32 MiB bucket's plan (the controller's
  ``OnlineModel`` and ``planner.policy``): ``straggler``: StragglAR's critical delay and the
  predictions of ring and StragglAR; ``slow_nic``: ``choose_algorithm("auto")`` (OptCC or the
  balanced ring, OptCC's segments and fills) and the predictions of ring, the balanced ring and
  OptCC with rank 3 at l = 2; target at p = 1,024: 1 s.

Every measurement runs in a fresh subprocess (``--child``), so the peak resident memory is that of
the stage alone: the child records its RSS before the stage and the peak after it
(``resource.getrusage``); ``rss_mb`` is the peak, ``stage_mb`` the growth the stage caused.
``seconds`` is the wall time of the stage inside the child (the median of ``--repeats`` fresh
children). A case stops growing p once it exceeds ``--timeout`` seconds. Per case the summary
holds a least-squares slope of log(seconds) against log(p) over the sizes from 64 on (the small
sizes measure constants).

To add a stage, add a function ``(p, case) -> object`` and a :class:`Stage` row to :data:`STAGES`.

Overwrites ``profiling/results/scale.json`` (``--out``).

Example::

    python profiling/bench_scale.py
    python profiling/bench_scale.py --stages schedule --cases ring,optcc --max-p 1024 --out /tmp/scale.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, ROOT, write_summary

sys.path.insert(0, str(ROOT))

SIZES = (8, 16, 32, 64, 128, 256, 512, 1000, 1024, 2048, 4096)
SLOPE_FROM = 64
BUCKET_BYTES = 32 << 20


def _situation_args(p: int, case: str) -> list[str]:
    """Command-line arguments of ``case`` at world size ``p``: a degraded rank for the NIC algorithms."""
    if case in ("optcc", "balanced_ring"):
        return ["--degrade", "3:2.0", *(["--segments", "64"] if case == "optcc" else [])]
    return []


def schedule_stage(p: int, case: str) -> object:
    """``stragglerkit schedule CASE --world-size P --summary-json`` (stdout captured)."""
    from stragglerkit.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["schedule", case, "--world-size", str(p), "--summary-json", *_situation_args(p, case)])
    if code != 0:
        raise RuntimeError(f"schedule {case} at p={p} exited {code}")
    return json.loads(out.getvalue())


def plan_stage(p: int, case: str) -> object:
    """One rank's executor plan (rank 1) for a 32 MiB float32 sum, as the runtime builds it."""
    from stragglerkit.planner.lowering import rank_plan
    from stragglerkit.planner.policy import optcc_situation
    from stragglerkit.schedules.registry import Situation

    slowdowns = {3: 2.0} if case in ("optcc", "balanced_ring") else {}
    straggler = p - 1 if case in ("stragglar", "direct") else None
    situation = Situation(world_size=p, straggler=straggler, slowdowns=slowdowns)
    if case == "optcc":
        situation = optcc_situation(situation, BUCKET_BYTES)
    plan = rank_plan(case, situation, BUCKET_BYTES // 4, 4, rank=1)
    return {"ops": int(plan.ops.shape[0])}


def simulate_stage(p: int, case: str) -> object:
    """``stragglerkit simulate --algorithms CASE --world-sizes P ... --json -`` (stdout captured)."""
    from stragglerkit.cli import main

    out = io.StringIO()
    common = ["--size", "1GiB", "--alpha", "3us", "--bandwidth", "25GB/s", "--json", "-"]
    with contextlib.redirect_stdout(out):
        code = main(["simulate", "--algorithms", case, "--world-sizes", str(p), *common, *_situation_args(p, case)])
    if code != 0:
        raise RuntimeError(f"simulate {case} at p={p} exited {code}")
    rows = json.loads(out.getvalue())
    return {"time_s": rows[0]["time_s"]} if rows else {}


def decision_stage(p: int, case: str) -> object:
    """The loop's choice for a 32 MiB bucket: the model's predictions and the policy (module docstring)."""
    from stragglerkit.detect.model import OnlineModel
    from stragglerkit.planner.policy import choose_algorithm
    from stragglerkit.schedules.registry import Situation
    from stragglerkit.sim.cost_model import CostModel

    model = OnlineModel(p, CostModel.Config(alpha=20e-6, beta=1 / 25e9))
    if case == "straggler":
        critical = model.critical_delay(p - 1, BUCKET_BYTES, "ring", 0.05)
        kwargs: dict[str, Any] = {"straggler": p - 1, "delay": 5e-3}
        ring, fast = model.predict("ring", BUCKET_BYTES, **kwargs), model.predict("stragglar", BUCKET_BYTES, **kwargs)
        return {"critical_delay_s": critical, "ring_s": ring, "stragglar_s": fast}
    slowdowns = {3: 2.0}
    chosen, _ = choose_algorithm("auto", Situation(world_size=p, slowdowns=slowdowns), BUCKET_BYTES // 4)
    times = {f"{a}_s": model.predict(a, BUCKET_BYTES, slowdowns=slowdowns) for a in ("ring", "balanced_ring", "optcc")}
    return {"auto": chosen, **times}


@dataclass(slots=True, frozen=True)
class Stage:
    """One row of the growth table."""

    run: Callable[[int, str], object]
    """What is measured: ``run(p, case)``."""
    cases: tuple[str, ...]
    """The cases (usually algorithms) measured separately."""
    applies: Callable[[int, str], bool] = lambda p, case: True
    """Whether ``case`` exists at world size ``p`` (StragglAR needs an even p)."""


def _matching_by_formula(p: int, case: str) -> bool:
    """StragglAR at even p, from 128 on only at powers of two: elsewhere its matching plan is the
    generator's maximum-weight matching (appendix C), minutes at p = 1,000 (docs/results.md), which
    every stage would measure instead of itself."""
    return case not in ("stragglar", "straggler") or (p % 2 == 0 and (p & (p - 1) == 0 or p <= 64))


ALGORITHMS = ("ring", "rhd", "direct", "stragglar", "optcc", "balanced_ring")

STAGES: dict[str, Stage] = {
    "schedule": Stage(schedule_stage, ALGORITHMS, _matching_by_formula),
    "plan": Stage(plan_stage, ALGORITHMS, _matching_by_formula),
    "simulate": Stage(simulate_stage, ALGORITHMS, _matching_by_formula),
    "decision": Stage(decision_stage, ("straggler", "slow_nic"), _matching_by_formula),
}


def _rss_mb() -> float:
    """Peak resident memory of this process so far (MB = 1e6 bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6


def child(stage: str, p: int, case: str) -> dict[str, Any]:
    """Run one measurement in this (fresh) process."""
    spec = STAGES[stage]
    # import what every stage imports before the baseline, so that the growth is the stage's own
    import stragglerkit.cli
    import stragglerkit.detect.model
    import stragglerkit.planner.lowering
    import stragglerkit.sim  # noqa: F401

    before = _rss_mb()
    start = time.perf_counter()
    result = spec.run(p, case)
    seconds = time.perf_counter() - start
    peak = _rss_mb()
    return {"seconds": seconds, "rss_mb": peak, "stage_mb": peak - before, "result": result}


def _measure(stage: str, p: int, case: str, timeout: float) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", stage, str(p), case]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:g} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return row


def slope(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(seconds) against log(p) over the points with p >= SLOPE_FROM."""
    used = [(math.log(p), math.log(max(s, 1e-6))) for p, s in points if p >= SLOPE_FROM]
    if len(used) < 2:
        return None
    mx = statistics.fmean(x for x, _ in used)
    my = statistics.fmean(y for _, y in used)
    den = sum((x - mx) ** 2 for x, _ in used)
    return None if den == 0 else sum((x - mx) * (y - my) for x, y in used) / den


def run_case(stage: str, case: str, sizes: list[int], repeats: int, timeout: float) -> dict[str, Any]:
    spec = STAGES[stage]
    rows = []
    for p in sizes:
        if not spec.applies(p, case):
            continue
        samples = [_measure(stage, p, case, timeout) for _ in range(repeats)]
        errors = [s["error"] for s in samples if "error" in s]
        if errors:
            rows.append({"p": p, "error": errors[0]})
            print(f"  {stage:>9} {case:<14} p={p:<5} {errors[0]}", flush=True)
            break
        row = {
            "p": p,
            "seconds": round(statistics.median(s["seconds"] for s in samples), 5),
            "rss_mb": round(max(s["rss_mb"] for s in samples), 1),
            "stage_mb": round(max(s["stage_mb"] for s in samples), 1),
            "result": samples[0]["result"],
        }
        rows.append(row)
        print(
            f"  {stage:>9} {case:<14} p={p:<5} {row['seconds']:9.4f} s  {row['stage_mb']:8.1f} MB "
            f"(peak RSS {row['rss_mb']:.0f} MB)",
            flush=True,
        )
    points = [(r["p"], r["seconds"]) for r in rows if "seconds" in r]
    fitted = slope(points)
    return {"case": case, "rows": rows, "slope": None if fitted is None else round(fitted, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages (default: all)")
    parser.add_argument("--cases", default="", help="comma-separated cases to keep (default: every case)")
    parser.add_argument("--max-p", type=int, default=max(SIZES), help="largest world size")
    parser.add_argument("--repeats", type=int, default=3, help="fresh subprocesses per point (median time)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per subprocess before a case stops")
    parser.add_argument("--out", type=Path, default=RESULTS / "scale.json")
    parser.add_argument("--child", nargs=3, metavar=("STAGE", "P", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        stage, p, case = args.child
        print(json.dumps(child(stage, int(p), case)))
        return 0
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage {unknown[0]!r}; choose from {', '.join(STAGES)}")
    keep = {c for c in args.cases.split(",") if c}
    sizes = [p for p in SIZES if p <= args.max_p]
    summary: dict[str, Any] = {"sizes": sizes, "repeats": args.repeats, "timeout_s": args.timeout}
    summary["slope_from_p"] = SLOPE_FROM
    summary["stages"] = {}
    for stage in stages:
        print(f"{stage}:", flush=True)
        cases = [c for c in STAGES[stage].cases if not keep or c in keep]
        summary["stages"][stage] = [run_case(stage, c, sizes, args.repeats, args.timeout) for c in cases]
    _keep_other_stages(args.out, summary, stages)
    write_summary(args.out, "scale", summary)
    return 0


def _keep_other_stages(path: Path, summary: dict[str, Any], stages: list[str]) -> None:
    """Stamp each case measured now with this run's command, commit, date and machine (``measured``), and
    carry over from the previous ``path`` every (stage, case) this run did not measure, with its
    own stamp: the growth table is one file, measured a stage or a case at a time."""
    from _env import command_line, machine_info, source_revision, utc_now

    stamp = {
        "command": command_line(),
        "source": source_revision(),
        "date": utc_now(),
        "machine": machine_info(),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    for cases in summary["stages"].values():
        for case in cases:
            case["measured"] = stamp
    if path.exists():
        previous = json.loads(path.read_text(encoding="utf-8"))
        older_runs = previous.get("runs", [])  # files written before the per-case stamps
        for name, cases in previous.get("stages", {}).items():
            fresh = {case["case"] for case in summary["stages"].get(name, [])}
            run = next((r for r in older_runs if name in r.get("stages", [])), None)
            kept = [{**case, "measured": case.get("measured", run)} for case in cases if case["case"] not in fresh]
            summary["stages"][name] = summary["stages"].get(name, []) + kept
    summary["note"] = "cases may come from several runs: each case's command, commit and date in 'measured'"


if __name__ == "__main__":
    sys.exit(main())

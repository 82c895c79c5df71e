"""The fine-tuning summary: stragglerkit against the plain framework in bench_finetune.sh's runs.

Reads the examples' ``train.json`` files from run folders named
``<example>_<framework>_<scenario>_run<i>`` and writes one summary (default
``profiling/results/bench_finetune.json``): per example, framework and scenario, the plain
copy's time to the target loss over stragglerkit's (median and every run; a run where a copy did
not reach the target counts as missing, with its best loss), the target, the steady-step ratio,
the A/A control (the same ratios of the plain copy over a second plain copy trained in the same
launch: the launch's noise; runs made before the control copy existed have instead the
compute-only ratio, ``compute_speedup_steady``), for a fault, how much it lengthened the plain
copy's steady step against the no-fault runs (``fault_cost``: what a switch can win back), the
step at which stragglerkit switched, whether the copies' losses agreed at every step and each copy's parameters were
identical on every rank, and the held-out figures. Each run keeps its own
``measured`` stamp (the example's command line, commit and date, from its train.json), and each
entry a ``measured`` stamp of its own: the bench command that measures that entry alone, its
runs' commits and dates. Entries of the previous summary that these runs do not measure are kept
with theirs, so the table can be measured an example, a framework or a scenario at a time (a run
of the whole matrix takes hours on a small machine), and resumed with ``KEEP``.

Example::

    python profiling/_finetune_summary.py /tmp/finetune/*_run*/train.json --command "bash profiling/bench_finetune.sh"
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import RESULTS, write_summary

from profiling.lab.train_report import compute_speedup

TARGETS = {
    "no_fault": ("time to target within 2 % of plain", 0.98),
    "straggler": ("time to target at least 1.1x shorter", 1.1),
    "degraded": ("time to target at least 1.2x shorter", 1.2),
}
"""Per scenario: the issue's target and the lowest plain/stragglerkit ratio that meets it."""


def _one(data: dict[str, Any]) -> dict[str, Any]:
    reached, header = data["time_to_target"], data["header"]
    return {
        "speedup_to_target": data["speedup_to_target"],
        "control_speedup_to_target": data.get("control_speedup_to_target"),
        "time_to_target_s": {name: reached[name]["time_s"] for name in reached},
        "best_loss": {name: reached[name]["best_loss"] for name in reached},
        "speedup_steady": data["speedup_steady"],
        "control_speedup_steady": data.get("control_speedup_steady"),
        "plain_steady_ms": data["plain_steady_ms"],
        "compute_speedup_steady": _control(data),
        "switched_step": data["switched_step"],
        "algorithm": data["algorithm"],
        "losses_agree": data["losses_agree"],
        "identical_on_all_ranks": data["hooked_identical_on_all_ranks"] and data["plain_identical_on_all_ranks"],
        "evaluation": data["evaluation"],
        "load_average": header["load_average"],
        "cpu_model": header.get("machine", {}).get("cpu_model"),
        "measured": {
            "command": header.get("command"),
            "commit": header.get("source", {}).get("commit"),
            "date": header.get("date"),
        },
    }


def _control(data: dict[str, Any]) -> float | None:
    """The run's ``compute_speedup_steady`` (profiling.lab.train_report), computed from its
    per-rank times where the run predates the field; None where the copies ran the example's own
    step whole (then the A/A control copy is the control)."""
    if data.get("compute_speedup_steady") is not None:
        return float(data["compute_speedup_steady"])
    if data.get("example_step"):
        return None
    steady, per_rank = data.get("steady_steps"), data.get("steps", {}).get("per_rank")
    if not steady or not per_rank:
        return None
    return compute_speedup(per_rank, list(range(steady[0], steady[1] + 1)))


def _entry_stamp(key: str, runs: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """How an entry was measured: the bench command for it alone, its runs' commits and dates."""
    name, framework, scenario = key.split("/")
    dates = sorted(str(r["measured"]["date"]) for r in runs if r["measured"]["date"])
    return {
        "command": f"RUNS={len(runs)} STEPS={steps} EXAMPLES={name} FRAMEWORKS={framework} "
        f"SCENARIOS={scenario} bash profiling/bench_finetune.sh",
        "commits": sorted({str(r["measured"]["commit"]) for r in runs if r["measured"]["commit"]}),
        "dates": [dates[0], dates[-1]] if dates else [],
    }


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(paths: list[Path]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    targets: dict[str, float] = {}
    steps: dict[str, int] = {}
    for path in sorted(paths):
        name, framework, *scenario, _ = path.parent.name.split("_")
        key = f"{name}/{framework}/{'_'.join(scenario)}"
        data = json.loads(path.read_text(encoding="utf-8"))
        groups.setdefault(key, []).append(_one(data))
        targets[key] = data["header"]["config"]["target_loss"]
        steps[key] = data["header"]["config"]["steps"]
    out: dict[str, Any] = {}
    for key, runs in groups.items():
        scenario_name = key.rsplit("/", 1)[1]
        ratios = [r["speedup_to_target"] for r in runs if r["speedup_to_target"] is not None]
        median = statistics.median(ratios) if ratios else None
        text, lowest = TARGETS.get(scenario_name, ("", 0.0))
        out[key] = {
            "target": text,
            "target_loss": targets[key],
            "median_speedup_to_target": median,
            "met": None if median is None else median >= lowest,
            "runs_reaching_target": f"{len(ratios)}/{len(runs)}",
            "median_speedup_steady": _median([r["speedup_steady"] for r in runs]),
            "median_control_speedup_to_target": _median([r["control_speedup_to_target"] for r in runs]),
            "median_control_speedup_steady": _median([r["control_speedup_steady"] for r in runs]),
            "median_compute_speedup_steady": _median([r["compute_speedup_steady"] for r in runs]),
            "median_plain_steady_ms": _median([r["plain_steady_ms"] for r in runs]),
            "all_checks_passed": all(r["losses_agree"] and r["identical_on_all_ranks"] for r in runs),
            "runs": runs,
            "measured": _entry_stamp(key, runs, steps[key]),
        }
    return out


def _cpu_models(entry: dict[str, Any]) -> set[str] | None:
    """The CPU models an entry's runs ran on; None if a run predates the record (unknown)."""
    models = [run.get("cpu_model") for run in entry.get("runs", [])]
    return None if not models or None in models else set(models)


def add_fault_costs(results: dict[str, Any]) -> dict[str, Any]:
    """Each fault entry's ``fault_cost``: how much longer the fault made the *plain* copy's steady
    step than in the no-fault runs of the same example and framework (medians; 0.10: 10 %
    longer). That is what a switch can win back per step, so it bounds the speedups; None where
    either median is missing, or where the two entries' runs are known to have run on different
    CPU models (``fault_cost_why`` says so): step times of two machines do not compare."""
    for key, entry in results.items():
        name, framework, scenario = key.split("/")
        if scenario == "no_fault":
            continue
        entry.pop("fault_cost_why", None)
        no_fault = results.get(f"{name}/{framework}/no_fault", {})
        base = no_fault.get("median_plain_steady_ms")
        faulty = entry.get("median_plain_steady_ms")
        ours, theirs = _cpu_models(entry), _cpu_models(no_fault)
        if ours is not None and theirs is not None and ours != theirs:
            base = None
            entry["fault_cost_why"] = (
                f"the no-fault runs ran on {', '.join(sorted(theirs))} and these on {', '.join(sorted(ours))}: "
                f"measure {name}/{framework}/no_fault on the machine of this entry"
            )
        entry["fault_cost"] = None if base is None or faulty is None else faulty / base - 1.0
    return results


def keep_unmeasured(path: Path, results: dict[str, Any]) -> dict[str, Any]:
    """``results`` plus every entry of the summary at ``path`` that ``results`` does not measure."""
    if not path.exists():
        return results
    previous = json.loads(path.read_text(encoding="utf-8")).get("results", {})
    kept = {key: entry for key, entry in previous.items() if key not in results}
    return dict(sorted({**kept, **results}.items()))


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--command", default=None)
    parser.add_argument("--out", default=str(RESULTS / "bench_finetune.json"))
    args = parser.parse_args()
    results = summarize(args.files)
    everything = add_fault_costs(keep_unmeasured(Path(args.out), results))
    for key, entry in results.items():
        ratio = entry["median_speedup_to_target"]
        print(
            f"{key:>28}: plain/stragglerkit time to loss {entry['target_loss']:g}: "
            f"{'not reached' if ratio is None else f'{ratio:.3f}x'} ({entry['runs_reaching_target']} runs), "
            f"target: {entry['target']}, met: {entry['met']}; steady step {_x(entry['median_speedup_steady'])}, "
            f"A/A control: time to loss {_x(entry['median_control_speedup_to_target'])}, steady step "
            f"{_x(entry['median_control_speedup_steady'])}"
            + ("" if entry.get("fault_cost") is None else f"; the fault made plain's step {entry['fault_cost']:+.1%}")
            + ("" if not entry.get("fault_cost_why") else f"; no fault cost: {entry['fault_cost_why']}")
            + ("" if entry["all_checks_passed"] else "; CHECKS FAILED (losses or parameters: see the runs)")
        )
    note = (
        "entries may come from several launches of the script (KEEP resumes): each entry's 'measured' names "
        "the command that measures it alone and its runs' commits and dates; each run's, the example's own command"
    )
    write_summary(args.out, "bench_finetune", {"note": note, "results": everything}, args.command)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""From the ranks' record of a training bench run to the summary, the table and the JSON.

Per step and run, every rank recorded when its step ended (forward, injected lateness, backward
with the AllReduce, optimizer step), counted from the barrier that started the step's block
(:mod:`profiling.lab.train_worker`). A step's time is how much later the last rank finished it
than the last rank finished the previous step of the block (for a block's first step: than the
barrier): the group's pace, which in steady state is the training's time per step. In lockstep
(``steps_per_block=1``) that is the slowest rank's step.

* ``detected_step`` / ``switched_step``: the step of the hook's first ``detected_*`` / ``switch``
  event (an event's step is the first step under the resulting plan; docs/detection.md).
* **Steady state**: the steps from ``settle_steps`` (the hook's, 2 by default) after the last plan
  change (``switch``, ``rollback``, ``cleared``) to the end; without any change, from
  ``settle_steps`` after the later of the hook's warm-up, the fault's first step and the
  straggler's last move. ``speedup_steady`` = median plain step time / median hooked step time
  over those steps. ``speedup_steady_total`` = total plain time / total hooked time over the same
  steps: it also counts the rare slow steps that the median leaves out (the probes that replace
  OptCC every ``plan_probe_every`` steps, for one).
* ``backward_speedup_steady``: the same ratio for the *last arriver's backward*: per step the
  smallest backward time over the ranks (timed from the end of the injected lateness; the rank
  that arrives last waits least), i.e. its backward compute plus the AllReduce from its arrival.
  It separates what the AllReduce gained from the rest of the step.
* ``control_speedup_steady`` (and ``_total``): the A/A control. The same ratio of the plain copy
  over the control, a second plain copy that trained the same steps in the same launch, taking
  turns with the others: the two are the same program, so this is 1 up to the launch's noise; a
  ``speedup_steady`` no further from 1 than the control is within that noise. None without a
  control copy.
* ``compute_speedup_steady``: where the time differs. The plain/hooked ratio for the part of each
  rank's step where no stragglerkit code runs (its step time less its backward: zero_grad,
  forward, any injected lateness, the optimizer step), the median over ranks and steady steps.
  None where the copies ran a workload's own ``train_step`` whole (``example_step``).
* ``cpu_busy_steady``: per copy (``plain``, ``hooked``), the busiest host's busy share of its CPU
  time (all cores, ``/proc/stat``) over the steady steps, from the start of each rank's step to
  its end (:mod:`stragglerkit.bench.cpu_load`): near 1, every millisecond of CPU work that either
  copy adds lengthens the step; None where not measured.
* ``max_param_diff``: the largest absolute difference between the plain and the hooked model's
  parameters, over every block (both copies at the same step) and rank.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from typing import Any

from profiling.lab.train_config import TrainConfig
from stragglerkit.bench.cpu_load import CPU_BOUND, CpuTimes, busy_share

__all__ = [
    "PLAN_CHANGES",
    "compute_speedup",
    "group_step_times",
    "loop_figures",
    "print_summary",
    "summarize",
    "write_json",
]

PLAN_CHANGES = ("switch", "rollback", "cleared")
"""Event kinds after which the hooked run's plan differs (docs/detection.md, the event log)."""
_FEW_STEADY_STEPS = 10


def _median_ms(values: list[float]) -> float | None:
    return float(statistics.median(values)) * 1e3 if values else None


def _fault_at(config: TrainConfig, step: int) -> str:
    if step < config.from_step or config.scenario == "none":
        return "-"
    parts = []
    late = config.late_rank(step)
    if late is not None:
        parts.append(f"rank {late} late")
    slow = config.degrade
    if config.reshape_at is not None and step >= config.reshape_at:
        slow = {r: v for r, v in {**config.degrade, **config.reshaped}.items() if v > 1.0}
    if slow:
        parts.append(", ".join(f"rank {r} l={v:g}" for r, v in sorted(slow.items())))
    if config.jitter > 0:
        parts.append(f"jitter {config.jitter * 1e3:g} ms")
    return ", ".join(parts) or "-"


def _steady_start(config: TrainConfig, record: dict[str, Any]) -> tuple[int, str]:
    settle = int(record["hook_config"]["settle_steps"])
    changes = [int(e["step"]) for e in record["events"] if e["kind"] in PLAN_CHANGES]
    if changes:
        return max(changes) + settle, f"from {settle} steps after the last plan change at step {max(changes)}"
    starts = [int(record["hook_config"]["warmup_steps"])]
    if config.scenario != "none":
        starts.append(config.from_step)
    starts += [step for step, _ in config.moves]
    return max(starts) + settle, f"from {settle} steps after step {max(starts)}, no plan change"


def _phases(
    config: TrainConfig, record: dict[str, Any], plain: list[float], hooked: list[float]
) -> list[dict[str, Any]]:
    steps = config.steps
    steady_from, _ = _steady_start(config, record)
    cuts = {0, int(record["hook_config"]["warmup_steps"]), steady_from}
    if config.scenario != "none":
        cuts.add(config.from_step)
    if config.reshape_at is not None:
        cuts.add(config.reshape_at)
    cuts.update(step for step, _ in config.moves)
    cuts.update(int(e["step"]) for e in record["events"] if e["kind"] in PLAN_CHANGES)
    bounds = [*sorted(c for c in cuts if 0 <= c < steps), steps]
    phases = []
    for first, end in itertools.pairwise(bounds):
        algorithms = record["algorithms"][first:end]
        ran = max(dict.fromkeys(algorithms), key=algorithms.count)
        p, h = _median_ms(plain[first:end]), _median_ms(hooked[first:end])
        phases.append(
            {
                "steps": [first, end - 1],
                "fault": _fault_at(config, first),
                "hook_algorithm": ran,
                "plain_ms": p,
                "hooked_ms": h,
                "speedup": p / h if p and h else None,
                "steady": first >= steady_from,
            }
        )
    return phases


def _switch_summary(event: dict[str, Any]) -> dict[str, Any]:
    evidence = event.get("evidence", {})
    out: dict[str, Any] = {"step": event["step"], "kind": event["kind"], "algorithm": event["algorithm"]}
    if event["kind"] == "switch":
        out["plan"] = evidence.get("to")
        for key in ("predicted_before_s", "predicted_after_s", "measure", "measured_before_s", "allreduce_before_s"):
            out[key] = evidence.get(key)
    elif event["kind"] == "rollback":
        out["plan"] = evidence.get("restored")
        for key in ("measure", "measured_before_s", "measured_after_s", "allreduce_before_s", "allreduce_after_s"):
            out[key] = evidence.get(key)
    else:
        out["plan"] = {"ranks": evidence.get("ranks")}
    return out


def _cpu_busy(per_step: list[list[list[int] | None]] | None, steps: list[int]) -> float | None:
    """The busiest host's busy share over ``steps`` (``per_step[step][rank]`` = [busy, total] ticks)."""
    if not per_step or not steps:
        return None
    hosts: dict[int, CpuTimes] = {}
    for step in steps:
        for rank, ticks in enumerate(per_step[step]):
            if ticks is not None:
                used = CpuTimes(busy=ticks[0], softirq=0, total=ticks[1])
                hosts[rank] = hosts[rank] + used if rank in hosts else used
    shares = [share for share in map(busy_share, hosts.values()) if share is not None]
    return max(shares, default=None)


def group_step_times(ends: list[list[float]], block_starts: list[int]) -> list[float]:
    """Per step, how much later the last rank finished it than the previous step (``ends[step][rank]``:
    seconds from the block's barrier; a block's first step counts from the barrier).

    Example::

        group_step_times([[1.0, 1.2], [2.1, 2.0], [0.5, 0.7]], [0, 2])    # [1.2, 0.9, 0.7] (up to rounding)
    """
    starts = set(block_starts)
    times = []
    for step, ranks in enumerate(ends):
        last = max(ranks)
        times.append(last if step in starts else last - max(ends[step - 1]))
    return times


def loop_figures(config: TrainConfig, record: dict[str, Any]) -> dict[str, Any]:
    """What every run's summary says, one copy or two: the scenario, what the hooked copy's loop
    detected and switched to, whether each copy's parameters are identical on every rank, the
    fault, and the model."""
    events = record["events"]
    detections = [e for e in events if e["kind"].startswith("detected_")]
    first_switch = next((e for e in events if e["kind"] == "switch"), None)
    return {
        "scenario": config.scenario,
        "detected_step": detections[0]["step"] if detections else None,
        "detected": [{"step": e["step"], "kind": e["kind"], "ranks": e["evidence"].get("ranks")} for e in detections],
        "switched_step": first_switch["step"] if first_switch else None,
        "algorithm": record["algorithms"][-1] if record["algorithms"] else None,
        "final_plan": record["final_plan"],
        **{f"{name}_identical_on_all_ranks": len(set(sums)) == 1 for name, sums in record["checksums"].items()},
        "fault_step": config.from_step if config.scenario != "none" else None,
        "delay_s": record["delay_s"],
        "delay_calibration": record["delay_calibration"],
        "model": {
            "layers": record.get("model_layers") or f"{256}-{record['hidden']}-{record['hidden']}-{16} MLP",
            "parameters": record["parameters"],
            "gradient_bytes": record["gradient_bytes"],
            "buckets_bytes": record["buckets_bytes"],
            "batch": config.batch,
        },
        "hook_config": record["hook_config"],
    }


def compute_speedup(per_rank: dict[str, list[list[float]]], steps: list[int]) -> float | None:
    """``compute_speedup_steady`` (module docstring) from the per-rank step and backward times
    (``[step][rank]`` seconds) over ``steps``; None without them."""
    outside: dict[str, list[float]] = {}
    for name in ("plain", "hooked"):
        times, backward = per_rank.get(f"{name}_s"), per_rank.get(f"{name}_backward_s")
        if not times or not backward:
            return None
        outside[name] = [
            step_s - backward_s for s in steps if s < len(times) for step_s, backward_s in zip(times[s], backward[s])
        ]
    if not outside["plain"] or not outside["hooked"]:
        return None
    hooked = statistics.median(outside["hooked"])
    return statistics.median(outside["plain"]) / hooked if hooked > 0 else None


def summarize(config: TrainConfig, record: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run (see the module docstring) plus its per-step series."""
    names = [name for name in ("plain", "control", "hooked") if f"{name}_s" in record]
    if "plain_end_s" in record:
        times = {name: group_step_times(record[f"{name}_end_s"], record["block_starts"]) for name in names}
    else:  # a record without block ends: every step started at a barrier
        times = {name: [max(ranks) for ranks in record[f"{name}_s"]] for name in names}
    plain, hooked = times["plain"], times["hooked"]
    control = times.get("control")
    events = record["events"]
    switches = [_switch_summary(e) for e in events if e["kind"] in PLAN_CHANGES]
    steady_from, steady_why = _steady_start(config, record)
    steady = list(range(steady_from, config.steps))
    plain_steady = _median_ms([plain[s] for s in steady])
    hooked_steady = _median_ms([hooked[s] for s in steady])
    speedup = plain_steady / hooked_steady if plain_steady and hooked_steady else None
    hooked_total = sum(hooked[s] for s in steady)
    speedup_total = sum(plain[s] for s in steady) / hooked_total if steady and hooked_total > 0 else None
    plain_backward = [min(ranks) for ranks in record["plain_backward_s"]]
    hooked_backward = [min(ranks) for ranks in record["hooked_backward_s"]]
    plain_backward_steady = _median_ms([plain_backward[s] for s in steady])
    hooked_backward_steady = _median_ms([hooked_backward[s] for s in steady])
    backward_speedup = (
        plain_backward_steady / hooked_backward_steady if plain_backward_steady and hooked_backward_steady else None
    )
    control_steady = _median_ms([control[s] for s in steady]) if control is not None else None
    control_total = sum(control[s] for s in steady) if control is not None else 0.0
    return {
        **loop_figures(config, record),
        "speedup_steady": speedup,
        "speedup_steady_total": speedup_total,
        "steady_steps": [steady[0], steady[-1]] if steady else None,
        "steady_from_why": steady_why,
        "plain_steady_ms": plain_steady,
        "hooked_steady_ms": hooked_steady,
        "control_steady_ms": control_steady,
        "control_speedup_steady": plain_steady / control_steady if plain_steady and control_steady else None,
        "control_speedup_steady_total": (
            sum(plain[s] for s in steady) / control_total if steady and control_total > 0 else None
        ),
        "backward_speedup_steady": backward_speedup,
        "example_step": bool(record.get("example_step")),
        "compute_speedup_steady": None if record.get("example_step") else compute_speedup(record, steady),
        "cpu_busy_steady": {name: _cpu_busy(record.get(f"{name}_cpu"), steady) for name in names},
        "plain_backward_steady_ms": plain_backward_steady,
        "hooked_backward_steady_ms": hooked_backward_steady,
        "max_param_diff": max(record["param_diff"]) if record["param_diff"] else None,
        "param_scale": record["param_scale"],
        "switches": switches,
        "detector_evidence": record.get("detector_evidence"),
        "cost_model": record.get("cost_model"),
        "phases": _phases(config, record, plain, hooked),
        "steps": {
            **{f"{name}_s": times[name] for name in names},
            "plain_backward_s": plain_backward,
            "hooked_backward_s": hooked_backward,
            "hook_algorithm": record["algorithms"],
            "rank_map": record["rank_maps"],
            "late_rank": [config.late_rank(s) for s in range(config.steps)],
            "param_diff": record["param_diff"],
            "loss_rank0": record["loss"],
            "per_rank": {
                f"{name}_{key}": record[f"{name}_{key}"]
                for name in names
                for key in ("s", "end_s", "backward_s")
                if f"{name}_{key}" in record
            },
            "block_starts": record.get("block_starts"),
        },
        "events": events,
    }


def write_json(path: str, header: dict[str, Any], summary: dict[str, Any]) -> None:
    """``{"header": ..., <the summary's fields>}``, the summary's keys at the top level."""
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"header": header, **summary}, handle, indent=1)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_summary(summary: dict[str, Any], header: dict[str, Any], out: Any = None) -> None:
    """The per-phase table and the headline figures."""
    stream = out if out is not None else sys.stdout
    config = header["config"]
    model = summary["model"]

    def say(line: str = "") -> None:
        print(line, file=stream)

    say(f"# training bench: {config['world_size']} ranks, {header['mode']} ({header['mode_reason']})")
    framework = config.get("framework", "ddp")
    horovod = framework == "horovod"
    owner = {"horovod": "stragglerkit's", "megatron": "megatron-core DDP"}.get(framework, "DDP")
    say(
        f"# model: {model['layers']}, {model['gradient_bytes'] / 2**20:.2f} MiB of gradients in {owner}"
        + " buckets of "
        + ", ".join(f"{b / 2**20:.2f}" for b in model["buckets_bytes"])
        + f" MiB; batch {model['batch']}; load average {header['load_average'][0]:.2f}"
    )
    if horovod:
        say("# plain: hvd.DistributedOptimizer; hooked: stragglerkit.straggler_aware (Horovod ranks, Gloo)")
    elif framework == "megatron":
        say(
            "# plain: megatron-core's DistributedDataParallel (overlap_grad_reduce); hooked: the same with "
            "stragglerkit.megatron.install; megatron-core's schedule and SGD"
        )
    elif config.get("gradient_as_bucket_view", False):
        say("# every copy: DDP with gradient_as_bucket_view, gradients zeroed in place")
    else:
        say("# every copy: DDP's default (gradients copied into the buckets; a hook divides in a pass of its own)")
    scenario = summary["scenario"]
    if summary["delay_s"] is not None:
        how = ""
        if summary["delay_calibration"]:
            how = f" (auto: {summary['delay_calibration']['scale']:g} x the measured StragglAR pre-phase)"
        scenario += f", delay {summary['delay_s'] * 1e3:.1f} ms{how}"
    if summary["fault_step"] is not None:
        scenario += f", from step {summary['fault_step']}"
    say(f"# scenario: {scenario}")
    say("#")
    say(f"# {'steps':>9} {'fault':>22} {'hook runs':>10} {'plain(ms)':>10} {'hooked(ms)':>11} {'speedup':>8}")
    for phase in summary["phases"]:
        first, last = phase["steps"]
        speedup = "-" if phase["speedup"] is None else f"{phase['speedup']:.3f}x"
        mark = "  steady" if phase["steady"] else ""
        say(
            f"  {f'{first}-{last}':>9} {phase['fault']:>22} {phase['hook_algorithm']:>10} "
            f"{_ms(phase['plain_ms']):>10} {_ms(phase['hooked_ms']):>11} {speedup:>8}{mark}"
        )
    say("#")
    detected = summary["detected"]
    found = (
        f"step {detected[0]['step']} ({detected[0]['kind']}: ranks {', '.join(detected[0]['ranks'] or {})})"
        if detected
        else "nothing"
    )
    switched = summary["switched_step"]
    say(
        f"# detected: {found}; first switch: {'none' if switched is None else f'step {switched}'}; "
        f"plan changes: {len(summary['switches'])}; final algorithm: {summary['algorithm']}"
    )
    for change in summary["switches"]:
        say(f"#   step {change['step']}: {change['kind']} -> {change['algorithm']} {json.dumps(change['plan'])}")
    steady = summary["steady_steps"]
    if steady is None:
        say("# steady state: no steps left after the last plan change (run more --steps)")
    else:
        count = steady[1] - steady[0] + 1
        speedup = summary["speedup_steady"]
        total = summary.get("speedup_steady_total")
        say(
            f"# steady state: steps {steady[0]}-{steady[1]} ({count} steps; {summary['steady_from_why']}): "
            f"plain {_ms(summary['plain_steady_ms'])} ms, hooked {_ms(summary['hooked_steady_ms'])} ms "
            f"-> speedup {'-' if speedup is None else f'{speedup:.3f}x'}"
            + ("" if total is None else f" (total time: {total:.3f}x)")
            + (" (few steps: run more --steps for a firmer figure)" if count < _FEW_STEADY_STEPS else "")
        )
        backward = summary["backward_speedup_steady"]
        ratio = "-" if backward is None else f"{backward:.3f}x"
        say(
            f"#   last arriver's backward + AllReduce: plain {_ms(summary['plain_backward_steady_ms'])} ms, "
            f"hooked {_ms(summary['hooked_backward_steady_ms'])} ms -> {ratio}"
        )
        control = summary.get("control_speedup_steady")
        if control is not None:
            say(
                f"#   A/A control: plain {_ms(summary['plain_steady_ms'])} ms, its identical second copy "
                f"{_ms(summary['control_steady_ms'])} ms -> {control:.3f}x (this launch's noise: a speedup no "
                f"further from 1 than {abs(control - 1.0):.1%} is noise)"
            )
        compute = summary.get("compute_speedup_steady")
        if compute is not None:
            say(
                f"#   the rest of each rank's step (forward, optimizer; no stragglerkit code) -> {compute:.3f}x"
            )
        cpu = summary.get("cpu_busy_steady") or {}
        if all(cpu.get(name) is not None for name in ("plain", "hooked")):
            say(
                f"#   CPUs busy during the steps (busiest host, all cores): plain {cpu['plain'] * 100:.0f} %, "
                f"hooked {cpu['hooked'] * 100:.0f} %"
                + (" (saturated: any CPU work the hook adds lengthens the step)" if cpu["hooked"] >= CPU_BOUND else "")
            )
    identical = "yes" if summary["hooked_identical_on_all_ranks"] else "NO"
    say(
        f"# parameters: largest |plain - hooked| {summary['max_param_diff']:.3g} (largest |parameter| "
        f"{summary['param_scale']:.3g}); hooked model identical on all ranks: {identical}"
    )
    block = config.get("steps_per_block", 1)
    if block == 1:
        say(
            "# step time (lockstep, a barrier before every step): the slowest rank's forward + injected lateness + "
            "backward (AllReduce) + optimizer step"
        )
    else:
        say(
            f"# step time: the copies take turns in blocks of {block} steps, with a barrier only when a block "
            "starts; a step's time is how much later the last rank finished it than the step before"
        )

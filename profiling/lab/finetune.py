"""``python -m profiling.lab.finetune bert|llama``: an example's workload, plain against stragglerkit.

``examples/bert/train.py`` and ``examples/llama/train.py`` are the training scripts users run;
:mod:`.workloads` turns their model, data and loss into the bench's workload. Everything else is
the training bench's (:mod:`profiling.lab.train`): the ranks run on the emulated cluster (root: one
network namespace per rank, NICs shaped to ``--bandwidth``, 1 Gbit/s by default), over loopback
(``--loopback``, or where no cluster can be made), or as the ranks of ``torchrun`` (RANK,
WORLD_SIZE and MASTER_ADDR set) or ``horovodrun`` (HOROVOD_RANK set); each rank trains three copies
of the model, the plain framework, a second plain copy (the A/A control: ``--no-control`` leaves
it out) and stragglerkit, taking turns in blocks of steps, on the same batches, with the same
injected faults; every copy runs the example's own ``train_step``. ``--stragglerkit on`` (or
``off``) trains only the copy with (or without) stragglerkit: one model in memory, as a user's
real run; its figures are its own and nothing is compared (:func:`summarize_one`).

**Which loss, and the time to reach it.** Per step, the *global loss* is the mean over the ranks
of each rank's batch loss (the loss of the whole global batch: every rank's batch has the same
size). The loss that is compared with ``--target-loss`` is its running mean over the last
:data:`TARGET_WINDOW` steps (fewer at the start), so that one lucky batch does not count as
reaching it. A copy's *time to target* is the sum of its step times (the group's pace, as the
bench measures it: :mod:`profiling.lab.train_report`) up to and including the first step at
which that running mean is at or below the target. A target not reached within ``--steps`` is
reported as not reached, with the best running mean seen.

**Checks, failing loudly.** The copies compute the same training up to the order of the sums
in the AllReduce: each one's global losses must agree with the plain copy's at every step within
``--loss-rtol`` (relative; :data:`LOSS_RTOL`: 1e-3, under Horovod 1e-2, as Horovod's own fusion
orders its sums by timing), and each copy's parameters must be identical on every rank (a
weighted checksum per rank). A run that breaks either exits with status 1 and says so; the figures are still written.

**The run folder** (``--run-dir``): ``events.rank{r}.jsonl`` (the stragglerkit copy's event logs,
written as the run goes, so that an interrupted run is still readable), ``train.json`` (the
bench's JSON plus the fields above), ``loss_vs_time.png``; ``stragglerkit report DIR`` reads it.

Example (from the repository root; 8 ranks on the emulated cluster as root, rank 7 a slow GPU)::

    python -m profiling.lab.finetune bert --straggler 7 --steps 80 --target-loss 0.6
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import itertools
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from profiling.lab.train_config import TrainConfig
from stragglerkit.bench.config import argument_type, parse_degrade, parse_delay_option
from stragglerkit.bench.launch import detect_mode
from stragglerkit.errors import StragglerKitError
from stragglerkit.units import parse_bandwidth

__all__ = [
    "LOSS_RTOL",
    "SWITCH_COPIES",
    "TARGET_WINDOW",
    "analyse",
    "example_parser",
    "global_losses",
    "main",
    "summarize_one",
    "time_to_target",
]

TARGET_WINDOW = 5
"""Steps in the running mean of the global loss that is compared with the target."""
SWITCH_COPIES = {"both": ["plain", "control", "hooked"], "on": ["hooked"], "off": ["plain"]}
"""``--stragglerkit``: which copies of the model each rank trains (``TrainConfig.copies``)."""
LOSS_RTOL = {"ddp": 1e-3, "megatron": 1e-3, "horovod": 1e-2}
"""Default largest relative difference between the two copies' global losses at any step, per
framework. DDP and megatron-core reduce the same buckets in both copies. Horovod fuses what is ready
in each cycle, so even two copies on its own optimizer take their sums in different orders: two
plain ``hvd.DistributedOptimizer`` copies of the Llama example (AdamW, 8 ranks, 60 steps) drifted
3.2e-3 apart by step 56, as far as ``straggler_aware`` did (2.7e-3 and 3.2e-3)."""


def example_parser(
    description: str, prog: str, frameworks: Sequence[str] = ("ddp", "horovod")
) -> argparse.ArgumentParser:
    """The options every fine-tuning example takes (an example adds its own)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    add = parser.add_argument
    add("--framework", choices=tuple(frameworks), default="ddp", help="the data-parallel framework (default ddp)")
    add(
        "--stragglerkit",
        choices=tuple(SWITCH_COPIES),
        default="both",
        help="both: plain and stragglerkit side by side, compared, with a second plain copy as the A/A control "
        "(default); on: only with stragglerkit; off: only the plain framework (one model in memory, no comparison)",
    )
    add(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --stragglerkit both: train the A/A control, a second plain copy (default on; --no-control: a "
        "third less time, but a difference can no longer be told from noise)",
    )
    add("--world-size", type=int, default=None, help="ranks to start (default 8; under torchrun: WORLD_SIZE)")
    add("--steps", type=int, default=60, help="training steps of each copy (default 60)")
    add("--target-loss", type=float, default=None, help="report when each copy reached this loss")
    add("--straggler", type=int, default=None, metavar="RANK", help="this rank's backward is slowed every step")
    add(
        "--delay",
        type=argument_type(parse_delay_option),
        default=None,
        metavar="MS|auto",
        help="the straggler's extra backward time (plain numbers are ms; default auto: 2 x the punctual ranks' "
        "StragglAR pre-phase time on the whole gradient, measured before training)",
    )
    add("--degrade", type=argument_type(parse_degrade), action="append", metavar="RANK:L", help="RANK's NIC at 1/L")
    add("--from-step", type=int, default=None, metavar="S", help="first step of the fault (default 0)")
    add("--bandwidth", type=argument_type(parse_bandwidth), default=None, help="emulated NIC rate (default 1Gbit)")
    add("--loopback", action="store_true", help="ranks over loopback, not on the emulated cluster")
    add("--steps-per-block", type=int, default=None, metavar="N", help="the copies take turns every N steps")
    add("--hook-warmup", type=int, default=None, metavar="STEPS", help="stragglerkit's warm-up steps (default 10)")
    add("--seed", type=int, default=0, help="seeds the model head, the data order and dropout (default 0)")
    add(
        "--loss-rtol",
        type=float,
        default=None,
        help="the copies' losses must agree this well (relative; default "
        + ", ".join(f"{rtol:g} under {framework}" for framework, rtol in LOSS_RTOL.items())
        + ")",
    )
    add("--run-dir", default=None, metavar="DIR", help="where the run's files go (default runs/NAME-DATE)")
    add("--timeout", type=float, default=3600.0, help="seconds to wait for the ranks (default 3600)")
    add("--wandb", action="store_true", help="log the curves and figures to Weights & Biases (offline unless set)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``argv`` (``EXAMPLE [OPTIONS]``); the exit status (0, 1: a check failed or the ranks
    failed, 2: bad options or a missing package, said in one line)."""
    from profiling.lab.workload import MegatronWorkload, load_workload
    from profiling.lab.workloads import EXAMPLES

    given = list(sys.argv[1:] if argv is None else argv)
    if not given or given[0] not in EXAMPLES:
        names = "|".join(EXAMPLES)
        print(f"usage: python -m profiling.lab.finetune {names} [OPTIONS] (--help after the name)", file=sys.stderr)
        return 2
    name, given = given[0], given[1:]
    example = EXAMPLES[name]
    frameworks = example.frameworks
    parser = example_parser(example.description, prog=f"python -m profiling.lab.finetune {name}", frameworks=frameworks)
    example.add_arguments(parser)
    args = parser.parse_args(given)
    say = _say_on_rank0()
    try:
        mode, why = _mode(args)
        world_size = _world_size(args, mode)
        if args.framework == "horovod" and importlib.util.find_spec("horovod") is None:
            raise ValueError("--framework horovod needs Horovod: bash scripts/install_horovod.sh (or --framework ddp)")
        if args.framework == "megatron" and importlib.util.find_spec("megatron") is None:
            raise ValueError("--framework megatron needs megatron-core: pip install megatron-core==0.16.1 (or ddp)")
        workload_options = example.options(args)
        spec = f"profiling.lab.workloads:{name}"
        run_dir = Path(args.run_dir or f"runs/{name}-{args.framework}-{datetime.datetime.now():%Y%m%d-%H%M%S}")
        config = TrainConfig(
            world_size=world_size,
            bandwidth=args.bandwidth or (parse_bandwidth("1Gbit") if mode == "emulated" else None),
            mode=mode,
            framework=args.framework,
            steps=args.steps,
            straggler=args.straggler,
            delay=args.delay,
            degrade=dict(args.degrade or []),
            workload=spec,
            workload_options=workload_options,
            slowdown="backward",
            batch=int(workload_options.get("batch", 0)),
            target_loss=args.target_loss,
            copies=[name for name in SWITCH_COPIES[args.stragglerkit] if args.control or name != "control"],
            seed=args.seed,
            timeout=args.timeout,
            event_log=str(run_dir.absolute()),
            **{
                key: value
                for key, value in (
                    ("from_step", args.from_step),
                    ("steps_per_block", args.steps_per_block),
                    ("hook_warmup", args.hook_warmup),
                )
                if value is not None
            },
        )
        workload = load_workload(spec, workload_options)  # a missing package or file stops here
        if args.framework == "megatron" and not isinstance(workload, MegatronWorkload):
            raise ValueError(f"--framework megatron: {name}'s workload has no megatron-core model; use ddp or horovod")
        prepare = getattr(workload, "prepare", None)
        if prepare is not None:
            prepare()
        run_dir.mkdir(parents=True, exist_ok=True)
    except (ValueError, ImportError, OSError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    say(f"{parser.prog}: {world_size} ranks on {mode} ({why}); run folder {run_dir}")
    return _run(config, args, given, parser.prog, run_dir, say)


def _run(config: TrainConfig, args: argparse.Namespace, argv: list[str], prog: str, run_dir: Path, say: Any) -> int:
    from profiling.lab.train import launch_train
    from profiling.lab.train_report import print_summary, summarize, write_json
    from stragglerkit.bench.results import header_record

    try:
        launched, record = launch_train(config)
    except StragglerKitError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    if record is None:  # a torchrun or horovodrun rank other than 0
        return 0
    both = config.compared
    summary = summarize(config, record) if both else summarize_one(config, record)
    header = header_record(config, launched, argv)
    header["command"] = " ".join([prog, *argv])
    for key in ("alpha_s", "model_bandwidth_Bps"):
        header.pop(key, None)
    rtol = LOSS_RTOL[config.framework] if args.loss_rtol is None else args.loss_rtol
    problems = analyse(config, record, summary, rtol)
    if both:
        print_summary(summary, header)
    else:
        _print_one(summary, header)
    _print_finetune(summary)
    write_json(str(run_dir / "train.json"), header, summary)
    _plot(summary, run_dir / "loss_vs_time.png")
    if args.wandb:
        _log_wandb(summary, header, run_dir)
    say(f"wrote {run_dir}/train.json and loss_vs_time.png; then: stragglerkit report {run_dir} -o report.html")
    for problem in problems:
        print(f"{prog}: error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _say_on_rank0() -> Callable[[str], None]:
    rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "0")))

    def say(line: str) -> None:
        if rank == 0:
            print(line, file=sys.stderr)

    return say


def _mode(args: argparse.Namespace) -> tuple[str, str]:
    if "HOROVOD_RANK" in os.environ and "RANK" not in os.environ:
        if args.framework != "horovod":
            raise ValueError("under horovodrun give --framework horovod")
        return "horovodrun", f"horovodrun (HOROVOD_RANK={os.environ['HOROVOD_RANK']})"
    return detect_mode(args.loopback)


def _world_size(args: argparse.Namespace, mode: str) -> int:
    if mode in ("torchrun", "horovodrun"):
        size = int(os.environ["WORLD_SIZE" if mode == "torchrun" else "HOROVOD_SIZE"])
        if args.world_size not in (None, size):
            raise ValueError(f"--world-size {args.world_size} differs from {mode}'s {size} ranks; leave it out")
        return size
    return 8 if args.world_size is None else int(args.world_size)


# --------------------------------------------------------------------------- the figures


def global_losses(record: dict[str, Any]) -> dict[str, list[float]]:
    """Per copy, per step: the mean over the ranks of their batch losses."""
    return {name: [sum(ranks) / len(ranks) for ranks in steps] for name, steps in record["loss_by_rank"].items()}


def time_to_target(losses: list[float], step_s: list[float], target: float | None) -> dict[str, Any]:
    """When the running mean of ``losses`` over :data:`TARGET_WINDOW` steps first reaches ``target``.

    Example::

        time_to_target([2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], 1.25)["time_s"]    # 4.0 (mean 1.25 at step 3)
    """
    smoothed = [
        sum(losses[max(0, s - TARGET_WINDOW + 1) : s + 1]) / (s + 1 - max(0, s - TARGET_WINDOW + 1))
        for s in range(len(losses))
    ]
    best = min(smoothed) if smoothed else None
    out: dict[str, Any] = {"target": target, "window": TARGET_WINDOW, "best_loss": best, "smoothed": smoothed}
    reached = next((s for s, v in enumerate(smoothed) if target is not None and v <= target), None)
    out["reached"] = reached is not None
    out["step"] = reached
    out["time_s"] = sum(step_s[: reached + 1]) if reached is not None else None
    return out


def summarize_one(config: TrainConfig, record: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run of one copy (``--stragglerkit on|off``): what
    :func:`~profiling.lab.train_report.summarize` gives of a side-by-side run, less every
    comparison (no steady-state speedup, no parameter difference)."""
    from profiling.lab.train_report import group_step_times, loop_figures

    (name,) = record["copies"]
    times = group_step_times(record[f"{name}_end_s"], record["block_starts"])
    return {
        **loop_figures(config, record),
        "copies": [name],
        "steady_steps": None,
        "steps": {
            f"{name}_s": times,
            "hook_algorithm": record["algorithms"],
            "rank_map": record["rank_maps"],
            "late_rank": [config.late_rank(s) for s in range(config.steps)],
            "per_rank": {f"{name}_{key}": record[f"{name}_{key}"] for key in ("s", "end_s", "backward_s")},
            "block_starts": record["block_starts"],
        },
        "events": record["events"],
    }


def analyse(config: TrainConfig, record: dict[str, Any], summary: dict[str, Any], rtol: float) -> list[str]:
    """Adds the fine-tuning figures to ``summary``; the broken checks, as sentences."""
    names = list(record.get("copies", ["plain", "hooked"]))
    losses = global_losses(record)
    summary["copies"] = names
    summary["loss"] = {**{name: losses[name] for name in names}, "by_rank": record["loss_by_rank"]}
    summary["loss_rtol"] = rtol
    summary["evaluation"] = record.get("evaluation")
    summary["slowdown"] = record.get("slowdown")
    steps = summary["steps"]
    summary["time_to_target"] = {
        name: time_to_target(losses[name], steps[f"{name}_s"], config.target_loss) for name in names
    }
    summary["total_time_s"] = {name: sum(steps[f"{name}_s"]) for name in names}
    problems = []
    if {"plain", "hooked"} <= set(names):
        plain = losses["plain"]
        summary["loss_max_rel_diff"] = None
        summary["losses_agree"] = True
        for other in (name for name in names if name != "plain"):
            diffs = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(plain, losses[other], strict=True)]
            worst = max(range(len(diffs)), key=diffs.__getitem__) if diffs else None
            largest = summary["loss_max_rel_diff"]
            if worst is not None and (largest is None or diffs[worst] > largest):
                summary["loss_max_rel_diff"] = diffs[worst]
            agree = all(d <= rtol for d in diffs) and all(map(math.isfinite, plain + losses[other]))
            summary["losses_agree"] = summary["losses_agree"] and agree
            if not agree:
                assert worst is not None
                problems.append(
                    f"the {other} copy's loss differs from the plain one's by {diffs[worst]:.3g} (relative) at step "
                    f"{worst}: {losses[other][worst]!r} against {plain[worst]!r}, more than --loss-rtol {rtol:g}"
                )
        reached = summary["time_to_target"]

        def plain_over(other: str) -> float | None:
            if other not in reached or not (reached["plain"]["reached"] and reached[other]["reached"]):
                return None
            return reached["plain"]["time_s"] / reached[other]["time_s"] if reached[other]["time_s"] > 0 else None

        summary["speedup_to_target"] = plain_over("hooked")
        summary["control_speedup_to_target"] = plain_over("control")
    else:
        summary["speedup_to_target"] = None
        (name,) = names
        if not all(map(math.isfinite, losses[name])):
            problems.append(f"the {name} copy's loss is not finite at some step")
    for name in names:
        if not summary[f"{name}_identical_on_all_ranks"]:
            problems.append(f"the {name} copy's parameters differ between the ranks after the last step")
    return problems


_COPY_LABELS = {"plain": "plain", "control": "plain (A/A control)", "hooked": "stragglerkit"}
"""How the figures name the copies."""


def _print_one(summary: dict[str, Any], header: dict[str, Any]) -> None:
    """The headline of a run of one copy (``--stragglerkit on|off``)."""
    config, model = header["config"], summary["model"]
    (name,) = summary["copies"]
    times = summary["steps"][f"{name}_s"]
    print(
        f"# {config['framework']} {'with' if name == 'hooked' else 'without'} stragglerkit, {config['world_size']} "
        f"ranks, {header['mode']} ({header['mode_reason']}); one copy, no comparison (--stragglerkit both compares)"
    )
    print(f"# model: {model['layers']}, {model['gradient_bytes'] / 2**20:.2f} MiB of gradients")
    scenario = summary["scenario"]
    if summary["delay_s"] is not None:
        scenario += f", delay {summary['delay_s'] * 1e3:.1f} ms"
    if summary["fault_step"] is not None:
        scenario += f", from step {summary['fault_step']}"
    half = times[len(times) // 2 :]
    print(f"# scenario: {scenario}; median step time over the second half: {statistics.median(half) * 1e3:.1f} ms")
    if name == "hooked":
        switched = summary["switched_step"]
        print(
            f"# first switch: {'none' if switched is None else f'step {switched}'}; final algorithm: "
            f"{summary['algorithm']}"
        )
    identical = "yes" if summary[f"{name}_identical_on_all_ranks"] else "NO"
    print(f"# parameters identical on all ranks: {identical}")


def _print_finetune(summary: dict[str, Any]) -> None:
    names = summary["copies"]
    if summary.get("loss_max_rel_diff") is not None:
        print(
            f"# losses: the copies agree at every step within {summary['loss_rtol']:g} (largest relative "
            f"difference {summary['loss_max_rel_diff']:.3g}): {'yes' if summary['losses_agree'] else 'NO'}"
        )
    for name in names:
        figures = summary["evaluation"][name] if summary["evaluation"] else {}
        reached = summary["time_to_target"][name]
        if reached["target"] is None:
            target = f"best loss {reached['best_loss']:.4g} (no --target-loss)"
        elif reached["reached"]:
            target = f"target {reached['target']:g} reached at step {reached['step']} after {reached['time_s']:.2f} s"
        else:
            target = f"target {reached['target']:g} not reached in {len(reached['smoothed'])} steps, best loss " + (
                f"{reached['best_loss']:.4g}"
            )
        held_out = ", ".join(f"{k} {v:.4g}" for k, v in figures.items())
        print(f"# {name:>6}: {target}; total {summary['total_time_s'][name]:.2f} s; held-out: {held_out}")
    if summary["speedup_to_target"] is not None:
        control = summary.get("control_speedup_to_target")
        beside = "" if control is None else f"; A/A control: plain / its second copy = {control:.3f}x"
        print(f"# time to target loss: plain / stragglerkit = {summary['speedup_to_target']:.3f}x{beside}")


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, colour in (("plain", "grey"), ("control", "silver"), ("hooked", "tab:blue")):
        if name in summary["copies"]:
            times = list(itertools.accumulate(summary["steps"][f"{name}_s"]))
            axis.plot(times, summary["time_to_target"][name]["smoothed"], color=colour, label=_COPY_LABELS[name])
    target = summary["time_to_target"][summary["copies"][0]]["target"]
    if target is not None:
        axis.axhline(target, color="black", linestyle=":", linewidth=1, label=f"target {target:g}")
    if summary["switched_step"] is not None:
        switched = list(itertools.accumulate(summary["steps"]["hooked_s"]))[summary["switched_step"]]
        axis.axvline(switched, color="tab:blue", linestyle="--", linewidth=1, label="stragglerkit switched")
    axis.set_xlabel("training time (s, the sum of the copy's step times)")
    axis.set_ylabel(f"loss (mean over ranks, running mean of {TARGET_WINDOW} steps)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _log_wandb(summary: dict[str, Any], header: dict[str, Any], run_dir: Path) -> None:
    """The curves, the figures and the plot as one W&B run (offline unless WANDB_MODE says otherwise)."""
    try:
        import wandb
    except ImportError:
        print("--wandb: wandb is not installed (pip install wandb); not logged", file=sys.stderr)
        return
    os.environ.setdefault("WANDB_MODE", "offline")
    run = wandb.init(project="stragglerkit-examples", dir=str(run_dir), config=header["config"])
    names = summary["copies"]
    elapsed = {name: list(itertools.accumulate(summary["steps"][f"{name}_s"])) for name in names}
    for step in range(len(elapsed[names[0]])):
        logged = {}
        for name in names:
            label = _COPY_LABELS[name]
            logged[f"loss/{label}"] = summary["loss"][name][step]
            logged[f"time_s/{label}"] = elapsed[name][step]
            logged[f"step_s/{label}"] = summary["steps"][f"{name}_s"][step]
        run.log(logged, step=step)
    figures = {"speedup_to_target": summary["speedup_to_target"], "speedup_steady": summary.get("speedup_steady")}
    for name in names:
        for key, value in (summary["evaluation"] or {}).get(name, {}).items():
            figures[f"eval/{name}/{key}"] = value
    run.summary.update({k: v for k, v in figures.items() if v is not None})
    run.log({"loss_vs_time": wandb.Image(str(run_dir / "loss_vs_time.png"))})
    run.finish()
    print(f"--wandb: logged to {run_dir}/wandb ({os.environ['WANDB_MODE']})", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

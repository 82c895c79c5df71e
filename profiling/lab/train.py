"""``python -m profiling.lab.train``: does stragglerkit pay off in training, on this cluster?

Runs a short training of a small MLP three times at once, on the same ranks: plain DDP twice (the
second copy is the A/A control, ``--no-control`` leaves it out) and DDP with
``stragglerkit.DDPState`` + ``stragglerkit.ddp_hook`` (``--framework ddp``), or
``hvd.DistributedOptimizer`` and ``stragglerkit.straggler_aware`` (``--framework horovod``, the
ranks started as ``horovodrun --gloo`` starts them: :mod:`.horovod_launch`); or of a small GPT on
megatron-core, its ``DistributedDataParallel`` with and without ``stragglerkit.megatron.install``
(``--framework megatron``: :mod:`.train_megatron`); with the same initial parameters, the same
data and the same injected faults (a persistent straggler that may move, degraded NICs from a
given step, random jitter). Reports the per-step times of each, when the hook detected the fault
and switched, the steady-state speedup beside the control's ratio, and the largest parameter
difference between the plain and the hooked model (:mod:`profiling.lab.train_report`). How the
ranks train: :mod:`.train_worker`.

Where the ranks run is chosen as for the AllReduce bench (:func:`stragglerkit.bench.detect_mode`):
under torchrun, on the emulated cluster, or over loopback. On the emulated cluster ``--degrade``
reshapes the hosts' links at ``--from-step``: rank 0 writes a request file in a control folder,
the launcher (this process, outside the namespaces) reshapes and verifies the links, and answers.

Run from the repository root (``profiling/__init__.py`` says why)::

    python -m profiling.lab.train --world-size 8 --bandwidth 1Gbit --straggler 7 --delay auto --from-step 20

or from Python::

    from profiling.lab.train import run_train
    from profiling.lab.train_config import TrainConfig
    summary = run_train(TrainConfig(world_size=4, mode="loopback", steps=40, straggler=3, delay=0.03))
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from profiling.lab.reshape import Reshaper
from profiling.lab.train_config import FRAMEWORKS, TrainConfig, parse_jitter
from profiling.lab.train_report import print_summary, summarize, write_json
from stragglerkit.bench.config import argument_type, given_options, parse_degrade, parse_delay_option
from stragglerkit.bench.launch import (
    EnvFor,
    LaunchResult,
    Starter,
    by_mode,
    cluster_ranks,
    loopback_ranks,
    run_ranks,
    torchrun_device,
    torchrun_finish,
)
from stragglerkit.bench.results import header_record
from stragglerkit.errors import StragglerKitError
from stragglerkit.units import parse_bandwidth, parse_size

__all__ = ["add_train_arguments", "build_parser", "cmd_train", "main", "run_train"]

SELECTIVE_READS = (
    "--sync",
    "--duration",
    "--compute",
    "--seed",
    "--model-size",
    "--world-size",
    "--bandwidth",
    "--loopback",
    "--timeout",
    "--json",
    "--plot",
)
"""The options that ``--sync selective`` reads; any other is an error there."""
# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m profiling.lab.train``: where the ranks run and the fault, as
    ``stragglerkit bench`` takes them, and the training's own options."""
    parser = argparse.ArgumentParser(
        prog="python -m profiling.lab.train",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        # whole option names only: --degrade is also the start of --degraded-threshold
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--world-size", "-n", type=int, help="number of ranks (default 8; torchrun: WORLD_SIZE)")
    add("--bandwidth", type=argument_type(parse_bandwidth), help="each host's NIC rate (emulated: default 1Gbit)")
    add("--straggler", type=int, metavar="RANK", help="this rank enters every AllReduce late")
    add(
        "--delay",
        type=argument_type(parse_delay_option),
        metavar="MS|auto",
        help="the straggler's delay: milliseconds, a time like 20ms, or auto (default: twice the others' "
        "pre-phase ReduceScatter time, measured before training)",
    )
    add("--degrade", type=argument_type(parse_degrade), action="append", metavar="RANK:L", help="RANK's NIC at 1/L")
    add("--timeout", type=float, default=600.0, help="seconds to wait for the ranks (default 600)")
    add("--json", metavar="FILE", help="write the header and the summary as JSON")
    add("--plot", metavar="FILE.png", help="with --sync selective: plot the loss against time")
    add("--loopback", action="store_true", help="run over loopback even when the emulated cluster works")
    add_train_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, pick where the ranks run (torchrun, emulated cluster, loopback), train, print."""
    from stragglerkit.bench.launch import where_ranks_run
    from stragglerkit.config import Config

    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    try:
        Config.from_env()  # a bad configuration stops here, not in every rank
        mode, why, world_size, bandwidth = where_ranks_run(args.loopback, args.world_size, args.bandwidth)
        return cmd_train(args, given, mode=mode, why=why, world_size=world_size, bandwidth=bandwidth)
    except (ValueError, StragglerKitError) as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2


def add_train_arguments(bench: argparse.ArgumentParser) -> None:
    """The training's options (defaults: TrainConfig's)."""

    checked = argument_type
    group = bench.add_argument_group(
        "training", "a short training with the plain framework and with stragglerkit, side by side"
    )
    group.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        help="ddp: plain DDP against the DDP hook (default); horovod: hvd.DistributedOptimizer against "
        "stragglerkit.straggler_aware, the ranks started as horovodrun --gloo starts them (emulated cluster "
        "or loopback; needs Horovod: bash scripts/install_horovod.sh); megatron: a small GPT on megatron-core's "
        "DistributedDataParallel against the same with --straggler-aware-allreduce (needs megatron-core)",
    )
    group.add_argument("--steps", type=int, help="training steps (default 120)")
    group.add_argument(
        "--from-step",
        type=int,
        metavar="S",
        help="first step of the fault (--straggler, --degrade, --jitter; default 0)",
    )
    group.add_argument(
        "--recover-at",
        type=int,
        metavar="STEP",
        help="with --degrade: from STEP on the degraded NICs run at the full bandwidth again",
    )
    group.add_argument(
        "--reshape-at",
        nargs=2,
        metavar=("STEP", "RANK:L"),
        help="with --degrade: from STEP on RANK's NIC runs at 1/L of the bandwidth (L = 1 restores it; e.g. "
        "--degrade 3:2 --reshape-at 120 3:4 degrades rank 3 further)",
    )
    group.add_argument(
        "--move-straggler-at",
        type=int,
        nargs=2,
        action="append",
        metavar=("STEP", "RANK"),
        help="from STEP on, RANK is the straggler instead (repeatable)",
    )
    group.add_argument(
        "--jitter", type=checked(parse_jitter), metavar="MS", help="every rank is late by uniform[0, MS] each step"
    )
    group.add_argument("--seed", type=int, help="seeds the model, the data and the jitter (default 0)")
    group.add_argument(
        "--model-size", type=checked(parse_size), metavar="SIZE", help="gradient size of the model (default 8MiB)"
    )
    group.add_argument(
        "--batch", type=int, help="samples per rank and step (default 16; megatron: 1 sequence of 32 tokens)"
    )
    group.add_argument("--hook-warmup", type=int, metavar="STEPS", help="the hook's warm-up steps (default 10)")
    group.add_argument(
        "--degraded-threshold",
        type=float,
        metavar="L",
        help="the hook acts on a NIC read at this slowdown or more (default 1.5; e.g. 1.1 for NICs near full "
        "rate, which get the balanced ring)",
    )
    group.add_argument(
        "--steps-per-block",
        type=int,
        metavar="N",
        help="the copies take turns in blocks of N steps; the ranks meet at a barrier only when a block "
        "starts and run free within it, as in training (default 10; 1 = lockstep: a barrier before every step)",
    )
    group.add_argument(
        "--control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also train a second plain copy, the A/A control, taking turns with the other two: how far two "
        "identical copies land apart is this launch's noise (default on; --no-control: a third less time, but a "
        "difference can no longer be told from noise)",
    )
    group.add_argument(
        "--gradient-as-bucket-view",
        action=argparse.BooleanOptionalAction,
        help="every DDP copy with gradient_as_bucket_view (gradients zeroed in place), as the docs recommend "
        "with the hook (default on; --no-gradient-as-bucket-view: DDP's default, where a hook pays an extra "
        "pass to average)",
    )
    group.add_argument(
        "--event-log",
        metavar="DIR",
        help="the hooked copy writes its event log to DIR/events.rank{rank}.jsonl on every rank (a run header, "
        "the decisions, rank 0's per-step measurements); then: stragglerkit report DIR (docs/event_log.md)",
    )
    group.add_argument(
        "--sync",
        choices=("allreduce", "selective"),
        default="allreduce",
        help="allreduce: every step sums the gradients of all ranks (default; the comparison above); selective: "
        "opt-in partial synchronisation, each rank trains its own model and groups of ready ranks average "
        "theirs: selective reduce against partial reduce and all-reduce, with the paper's NIC rates and "
        "compute times (docs/selective.md; it changes what training computes)",
    )
    group.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="with --sync selective: seconds of training per method (default 60)",
    )
    group.add_argument(
        "--compute",
        choices=("transformer", "resnet50"),
        help="with --sync selective: the compute-time distribution of an iteration (default transformer; "
        "docs/selective.md)",
    )


def _reshape(recover_at: int | None, reshape_at: list[str] | None) -> dict[str, Any]:
    """TrainConfig fields for ``--recover-at STEP`` or ``--reshape-at STEP RANK:L`` (one of them)."""
    if recover_at is not None and reshape_at is not None:
        raise ValueError("give either --recover-at or --reshape-at, not both (one link change per run)")
    if reshape_at is None:
        return {"reshape_at": recover_at}
    step_text, nic_text = reshape_at
    try:
        step = int(step_text)
    except ValueError:
        raise ValueError(f"--reshape-at takes STEP RANK:L (e.g. 120 3:4); {step_text!r} is not a step") from None
    rank, slowdown = parse_degrade(nic_text)
    return {"reshape_at": step, "reshape_to": {rank: slowdown}}


def cmd_train(
    args: argparse.Namespace, argv: Sequence[str], *, mode: str, why: str, world_size: int, bandwidth: float | None
) -> int:
    """Build the TrainConfig, run, print; ValueError on bad options."""
    if args.sync == "selective":
        return _cmd_selective(args, argv, mode=mode, why=why, world_size=world_size, bandwidth=bandwidth)
    wrong = given_options(argv, ("--duration", "--compute"))
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: only with --sync selective")
    if given_options(argv, ("--plot",)):
        raise ValueError("--plot: only with --sync selective")
    chosen = {
        "framework": args.framework,
        "steps": args.steps,
        "from_step": args.from_step,
        **_reshape(args.recover_at, args.reshape_at),
        "moves": [tuple(m) for m in args.move_straggler_at] if args.move_straggler_at else None,
        "jitter": args.jitter,
        "seed": args.seed,
        "model_bytes": args.model_size,
        "batch": args.batch,
        "hook_warmup": args.hook_warmup,
        "degraded_threshold": args.degraded_threshold,
        "steps_per_block": args.steps_per_block,
        "gradient_as_bucket_view": args.gradient_as_bucket_view,
        "event_log": event_log_folder(args.event_log),
        "copies": None if args.control else ["plain", "hooked"],
    }
    config = TrainConfig(
        world_size=world_size,
        bandwidth=bandwidth,
        mode=mode,
        straggler=args.straggler,
        delay=args.delay,
        degrade=dict(args.degrade or []),
        timeout=args.timeout,
        **{k: v for k, v in chosen.items() if v is not None},
    )
    if mode != "torchrun" or int(os.environ.get("RANK", "0")) == 0:
        print(f"profiling.lab.train: running {world_size} ranks on {mode}: {why}", file=sys.stderr)
    try:
        run_train(config, why=why, argv=list(argv), json_path=args.json)
    except StragglerKitError as err:
        print(f"profiling.lab.train: error: {err}", file=sys.stderr)
        return 1
    return 0


def _cmd_selective(
    args: argparse.Namespace, argv: Sequence[str], *, mode: str, why: str, world_size: int, bandwidth: float | None
) -> int:
    """``--sync selective``: the three partial-synchronisation methods (:mod:`.train_selective`)."""
    from profiling.lab.train_selective import SelectiveTrainConfig, plot, print_summary, run_selective_train

    known = [arg.split("=")[0] for arg in argv if arg.startswith("--")]
    wrong = sorted({arg for arg in known if arg not in SELECTIVE_READS})
    if wrong:
        raise ValueError(
            f"{', '.join(wrong)}: not read by --sync selective (it reads {', '.join(SELECTIVE_READS)}); leave out"
        )
    if mode == "torchrun":
        raise ValueError("--sync selective starts its own ranks (emulated cluster or loopback); not under torchrun")
    chosen = {"duration": args.duration, "compute": args.compute, "seed": args.seed, "model_bytes": args.model_size}
    config = SelectiveTrainConfig(
        world_size=world_size,
        bandwidth=bandwidth,
        mode=mode,
        timeout=args.timeout,
        **{k: v for k, v in chosen.items() if v is not None},
    )
    print(
        f"profiling.lab.train --sync selective: {world_size} ranks on {mode}: {why}; "
        f"{len(config.methods)} methods x {config.duration:g} s",
        file=sys.stderr,
    )
    try:
        summary = run_selective_train(config)
    except StragglerKitError as err:
        print(f"profiling.lab.train: error: {err}", file=sys.stderr)
        return 1
    print_summary(summary)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(summary, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def event_log_folder(folder: str | None) -> str | None:
    """``--event-log DIR``: the folder, absolute (the ranks may start elsewhere), made now, so that
    a path that cannot be a folder stops the command before any rank starts."""
    if folder is None:
        return None
    path = Path(folder).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"--event-log {folder}: cannot make that folder ({err.strerror})") from None
    return str(path)


def run_train(
    config: TrainConfig, *, why: str = "", argv: list[str] | None = None, json_path: str | None = None, out: Any = None
) -> dict[str, Any] | None:
    """Run, print the summary (to ``out``), write JSON; the summary (None on torchrun ranks > 0)."""
    launched, record = launch_train(config, why)
    if record is None:
        return None
    summary = summarize(config, record)
    header = header_record(config, launched, list(argv or []))
    header["command"] = " ".join(["python", "-m", "profiling.lab.train", *(argv or [])])
    header.pop("alpha_s", None)  # the AllReduce bench's model latency: not used here
    header.pop("model_bandwidth_Bps", None)
    print_summary(summary, header, out=out)
    if json_path:
        write_json(json_path, header, summary)
        print(f"wrote {json_path}", file=out if out is not None else sys.stdout)
    return summary


# --------------------------------------------------------------------------- launching the ranks


def launch_train(config: TrainConfig, why: str = "") -> tuple[LaunchResult, dict[str, Any] | None]:
    """Run the ranks in ``config.mode``; the setting and rank 0's record (None on torchrun ranks > 0)."""
    if config.framework == "megatron":
        import warnings

        from stragglerkit.megatron import check_megatron_core

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron-core's import-time notes on Transformer Engine and Apex
            check_megatron_core()  # a ConfigError naming what to install, before any rank starts
    if config.mode == "horovodrun":
        return _launch_horovodrun(config)
    launched, record = by_mode(
        config.mode,
        "stragglerkit-train-",
        lambda: _launch_torchrun(config),
        lambda workdir: _launch_emulated(config, workdir),
        lambda workdir: _launch_loopback(config, workdir),
    )
    launched.why = why or launched.why
    return launched, record


def _run_ranks(
    config: TrainConfig, workdir: Path, ranks: tuple[Starter, EnvFor], control: Path | None
) -> dict[str, Any]:
    """Start every rank, wait for all, return rank 0's record."""
    config_path, out_path = workdir / "train-config.json", workdir / "train-out.json"
    config_path.write_text(config.to_json(), encoding="utf-8")
    args = [str(config_path), str(out_path), *([str(control)] if control else [])]
    module = "profiling.lab.train_worker"
    run_ranks(config.world_size, config.timeout, module, args, ranks, workdir / "train", f"train, {config.scenario}")
    record: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
    return record


def _launch_loopback(config: TrainConfig, workdir: Path) -> tuple[LaunchResult, dict[str, Any]]:
    if config.framework == "horovod":
        from profiling.lab.horovod_launch import loopback_rendezvous

        rendezvous, start = loopback_rendezvous(config.world_size, workdir)
        with rendezvous:
            record = _run_ranks(config, workdir, rendezvous.ranks(start), None)
    else:
        record = _run_ranks(config, workdir, loopback_ranks(config.world_size), None)
    return LaunchResult(mode="loopback", why=""), record


def _launch_emulated(config: TrainConfig, workdir: Path) -> tuple[LaunchResult, dict[str, Any]]:
    from stragglerkit.testbed import EmulatedCluster

    assert config.bandwidth is not None
    cluster_config = EmulatedCluster.Config(hosts=config.world_size, bandwidth=config.bandwidth)
    control = workdir / "control"
    control.mkdir()
    with EmulatedCluster(cluster_config) as cluster, contextlib.ExitStack() as stack:
        description = cluster.describe()
        if config.framework == "horovod":
            from profiling.lab.horovod_launch import cluster_rendezvous

            rendezvous, start = cluster_rendezvous(cluster, workdir)
            ranks = stack.enter_context(rendezvous).ranks(start)
        else:
            ranks = cluster_ranks(cluster, port=29600)
        if config.degrade:
            again = config.reshaped if config.reshape_at is not None else None
            with Reshaper(cluster, config.degrade, control, again) as reshaper:
                record = _run_ranks(config, workdir, ranks, control)
            description.update(reshaper.measured)
        else:
            record = _run_ranks(config, workdir, ranks, None)
    return LaunchResult(mode="emulated", why="", cluster=description), record


def _launch_torchrun(config: TrainConfig) -> tuple[LaunchResult, dict[str, Any] | None]:
    from profiling.lab.train_worker import train

    backend, device = torchrun_device(config.world_size, timeout=config.timeout)
    record = train(config, device)
    reporter = torchrun_finish()
    return LaunchResult(mode="torchrun", why=backend, is_reporter=reporter), record if reporter else None


def _launch_horovodrun(config: TrainConfig) -> tuple[LaunchResult, dict[str, Any] | None]:
    """This process is one of ``horovodrun``'s ranks (a workload's example under horovodrun)."""
    import horovod.torch as hvd
    import torch
    import torch.distributed as dist

    from profiling.lab.train_worker import train

    hvd.init()
    if hvd.size() != config.world_size:
        raise ValueError(f"--world-size {config.world_size} differs from horovodrun's {hvd.size()} ranks")
    try:
        record = train(config, torch.device("cpu"))
        reporter = hvd.rank() == 0
        dist.barrier()
    finally:
        hvd.shutdown()
        if dist.is_initialized():
            dist.destroy_process_group()
    return LaunchResult(mode="horovodrun", why="gloo", is_reporter=reporter), record if reporter else None


if __name__ == "__main__":
    sys.exit(main())

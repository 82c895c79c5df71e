"""``stragglerkit bench``: measure the algorithms on real ranks (implementation in :mod:`stragglerkit.bench`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from stragglerkit.cli.options import command_parser, unit
from stragglerkit.units import parse_bandwidth, parse_size, parse_time

__all__ = ["add_parser", "cmd_bench"]

_AS_GIVEN = (
    "sizes",
    "dtype",
    "iters",
    "warmup",
    "algorithms",
    "straggler",
    "delay",
    "alpha",
    "tcp_send_buffer",
    "tcp_congestion_control",
    "fair_queueing",
    "tcp_slow_start_after_idle",
    "timeout",
)
"""The options that become :class:`~stragglerkit.bench.BenchConfig` fields of the same name unchanged."""


def cmd_bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from stragglerkit.bench import BenchConfig, run
    from stragglerkit.bench.launch import where_ranks_run
    from stragglerkit.config import Config
    from stragglerkit.errors import StragglerKitError

    Config.from_env()  # a bad configuration file or STRAGGLERKIT_* value stops here, not in every rank
    mode, why, world_size, bandwidth = where_ranks_run(args.loopback, args.world_size, args.bandwidth)
    if args.mode == "calibrate":
        from stragglerkit.bench.calibrate import cmd_calibrate

        return cmd_calibrate(args, list(argv))
    from stragglerkit.bench.calibrate import CALIBRATE_ONLY
    from stragglerkit.bench.config import given_options

    misplaced = given_options(argv, CALIBRATE_ONLY)
    if misplaced:
        raise ValueError(f"{', '.join(misplaced)}: only for --mode calibrate; add --mode calibrate or leave out")
    config = BenchConfig(
        world_size=world_size,
        bandwidth=bandwidth,
        degrade=dict(args.degrade or []),
        mode=mode,
        fault_free_baseline=not args.no_fault_free_baseline,
        **{name: getattr(args, name) for name in _AS_GIVEN},
    )
    if mode != "torchrun" or os_rank() == 0:
        print(f"stragglerkit bench: running {world_size} ranks on {mode}: {why}", file=sys.stderr)
    try:
        run(config, why=why, argv=list(argv), json_path=args.json, plot_path=args.plot)
    except StragglerKitError as err:
        print(f"stragglerkit bench: error: {err}", file=sys.stderr)
        return 1
    return 0


MOVED_TRAIN_MODE = (
    "--mode train left the installed package: the side-by-side training comparison is part of the "
    "repository's benchmarks now; in a checkout, from its root: python -m profiling.lab.train with the same "
    "options (docs/bench.md). To train with stragglerkit on your cluster: examples/bert/train.py"
)
"""What ``--mode train`` says."""


def _mode(text: str) -> str:
    """``--mode``: ``train`` gets where it went instead of argparse's list of choices."""
    if text == "train":
        raise argparse.ArgumentTypeError(MOVED_TRAIN_MODE)
    return text


def os_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def add_parser(sub: Any) -> None:
    """Add ``bench`` to the subcommands ``sub``."""
    from stragglerkit.bench import parse_algorithms, parse_degrade, parse_delay_option, parse_sizes

    bench = command_parser(
        sub,
        "bench",
        # whole option names only, as given_options reads them
        allow_abbrev=False,
        help="measure AllReduce algorithms against gloo on real ranks",
        description="Measure the algorithms on real ranks, nccl-tests style, against the process group's own "
        "all_reduce (gloo), with an optional persistent straggler or degraded NICs. Runs under torchrun when "
        "its environment is set (NCCL on GPUs, gloo on CPUs); otherwise on the emulated cluster (one network "
        "namespace per rank with a shaped NIC; needs root) or, failing that, over loopback.",
        epilog="examples:\n  stragglerkit bench --world-size 8 --bandwidth 1Gbit --sizes 32MiB\n"
        "  stragglerkit bench --sizes 32MiB --algorithms gloo,stragglar --straggler 7 --delay auto\n"
        "  stragglerkit bench --sizes 32MiB --algorithms gloo,ring,optcc --degrade 3:2\n"
        "  stragglerkit bench --mode calibrate --json calibration.json\n"
        "  torchrun --nproc-per-node 8 -m stragglerkit.cli bench --sizes 1MiB..256MiB\n"
        "training, plain and with stragglerkit: examples/bert/train.py, examples/llama/train.py (docs/bench.md)",
    )
    bench.add_argument("--world-size", "-n", type=int, help="number of ranks (default 8; torchrun: WORLD_SIZE)")
    bench.add_argument(
        "--bandwidth",
        type=unit(parse_bandwidth),
        help="each host's NIC rate, e.g. 1Gbit (emulated cluster: shapes the links, default 1Gbit; "
        "elsewhere only for the model's prediction)",
    )
    bench.add_argument(
        "--sizes",
        type=unit(parse_sizes),
        default=parse_sizes("1MiB..32MiB"),
        help="buffer sizes: LOW..HIGH doubling (default 1MiB..32MiB), one size, or a comma list",
    )
    bench.add_argument("--dtype", default="float32", help="float32 (default), float64, bfloat16, float16, int32, int64")
    bench.add_argument("--iters", type=int, default=5, help="timed iterations per case (default 5; median)")
    bench.add_argument("--warmup", type=int, default=2, help="untimed iterations per case first (default 2)")
    bench.add_argument(
        "--algorithms",
        type=unit(parse_algorithms),
        default=parse_algorithms("gloo,ring,rhd,stragglar,optcc"),
        help="comma list; gloo = the group's own all_reduce (baseline), auto = the runtime's choice; "
        "algorithms that do not apply to the scenario are skipped (default gloo,ring,rhd,stragglar,optcc)",
    )
    bench.add_argument("--straggler", type=int, metavar="RANK", help="this rank enters every AllReduce late")
    bench.add_argument(
        "--delay",
        type=unit(parse_delay_option),
        metavar="MS|auto",
        help="the straggler's delay: milliseconds, a time like 20ms, or auto (default: the others' "
        "pre-phase ReduceScatter time, measured in the run)",
    )
    bench.add_argument(
        "--degrade",
        type=unit(parse_degrade),
        action="append",
        metavar="RANK:L",
        help="rank's NIC at 1/L of the bandwidth (emulated cluster: reshaped for real; repeatable)",
    )
    bench.add_argument("--alpha", type=unit(parse_time), help="per-message latency for the model (default measured)")
    bench.add_argument(
        "--tcp-send-buffer",
        type=unit(parse_size),
        metavar="SIZE",
        help="emulated cluster: every host's largest TCP send buffer (net.ipv4.tcp_wmem in its namespace; default: "
        "the kernel's, 4MiB). A send completes once its data is in that buffer (docs/bench.md)",
    )
    bench.add_argument(
        "--tcp-congestion-control",
        metavar="NAME",
        help="emulated cluster: every host's TCP congestion control, e.g. cubic or bbr (default: what this "
        "machine's new namespaces inherit; the JSON header records which ran)",
    )
    bench.add_argument(
        "--tcp-slow-start-after-idle",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="emulated cluster: whether TCP connections idle for longer than their retransmission timeout "
        "restart from a small window (net.ipv4.tcp_slow_start_after_idle in every host; default: the kernel's, on)",
    )
    bench.add_argument(
        "--fair-queueing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="emulated cluster: one queue per peer on every link, served in turn, so that transfers sharing a "
        "link get even shares (default, --no-fair-queueing: one FIFO per link direction; docs/testbed.md)",
    )
    bench.add_argument(
        "--no-fault-free-baseline",
        action="store_true",
        help="with --degrade, skip measuring gloo with every NIC healthy",
    )
    bench.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the ranks (default 600)")
    bench.add_argument("--json", metavar="FILE", help="write the header and rows as JSON")
    bench.add_argument("--plot", metavar="FILE.png", help="plot time against size")
    bench.add_argument("--loopback", action="store_true", help="run over loopback even when the emulated cluster works")
    bench.add_argument(
        "--mode",
        type=_mode,
        choices=("allreduce", "calibrate"),
        default="allreduce",
        help="allreduce (default): the algorithms on buffers; calibrate: every algorithm on a grid, then the cost "
        "models fitted and compared on held-out samples (docs/bench.md)",
    )
    from stragglerkit.bench.calibrate import add_calibrate_arguments

    add_calibrate_arguments(bench)
    bench.set_defaults(func=cmd_bench)

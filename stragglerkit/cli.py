"""The ``stragglerkit`` command line.

``stragglerkit schedule``  builds, checks and prints (or saves) one algorithm's schedule.
``stragglerkit simulate``  predicts AllReduce times of several algorithms on a simulated network.
``stragglerkit bench``     measures them on real ranks: emulated cluster, loopback, or torchrun.

Run ``stragglerkit COMMAND --help`` for the options of each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stragglerkit.errors import NotApplicableError, ScheduleError
from stragglerkit.schedules.check import check
from stragglerkit.schedules.ir import Op, OpKind, Schedule
from stragglerkit.schedules.registry import Situation, generate, names
from stragglerkit.units import format_bytes, format_seconds, parse_bandwidth, parse_size, parse_time

if TYPE_CHECKING:
    from stragglerkit.sim import Network

__all__ = ["main"]


# ---------------------------------------------------------------------------------------------
# argument helpers


def _degrade(text: str) -> tuple[int, float]:
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


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 8,16,256; got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one value")
    return values


def _algorithm_list(text: str) -> list[str]:
    chosen = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in chosen if a not in names()]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"unknown algorithm(s) {unknown}; choose from {', '.join(names())}")
    return chosen


def _unit(parser: Any) -> Any:
    def parse(text: str) -> Any:
        try:
            return parser(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parse


def _situation(args: argparse.Namespace, world_size: int) -> Situation:
    slowdowns = dict(args.degrade or [])
    bad = [rank for rank in slowdowns if not 0 <= rank < world_size]
    if bad:
        raise NotApplicableError(f"--degrade names rank {bad[0]}, which is not a rank of 0..{world_size - 1}")
    if args.straggler is not None and not 0 <= args.straggler < world_size:
        raise NotApplicableError(f"--straggler {args.straggler} is not a rank of 0..{world_size - 1}")
    return Situation(
        world_size=world_size,
        straggler=args.straggler,
        slowdowns=slowdowns,
        segments=args.segments,
        gpus_per_server=args.gpus_per_server,
    )


# ---------------------------------------------------------------------------------------------
# stragglerkit schedule


def _receive_marks(sched: Schedule) -> dict[tuple[int, int], str]:
    """For each receive op: '+' if the data is added, '=' if it overwrites."""
    marks: dict[tuple[int, int], str] = {}
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            if op.kind is OpKind.RECV_REDUCE:
                marks[(rank, index)] = "+"
            elif op.kind is OpKind.RECV:
                mark = "="
                if op.scratch is not None:
                    for later in rank_ops[index + 1 :]:
                        if later.scratch == op.scratch and later.kind in (OpKind.REDUCE, OpKind.COPY):
                            mark = "+" if later.kind is OpKind.REDUCE else "="
                            break
                marks[(rank, index)] = mark
    return marks


def _messages(sched: Schedule) -> list[tuple[int, int, Op, str, int]]:
    """Every message as (src, dst, send op, mark, step-within-phase), in sender program order."""
    marks = _receive_marks(sched)
    recv_queues: dict[tuple[int, int], list[int]] = {}
    for rank, rank_ops in enumerate(sched.ops):
        for index, op in enumerate(rank_ops):
            if op.is_receive:
                assert op.peer is not None
                recv_queues.setdefault((op.peer, rank), []).append(index)
    consumed: dict[tuple[int, int], int] = {}
    messages = []
    for src, rank_ops in enumerate(sched.ops):
        step_in_phase: dict[str, int] = {}
        for op in rank_ops:
            if op.kind is not OpKind.SEND:
                continue
            assert op.peer is not None
            channel = (src, op.peer)
            k = consumed.get(channel, 0)
            consumed[channel] = k + 1
            recv_index = recv_queues.get(channel, [])[k] if k < len(recv_queues.get(channel, [])) else -1
            step = step_in_phase.get(op.phase, 0)
            step_in_phase[op.phase] = step + 1
            messages.append((src, op.peer, op, marks.get((op.peer, recv_index), "?"), step))
    return messages


def render_schedule(sched: Schedule) -> str:
    """The schedule as text, one line per round (or per step of an unrounded phase)."""
    lines = [
        "legend: 'a->b c3+' rank a sends chunk 3 to rank b, which adds it; "
        "'c3=' b stores it (overwrite); 'c0-4' a chunk range"
    ]
    groups: dict[tuple[str, str, int], list[str]] = {}
    for src, dst, op, mark, step in _messages(sched):
        start, stop = op.chunks
        span = f"c{start}" if stop == start + 1 else f"c{start}-{stop - 1}"
        if op.round is not None:
            key = (op.phase, "round", op.round)
        else:
            key = (op.phase, "step", step)
        groups.setdefault(key, []).append(f"{src}->{dst} {span}{mark}")
    width = max((len(f"{phase} {kind} {number}") for phase, kind, number in groups), default=0)
    for (phase, kind, number), transfers in groups.items():
        label = f"{phase or 'main'} {kind} {number}"
        lines.append(f"{label:<{width}} : " + "  ".join(transfers))
    return "\n".join(lines)


def cmd_schedule(args: argparse.Namespace) -> int:
    situation = _situation(args, args.world_size)
    started = time.perf_counter()
    sched = generate(args.algorithm, situation)
    generation_seconds = time.perf_counter() - started
    checked = False
    report = None
    if not args.no_check:
        report = check(sched)
        checked = True
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(sched.to_json())
    if args.summary_json:
        summary = {
            "algorithm": args.algorithm,
            "world_size": args.world_size,
            "rounds": sched.rounds(),
            "checked": checked,
            "generation_seconds": generation_seconds,
        }
        print(json.dumps(summary))
        return 0
    header = (
        f"{sched.algorithm}: world_size={sched.world_size} chunks={sched.num_chunks} rounds={sched.rounds()}"
        + (f" ({sched.round_phase} phase)" if sched.round_phase else "")
        + "".join(f" {key}={value}" for key, value in sched.params.items())
    )
    print(header)
    if report is not None:
        print(f"checked: correct AllReduce ({report.num_ops} ops, {report.num_messages} messages)")
    print(f"generated in {format_seconds(generation_seconds)}")
    if args.json:
        print(f"wrote {args.json}")
    print(render_schedule(sched))
    return 0


# ---------------------------------------------------------------------------------------------
# stragglerkit simulate


def _simulate_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from stragglerkit.sim import auto_delay, simulate

    rows: list[dict[str, Any]] = []
    for n in args.world_sizes:
        situation = _situation(args, n)
        network = _network(situation, args.alpha, args.bandwidth)
        straggler = args.straggler if args.straggler is not None else n - 1
        delay_text = args.delay if args.delay is not None else ("0s" if situation.slowdowns else "auto")
        if delay_text == "auto":
            reference = Situation(world_size=n, straggler=straggler)
            try:
                delay = auto_delay(generate("stragglar", reference), args.size, network)
            except NotApplicableError:  # odd n: hide the pre-phase AllReduce that direct needs
                delay = auto_delay(generate("direct", reference), args.size, network, phase="pre_allreduce")
        else:
            delay = parse_time(delay_text)
        arrivals = [0.0] * n
        arrivals[straggler] = delay
        lower_bound = _optcc_lower_bound(situation, args.size, args.bandwidth) if situation.slowdowns else None
        for algorithm in args.algorithms:
            try:
                sched = generate(algorithm, situation)
            except NotApplicableError as err:
                print(f"note: skipping {algorithm} at n={n}: {err}", file=sys.stderr)
                continue
            result = simulate(sched, args.size, network, arrivals=arrivals)
            row: dict[str, Any] = {
                "algorithm": algorithm,
                "world_size": n,
                "size_bytes": args.size,
                "delay_s": delay,
                "time_s": result.time_from_last_arrival,
                "time_from_first_arrival_s": result.time_from_first_arrival,
            }
            if lower_bound is not None:
                row["lower_bound_s"] = lower_bound
            rows.append(row)
    return rows


def _network(situation: Situation, alpha: float, bandwidth: float) -> Network:
    """Per-GPU NICs; with ``--gpus-per-server g > 1`` servers of g GPUs joined by NVLink (default
    ``(g-1)x`` the NIC), and a degraded GPU's whole server at its slowdown (PXN spreads the loss)."""
    from stragglerkit.sim import Network

    n, g = situation.world_size, situation.gpus_per_server
    slowdowns = dict(situation.slowdowns)
    if g == 1:
        return Network.uniform(n, alpha=alpha, bandwidth=bandwidth, slowdowns=slowdowns)
    if g < 1 or n % g:
        raise NotApplicableError(
            f"--gpus-per-server {g} must divide the world size {n} (ranks v*g..v*g+g-1 form a server)"
        )
    for rank, slowdown in situation.slowdowns.items():
        first = rank // g * g
        for peer in range(first, first + g):
            slowdowns[peer] = max(slowdown, slowdowns.get(peer, 1.0))
    return Network.uniform(n, alpha=alpha, bandwidth=bandwidth, slowdowns=slowdowns, gpus_per_server=g)


def _optcc_lower_bound(situation: Situation, size_bytes: int, bandwidth: float) -> float:
    from stragglerkit.sim import optcc_bounds

    return optcc_bounds.lower_bound(
        situation.world_size, situation.slowdowns, size_bytes / bandwidth, gpus_per_server=situation.gpus_per_server
    )


def _print_simulation_table(rows: list[dict[str, Any]]) -> None:
    baseline = {row["world_size"]: row["time_s"] for row in rows if row["algorithm"] == "ring"}
    has_bound = any("lower_bound_s" in row for row in rows)
    header = f"{'algorithm':<13} {'n':>5} {'size':>9} {'delay':>11} {'time':>12} {'from first':>12} {'vs ring':>8}"
    if has_bound:
        header += f" {'lower bound':>12}"
    print(header)
    for row in rows:
        ring_time = baseline.get(row["world_size"])
        speedup = f"{ring_time / row['time_s']:.3f}x" if ring_time and row["time_s"] > 0 else "-"
        line = (
            f"{row['algorithm']:<13} {row['world_size']:>5} {format_bytes(row['size_bytes']):>9} "
            f"{format_seconds(row['delay_s']):>11} {format_seconds(row['time_s']):>12} "
            f"{format_seconds(row['time_from_first_arrival_s']):>12} {speedup:>8}"
        )
        if has_bound:
            bound = row.get("lower_bound_s")
            line += f" {format_seconds(bound) if bound is not None else '-':>12}"
        print(line)
    print("time: from the last (straggler's) arrival to the last completion; 'from first': from the first arrival")


def _plot_simulation(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for algorithm in dict.fromkeys(row["algorithm"] for row in rows):
        mine = [row for row in rows if row["algorithm"] == algorithm]
        ax.plot([r["world_size"] for r in mine], [r["time_s"] * 1e3 for r in mine], marker="o", label=algorithm)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks (n)")
    ax.set_ylabel("AllReduce time from last arrival (ms)")
    size = format_bytes(rows[0]["size_bytes"]) if rows else ""
    ax.set_title(f"Simulated AllReduce, {size} buffer")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_simulate(args: argparse.Namespace) -> int:
    rows = _simulate_rows(args)
    if args.json == "-":
        print(json.dumps(rows))
    else:
        _print_simulation_table(rows)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump(rows, handle, indent=1)
            print(f"wrote {args.json}")
    if args.plot:
        _plot_simulation(rows, args.plot)
        if args.json != "-":
            print(f"wrote {args.plot}")
    return 0


# ---------------------------------------------------------------------------------------------
# stragglerkit bench (implementation in stragglerkit/bench/)


def cmd_bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from stragglerkit.bench import BenchConfig, detect_mode, run
    from stragglerkit.errors import StragglerKitError
    from stragglerkit.runtime import settings

    settings.check_local()  # a bad STRAGGLERKIT_* value stops here, not in every rank
    mode, why = detect_mode(args.loopback)
    if mode == "torchrun" and args.world_size is not None:
        import os

        if args.world_size != int(os.environ["WORLD_SIZE"]):
            raise ValueError(f"--world-size {args.world_size} differs from torchrun's WORLD_SIZE; leave it out")
    world_size = args.world_size if args.world_size is not None else 8
    if mode == "torchrun":
        import os

        world_size = int(os.environ["WORLD_SIZE"])
    bandwidth = args.bandwidth
    if bandwidth is None and mode == "emulated":
        bandwidth = parse_bandwidth("1Gbit")
    if args.mode == "train":
        from stragglerkit.bench.train import cmd_train

        return cmd_train(args, argv, mode=mode, why=why, world_size=world_size, bandwidth=bandwidth)
    from stragglerkit.bench.train import TRAIN_ONLY, given_options

    wrong = given_options(argv, TRAIN_ONLY)
    if wrong:
        raise ValueError(f"{', '.join(wrong)}: only for --mode train (a DDP training); add --mode train or leave out")
    config = BenchConfig(
        world_size=world_size,
        bandwidth=bandwidth,
        sizes=args.sizes,
        dtype=args.dtype,
        iters=args.iters,
        warmup=args.warmup,
        algorithms=args.algorithms,
        straggler=args.straggler,
        delay=args.delay,
        degrade=dict(args.degrade or []),
        mode=mode,
        alpha=args.alpha,
        tcp_send_buffer=args.tcp_send_buffer,
        tcp_congestion_control=args.tcp_congestion_control,
        fair_queueing=args.fair_queueing,
        tcp_slow_start_after_idle=args.tcp_slow_start_after_idle,
        fault_free_baseline=not args.no_fault_free_baseline,
        timeout=args.timeout,
    )
    if mode != "torchrun" or os_rank() == 0:
        print(f"stragglerkit bench: running {world_size} ranks on {mode}: {why}", file=sys.stderr)
    try:
        run(config, why=why, argv=list(argv), json_path=args.json, plot_path=args.plot)
    except StragglerKitError as err:
        print(f"stragglerkit bench: error: {err}", file=sys.stderr)
        return 1
    return 0


def os_rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def _add_bench_parser(sub: Any) -> None:
    from stragglerkit.bench import parse_algorithms, parse_degrade, parse_delay_option, parse_sizes

    bench = sub.add_parser(
        "bench",
        # whole option names only: --degrade is also the start of --degraded-threshold (train mode)
        allow_abbrev=False,
        help="measure AllReduce algorithms against gloo on real ranks",
        description="Measure the algorithms on real ranks, nccl-tests style, against the process group's own "
        "all_reduce (gloo), with an optional persistent straggler or degraded NICs. Runs under torchrun when "
        "its environment is set (NCCL on GPUs, gloo on CPUs); otherwise on the emulated cluster (one network "
        "namespace per rank with a shaped NIC; needs root) or, failing that, over loopback.",
        epilog="examples:\n  stragglerkit bench --world-size 8 --bandwidth 1Gbit --sizes 32MiB\n"
        "  stragglerkit bench --sizes 32MiB --algorithms gloo,stragglar --straggler 7 --delay auto\n"
        "  stragglerkit bench --sizes 32MiB --algorithms gloo,ring,optcc --degrade 3:2\n"
        "  stragglerkit bench --mode train --straggler 7 --delay auto --from-step 20 --steps 120\n"
        "  torchrun --nproc-per-node 8 -m stragglerkit.cli bench --sizes 1MiB..256MiB",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("--world-size", "-n", type=int, help="number of ranks (default 8; torchrun: WORLD_SIZE)")
    bench.add_argument(
        "--bandwidth",
        type=_unit(parse_bandwidth),
        help="each host's NIC rate, e.g. 1Gbit (emulated cluster: shapes the links, default 1Gbit; "
        "elsewhere only for the model's prediction)",
    )
    bench.add_argument(
        "--sizes",
        type=_unit(parse_sizes),
        default=parse_sizes("1MiB..32MiB"),
        help="buffer sizes: LOW..HIGH doubling (default 1MiB..32MiB), one size, or a comma list",
    )
    bench.add_argument("--dtype", default="float32", help="float32 (default), float64, bfloat16, float16, int32, int64")
    bench.add_argument("--iters", type=int, default=5, help="timed iterations per case (default 5; median)")
    bench.add_argument("--warmup", type=int, default=2, help="untimed iterations per case first (default 2)")
    bench.add_argument(
        "--algorithms",
        type=_unit(parse_algorithms),
        default=parse_algorithms("gloo,ring,rhd,stragglar,optcc"),
        help="comma list; gloo = the group's own all_reduce (baseline), auto = the runtime's choice; "
        "algorithms that do not apply to the scenario are skipped (default gloo,ring,rhd,stragglar,optcc)",
    )
    bench.add_argument("--straggler", type=int, metavar="RANK", help="this rank enters every AllReduce late")
    bench.add_argument(
        "--delay",
        type=_unit(parse_delay_option),
        metavar="MS|auto",
        help="the straggler's delay: milliseconds, a time like 20ms, or auto (default: the others' "
        "pre-phase ReduceScatter time, measured in the run; --mode train: twice that)",
    )
    bench.add_argument(
        "--degrade",
        type=_unit(parse_degrade),
        action="append",
        metavar="RANK:L",
        help="rank's NIC at 1/L of the bandwidth (emulated cluster: reshaped for real; repeatable)",
    )
    bench.add_argument("--alpha", type=_unit(parse_time), help="per-message latency for the model (default measured)")
    bench.add_argument(
        "--tcp-send-buffer",
        type=_unit(parse_size),
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
        choices=("allreduce", "train"),
        default="allreduce",
        help="allreduce (default): the algorithms on buffers; train: a short DDP training, plain and with the "
        "stragglerkit hook, side by side (docs/bench.md)",
    )
    from stragglerkit.bench.train import add_train_arguments

    add_train_arguments(bench)
    bench.set_defaults(func=cmd_bench)


# ---------------------------------------------------------------------------------------------
# parser


def _add_situation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--straggler",
        type=int,
        metavar="RANK",
        help="rank of the persistent straggler (StragglAR/direct put it at logical rank n-1; default n-1)",
    )
    parser.add_argument(
        "--degrade",
        type=_degrade,
        action="append",
        metavar="RANK:L",
        help="a degraded rank whose NIC runs at 1/L of the bandwidth (repeatable), e.g. --degrade 3:2.0",
    )
    parser.add_argument("--segments", type=int, default=64, help="OptCC pipeline segments k (default 64)")
    parser.add_argument(
        "--gpus-per-server",
        type=int,
        default=1,
        help="GPUs per server (default 1): ranks v*g..v*g+g-1 share a server, talk over NVLink, and a degraded "
        "rank degrades its whole server (PXN); OptCC plans on the servers",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stragglerkit",
        description="Straggler-aware AllReduce: build and check schedules, simulate them.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sched = sub.add_parser(
        "schedule",
        help="build, check and print one algorithm's schedule",
        description="Build an AllReduce schedule, prove it correct with the symbolic checker, and print it "
        "round by round (who sends which chunk to whom).",
        epilog="examples:\n  stragglerkit schedule stragglar --world-size 8\n"
        "  stragglerkit schedule ring --world-size 16 --summary-json\n"
        "  stragglerkit schedule stragglar --world-size 256 --straggler 5 --json s.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sched.add_argument("algorithm", choices=names(), help="which algorithm")
    sched.add_argument("--world-size", "-n", type=int, required=True, help="number of ranks")
    _add_situation_options(sched)
    sched.add_argument("--json", metavar="FILE", help="also save the schedule as JSON (versioned format)")
    sched.add_argument(
        "--summary-json",
        action="store_true",
        help="print only one JSON object: algorithm, world_size, rounds, checked, generation_seconds",
    )
    sched.add_argument("--no-check", action="store_true", help="skip the symbolic checker (large n)")
    sched.set_defaults(func=cmd_schedule)

    sim = sub.add_parser(
        "simulate",
        help="predict AllReduce times on a simulated network",
        description="Simulate algorithms on a network of per-rank NICs (flow level, max-min fair sharing) "
        "with a late straggler and/or degraded NICs, and compare them with ring.",
        epilog="example (the StragglAR paper's analytic comparison):\n"
        "  stragglerkit simulate --algorithms ring,rhd,stragglar --world-sizes 8,16,256 "
        "--size 1GiB --alpha 3us --bandwidth 450GB/s",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument(
        "--algorithms", type=_algorithm_list, default=["ring", "rhd", "stragglar"], help="comma-separated list"
    )
    sim.add_argument("--world-sizes", type=_int_list, default=[8, 16, 256], help="comma-separated, e.g. 8,16,256")
    sim.add_argument("--size", type=_unit(parse_size), default=parse_size("1GiB"), help="buffer size (default 1GiB)")
    sim.add_argument("--alpha", type=_unit(parse_time), default=parse_time("3us"), help="per-message latency")
    sim.add_argument(
        "--bandwidth", type=_unit(parse_bandwidth), default=parse_bandwidth("450GB/s"), help="per-rank NIC bandwidth"
    )
    sim.add_argument(
        "--delay",
        metavar="auto|TIME",
        help="straggler delay: 'auto' (arrives as the others finish StragglAR's pre-phase) or a time like 5ms; "
        "default auto, or 0 when --degrade is given",
    )
    _add_situation_options(sim)
    sim.add_argument("--json", metavar="FILE|-", help="write the rows as JSON ('-' prints only JSON on stdout)")
    sim.add_argument("--plot", metavar="FILE.png", help="plot time against n")
    sim.set_defaults(func=cmd_simulate)
    _add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
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
    return code


if __name__ == "__main__":
    sys.exit(main())

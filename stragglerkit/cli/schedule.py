"""``stragglerkit schedule``: build one algorithm's schedule, check it, and print (or save) it."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from stragglerkit.cli.options import add_situation_options, command_parser, situation_from_args, unit
from stragglerkit.schedules.check import check
from stragglerkit.schedules.ir import Op, OpKind, Schedule
from stragglerkit.schedules.pattern import (
    FULL_CHECK_MAX_RANKS,
    PATTERNS,
    balanced_ring_flows,
    prove_rounds,
    prove_slices,
    round_flows,
)
from stragglerkit.schedules.registry import Situation, generate, names, why_not
from stragglerkit.units import format_seconds, parse_size

__all__ = ["add_parser", "cmd_schedule", "render_schedule"]


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


def _pattern_summary(args: argparse.Namespace, situation: Situation) -> dict[str, Any] | None:
    """The summary from the closed-form rounds and their pattern proof (schedules/pattern.py), for
    world sizes above the full checker's; ``None`` where the full path applies."""
    n = args.world_size
    if args.algorithm not in PATTERNS or n <= FULL_CHECK_MAX_RANKS or args.json:
        return None
    reason = why_not(args.algorithm, situation)
    if reason is not None:
        return None  # generate() raises the full error message
    relabel = None
    straggler = situation.straggler
    if args.algorithm in ("stragglar", "direct") and straggler is not None and straggler != n - 1:
        relabel = list(range(n))
        relabel[n - 1], relabel[straggler] = straggler, n - 1
    started = time.perf_counter()
    num_chunks, round_phase, rounds = round_flows(args.algorithm, n, relabel)
    listed = list(rounds)
    generated = time.perf_counter()
    if args.no_check:
        tags = {(f.phase, f.round) for f in listed if round_phase is None or f.phase == round_phase}
        rounds_count, proof = len(tags), "none"
    else:
        rounds_count, proof = prove_rounds(args.algorithm, n, num_chunks, round_phase, listed).rounds, "pattern"
    return {
        "algorithm": args.algorithm,
        "world_size": n,
        "rounds": rounds_count,
        "checked": proof == "pattern",
        "proof": proof,
        "generation_seconds": generated - started,
        "proof_seconds": time.perf_counter() - generated,
    }


def _balanced_ring_summary(args: argparse.Namespace, situation: Situation) -> dict[str, Any] | None:
    """The balanced ring's summary from its slices (the ring's messages on each slice's chunks) and
    the slice proof (``pattern.prove_slices``) above the full checker's world sizes; ``None`` where
    the full path applies."""
    from stragglerkit.schedules.balanced_ring import balanced_shares, default_slices, per_rank_slowdowns

    n = args.world_size
    if args.algorithm != "balanced_ring" or n <= FULL_CHECK_MAX_RANKS or args.json:
        return None
    if why_not("balanced_ring", situation) is not None:
        return None  # generate() raises the full error message
    started = time.perf_counter()
    slices = default_slices(balanced_shares(per_rank_slowdowns(n, situation.slowdowns)))
    flows = balanced_ring_flows(n, slices)  # streamed into the proof: generated as it is proved
    generated = time.perf_counter()
    if not args.no_check:
        prove_slices("balanced_ring", n, slices, flows)
    return {
        "algorithm": "balanced_ring",
        "world_size": n,
        "rounds": 0,
        "slices": slices,
        "checked": not args.no_check,
        "proof": "none" if args.no_check else "pattern",
        "generation_seconds": generated - started,
        "proof_seconds": time.perf_counter() - generated,
    }


OPTCC_FULL_CHECK_MAX_MESSAGES = 40_000
"""Up to about this many messages (``2kq²``) ``schedule optcc --summary-json`` runs the full checker
(about a second); above, the window proof (p = 64, k = 64: 20 s against 0.1 s)."""


def _optcc_summary(args: argparse.Namespace, situation: Situation) -> dict[str, Any] | None:
    """OptCC's summary from its closed-form plan and the window proof (schedules/optcc_proof.py)
    above :data:`OPTCC_FULL_CHECK_MAX_MESSAGES`; ``None`` where the full path applies (or the
    window proof does not: several degraded ranks, several GPUs per server)."""
    from stragglerkit.schedules.optcc import optcc_plan_for
    from stragglerkit.schedules.optcc_proof import prove_optcc

    n = args.world_size
    if args.algorithm != "optcc" or args.json or why_not("optcc", situation) is not None:
        return None
    started = time.perf_counter()
    plan = optcc_plan_for(situation)
    if plan is None or plan.num_chunks * 2 * plan.q <= OPTCC_FULL_CHECK_MAX_MESSAGES:
        return None  # small enough for the full checker (about a second)
    generated = time.perf_counter()
    proof = "none" if args.no_check else "windows"
    if not args.no_check:
        prove_optcc(plan)
    return {
        "algorithm": "optcc",
        "world_size": n,
        "rounds": 0,
        "windows": plan.num_windows,
        "checked": proof == "windows",
        "proof": proof,
        "generation_seconds": generated - started,
        "proof_seconds": time.perf_counter() - generated,
    }


def cmd_schedule(args: argparse.Namespace) -> int:
    situation = situation_from_args(args, args.world_size, args.size)
    if args.summary_json:
        fast = (
            _pattern_summary(args, situation)
            or _optcc_summary(args, situation)
            or _balanced_ring_summary(args, situation)
        )
        if fast is not None:
            print(json.dumps(fast))
            return 0
    started = time.perf_counter()
    sched = generate(args.algorithm, situation)
    generation_seconds = time.perf_counter() - started
    checked = False
    report = None
    proof_seconds = 0.0
    if not args.no_check:
        started = time.perf_counter()
        report = check(sched)
        proof_seconds = time.perf_counter() - started
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
            "proof": "full" if checked else "none",
            "generation_seconds": generation_seconds,
            "proof_seconds": proof_seconds,
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


HELP = {
    "help": "build, check and print one algorithm's schedule",
    "description": "Build an AllReduce schedule, prove it correct with the symbolic checker, and print it "
    "round by round (who sends which chunk to whom).",
    "epilog": "examples:\n  stragglerkit schedule stragglar --world-size 8\n"
    "  stragglerkit schedule ring --world-size 16 --summary-json\n"
    "  stragglerkit schedule stragglar --world-size 256 --straggler 5 --json s.json",
}
"""The command's help, description and examples."""


def add_parser(sub: Any) -> None:
    """Add ``schedule`` to the subcommands ``sub``."""
    sched = command_parser(sub, "schedule", **HELP)
    sched.add_argument("algorithm", choices=names(), help="which algorithm")
    sched.add_argument("--world-size", "-n", type=int, required=True, help="number of ranks")
    sched.add_argument(
        "--size",
        type=unit(parse_size),
        default=parse_size("32MiB"),
        help="bucket size whose plan to show (default 32MiB; OptCC's segments and sizes depend on it)",
    )
    add_situation_options(sched)
    sched.add_argument("--json", metavar="FILE", help="also save the schedule as JSON (versioned format)")
    sched.add_argument(
        "--summary-json",
        action="store_true",
        help="print only one JSON object: algorithm, world_size, rounds, checked, proof (full: the "
        "symbolic checker on the op list; pattern: the closed-form rounds proved without one, for ring, "
        "rhd, direct and stragglar above 64 ranks; windows: OptCC's timetable proved window by window "
        "above 40,000 messages, one degraded rank; none), generation_seconds, proof_seconds",
    )
    sched.add_argument("--no-check", action="store_true", help="skip the correctness proof")
    sched.set_defaults(func=cmd_schedule)

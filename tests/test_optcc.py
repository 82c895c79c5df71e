"""OptCC schedules: symbolic correctness, the timetable's one-flow-per-NIC rule, bad input."""

from __future__ import annotations

import dataclasses
import re

import pytest

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules import check
from stragglerkit.schedules import optcc as optcc_module
from stragglerkit.schedules.ir import Op, OpKind, Schedule, ScheduleBuilder
from stragglerkit.schedules.optcc import optcc, optcc_plan, timetable_text
from stragglerkit.schedules.registry import Situation, generate

SLOWDOWNS = [1.14, 1.33, 1.5, 2.0, 3.0, 4.0]

# every p in 3..64 appears, every l with several p, every k with several p (the checker is O(p^2 k))
SINGLE_CASES = [
    (p, SLOWDOWNS[p % 6], (4, 8, 16, 64)[p % 4] if p <= 12 else (4 if p > 24 else (4, 8)[p % 2])) for p in range(3, 65)
]


@pytest.mark.parametrize(("p", "slowdown", "k"), SINGLE_CASES)
def test_single_straggler_passes_the_checker(p: int, slowdown: float, k: int) -> None:
    straggler = (3 * p + 1) % p
    sched = optcc(p, {straggler: slowdown}, segments=k)
    report = check(sched)
    plan = optcc_plan(p, {straggler: slowdown}, segments=k)
    q = p - 1
    # every section makes 2(q-1) ring hops plus an upload and a download; fills: q up, q down
    assert report.num_messages == k * q * (2 * (q - 1) + 2) + 2 * q * plan.num_fills
    assert sched.num_chunks == k * q + plan.num_fills


# several stragglers: every m in 1..3, every l, every k, p from 5 to 64
MULTI_CASES = [
    (4, {0: 2.0, 3: 1.5}, 8),
    (5, {0: 1.14, 3: 1.33}, 4),
    (6, {0: 1.5, 2: 1.5, 4: 3.0}, 4),
    (6, {1: 2.0, 4: 4.0}, 8),
    (7, {0: 1.5, 1: 1.5, 2: 1.5}, 4),
    (9, {2: 3.0, 5: 1.14, 8: 2.0}, 16),
    (13, {12: 1.33, 0: 4.0}, 64),
    (24, {3: 1.5, 7: 2.0, 20: 3.0}, 4),
    (40, {0: 1.14, 39: 1.14}, 4),
    (64, {10: 2.0, 30: 1.33, 50: 4.0}, 4),
]


@pytest.mark.parametrize(("p", "slowdowns", "k"), MULTI_CASES)
def test_several_stragglers_pass_the_checker(p: int, slowdowns: dict[int, float], k: int) -> None:
    sched = optcc(p, slowdowns, segments=k)
    report = check(sched)
    m, q = len(slowdowns), p - len(slowdowns)
    # ring hops, the detour through the slowest straggler, and one exchange each way per other straggler
    assert report.num_messages == k * q * (2 * (q - 1) + 2 + 2 * (m - 1))
    assert sched.params["straggler"] == max(slowdowns, key=lambda r: (slowdowns[r], -r))
    for rank in slowdowns:  # each straggler moves exactly the buffer out and the buffer in
        sent = sum(1 for _, _, op in sched.iter_ops() if op.kind is OpKind.SEND and op.peer == rank)
        received = sum(1 for r, _, op in sched.iter_ops() if r == rank and op.kind is OpKind.SEND)
        assert sent == received == k * q


@pytest.mark.parametrize("slowdown", SLOWDOWNS)
@pytest.mark.parametrize("k", [1, 2, 3, 64])
def test_every_slowdown_and_depth_on_a_small_ring(slowdown: float, k: int) -> None:
    check(optcc(6, {4: slowdown}, segments=k))


def _sends_and_receives_are_chained(sched: Schedule) -> None:
    for rank, ops in enumerate(sched.ops):
        last: dict[str, int | None] = {"send": None, "recv": None}
        for index, op in enumerate(ops):
            if not op.is_comm:
                continue
            side = "send" if op.kind is OpKind.SEND else "recv"
            if last[side] is not None:
                assert last[side] in op.depends, f"rank {rank} op {index} does not wait for its previous {side}"
            last[side] = index


@pytest.mark.parametrize(("p", "slowdown"), [(3, 2.0), (7, 1.5), (12, 3.0)])
def test_each_nic_runs_one_flow_per_direction_at_a_time(p: int, slowdown: float) -> None:
    _sends_and_receives_are_chained(optcc(p, {1: slowdown}, segments=8))


@pytest.mark.parametrize("orderings", [1, 2])
@pytest.mark.parametrize(("p", "slowdown"), [(3, 1.5), (5, 2.0), (9, 1.14), (16, 4.0)])
def test_timetable_windows_respect_the_gap(p: int, slowdown: float, orderings: int) -> None:
    plan = optcc_plan(p, {p - 1: slowdown}, segments=6, orderings=orderings)
    q, h, s = plan.q, plan.healthy, plan.straggler
    for window in range(plan.num_windows):
        gap = window % q
        per_edge: dict[tuple[int, int], list[str]] = {}
        for flow in plan.flows(window):
            if flow.dst == s:
                assert flow.src == h[gap], f"window {window}: {flow} uploads from a rank other than h_{gap}"
            elif flow.src == s:
                assert flow.dst == h[(gap + 1) % q], f"window {window}: {flow} downloads to the wrong rank"
            else:
                assert h.index(flow.dst) == (h.index(flow.src) + 1) % q, f"{flow} is not a ring edge"
                assert flow.src != h[gap], f"window {window}: the uploader also sends on the ring"
                per_edge.setdefault((flow.src, flow.dst), []).append(flow.stage)
        for edge, stages in per_edge.items():
            assert sorted(stages) in (["allgather"], ["reduce_scatter"], ["allgather", "reduce_scatter"]), (
                f"window {window}: edge {edge} carries {stages}"
            )


@pytest.mark.parametrize(("p", "slowdown"), [(3, 1.5), (7, 1.5), (9, 3.0)])
@pytest.mark.parametrize("orderings", [1, 2])
def test_direct_dependencies_equal_the_builders(p: int, slowdown: float, orderings: int) -> None:
    """The lowering derives data dependencies itself; they must be what ScheduleBuilder derives."""
    plan = optcc_plan(p, {2: slowdown}, segments=5, orderings=orderings)
    whole = plan.lower()
    builder = ScheduleBuilder(p, plan.num_chunks)
    for rank in range(p):
        assert plan.rank_ops(rank) == whole.ops[rank]
        last: dict[OpKind, int | None] = {OpKind.SEND: None}
        for op in whole.ops[rank]:
            side = OpKind.SEND if op.kind is OpKind.SEND else OpKind.RECV
            previous = last.get(side)
            extra = () if previous is None else (previous,)
            last[side] = builder.add(rank, Op(op.kind, op.chunks, op.peer, None, extra, None, op.phase))
        assert builder.ops[rank] == whole.ops[rank]


def test_docstring_example_is_the_real_timetable() -> None:
    doc = optcc_module.__doc__ or ""
    block = doc.split("as printed by")[1].split("::\n\n")[1].split("\n\n")[0]
    shown = "\n".join(line[4:] for line in block.splitlines())
    assert shown == timetable_text(optcc_plan(5, {0: 2.0}, segments=2), range(14))


@pytest.mark.parametrize(("slowdown", "ratio"), [(8 / 7, 3 / 4), (1.5, 1 / 3), (4 / 3, 1 / 2), (2.0, 0.0), (3.0, 0.0)])
def test_fill_size_fills_the_straggler_bubble(slowdown: float, ratio: float) -> None:
    plan = optcc_plan(8, {0: slowdown})
    assert plan.fill_weight / plan.section_weight == pytest.approx(ratio)


def test_registry_builds_optcc_for_the_degraded_rank() -> None:
    sched = generate("optcc", Situation(world_size=6, slowdowns={3: 2.0}, segments=4))
    check(sched)
    assert sched.params["straggler"] == 3
    # the straggler moves exactly one section in and out per section of data
    to_straggler = sum(1 for _, _, op in sched.iter_ops() if op.kind is OpKind.SEND and op.peer == 3)
    assert to_straggler == 4 * 5


@pytest.mark.parametrize(
    ("args", "error", "pattern"),
    [
        ((2, {0: 2.0}), NotApplicableError, "at least 3 ranks"),
        ((5, {}), NotApplicableError, "at least one degraded rank"),
        ((5, {1: 1.0}), NotApplicableError, "at least one degraded rank"),
        ((5, {7: 2.0}), ValueError, "not a rank"),
        ((5, {1: 0.5}), ValueError, "must be a finite number >= 1"),
        ((5, {1: float("nan")}), ValueError, "must be a finite number >= 1"),
        ((5, {0: 2.0, 1: 2.0, 2: 2.0}), NotApplicableError, "as many healthy ranks (servers) as degraded ones"),
        ((6, {0: 2.0}, 64, 3), NotApplicableError, "at least 3 servers"),
    ],
)
def test_bad_input_is_rejected_clearly(args: tuple, error: type, pattern: str) -> None:
    with pytest.raises(error, match=re.escape(pattern)):
        optcc(*args)


def test_bad_segments_and_servers_are_rejected() -> None:
    with pytest.raises(ValueError, match="segments"):
        optcc(5, {1: 2.0}, segments=0)
    with pytest.raises(ValueError, match="divisor"):
        optcc(6, {1: 2.0}, gpus_per_server=4)


# several GPUs per server: every g in {2, 4, 8}, one or two degraded servers, every l
SERVER_CASES = [
    (6, 2, {2: 2.0, 3: 2.0}, 4),
    (8, 2, {0: 1.14}, 64),
    (12, 4, {4: 1.5, 5: 1.5, 6: 1.5, 7: 1.5}, 8),
    (16, 4, {15: 3.0}, 16),
    (24, 8, {8: 1.33}, 4),
    (48, 8, {0: 4.0, 47: 1.5}, 4),
    (40, 2, {2: 1.5, 9: 2.0, 21: 1.14}, 4),
]


@pytest.mark.parametrize(("p", "g", "slowdowns", "k"), SERVER_CASES)
def test_multi_gpu_servers_pass_the_checker(p: int, g: int, slowdowns: dict[int, float], k: int) -> None:
    sched = optcc(p, slowdowns, segments=k, gpus_per_server=g)
    check(sched)
    assert sched.params["gpus_per_server"] == g
    # every inter-server flow pairs GPUs with the same local index; NVLink flows stay in the server
    for rank, index, op in sched.iter_ops():
        if op.is_comm and op.peer is not None and op.peer // g != rank // g:
            assert op.peer % g == rank % g, f"rank {rank} op {index} crosses servers between GPU lanes"
    # NIC and NVLink sends/receives each form one chain per rank
    for rank, ops in enumerate(sched.ops):
        last: dict[tuple[bool, bool], int] = {}
        for index, op in enumerate(ops):
            if not op.is_comm:
                continue
            key = (op.peer is not None and op.peer // g == rank // g, op.kind is OpKind.SEND)
            if key in last:
                assert last[key] in op.depends, f"rank {rank} op {index} does not wait for op {last[key]}"
            last[key] = index


# second stage ordering (S3 -> S1 -> S4 -> S2) on odd segments: every l, small and mid p, both k
SECOND_ORDERING_CASES = [(p, SLOWDOWNS[p % 6], (4, 8)[p % 2], 1) for p in range(3, 17)] + [
    (12, 1.5, 4, 2),
    (16, 2.0, 8, 4),
    (24, 1.14, 4, 2),
]


@pytest.mark.parametrize(("p", "slowdown", "k", "g"), SECOND_ORDERING_CASES)
def test_second_ordering_passes_the_checker(p: int, slowdown: float, k: int, g: int) -> None:
    degraded = {r: slowdown for r in range(g, 2 * g)}
    sched = optcc(p, degraded, segments=k, gpus_per_server=g, orderings=2)
    check(sched)
    assert sched.params["orderings"] == 2


@pytest.mark.parametrize(("p", "slowdown"), [(5, 2.0), (7, 1.5), (9, 3.0)])
def test_second_ordering_runs_s3_first_on_odd_segments(p: int, slowdown: float) -> None:
    """Odd segments: S sends its own value (S3) before the S1 chain passes, the chain's owner ends
    with the global sum and sends it to S last (S2, not added); even segments keep S1->S2->S3->S4."""
    plan = optcc_plan(p, {0: slowdown}, segments=4, orderings=2)
    q = plan.q
    seen: dict[int, dict[str, list[tuple[int, int, int]]]] = {}
    for window in range(plan.num_windows):
        for flow in plan.flows(window):
            if flow.chunk < plan.segments * q:
                seen.setdefault(flow.chunk, {}).setdefault(flow.stage, []).append((window, flow.src, flow.dst))
    for chunk, stages in seen.items():
        owner = plan.healthy[chunk % q]
        if (chunk // q) % 2 == 0:
            assert set(stages) == {"reduce_scatter", "upload", "download", "allgather"}
            continue
        assert set(stages) == {"raw_down", "reduce_scatter", "allgather", "final_up"}
        ((raw_window, _, raw_rank),) = stages["raw_down"]
        ((final_window, final_src, _),) = stages["final_up"]
        hops = sorted(stages["reduce_scatter"])
        assert len(hops) == q - 1 and hops[-1][2] == owner and final_src == owner
        assert raw_rank in {dst for _, _, dst in hops}  # S's value joins the chain ...
        assert all(w > raw_window for w, src, _ in hops if src == raw_rank)  # ... before it moves on
        assert final_window > hops[-1][0]
        gathers = sorted(stages["allgather"])
        assert len(gathers) == q - 1 and gathers[0][1] == owner  # S4 starts at the owner
        assert {dst for _, _, dst in gathers} == set(plan.healthy) - {owner}
    ops = plan.rank_ops(plan.straggler)
    kinds = {op.phase: op.kind for op in ops}
    assert kinds["final_up"] is OpKind.RECV and kinds["upload"] is OpKind.RECV_REDUCE


def test_second_ordering_needs_one_degraded_rank() -> None:
    with pytest.raises(NotApplicableError, match="one degraded rank"):
        optcc(16, {0: 2.0, 8: 1.5}, orderings=2)
    with pytest.raises(ValueError, match="orderings must be 1"):
        optcc(16, {0: 2.0}, orderings=3)


@pytest.mark.parametrize(
    ("p", "slowdown", "k"), [(3, 1.14, 2), (5, 1.5, 4), (8, 1.97, 3), (8, 8 / 7, 9), (11, 1.33, 5)]
)
def test_without_bubble_filling_the_l_below_2_plan_has_no_fills_and_is_correct(p: int, slowdown: float, k: int) -> None:
    straggler = p // 2
    plan = optcc_plan(p, {straggler: slowdown}, segments=k, bubble_filling=False)
    assert plan.fill_weight == 0 and plan.num_fills == 0 and plan.slowdown == slowdown
    sched = optcc(p, {straggler: slowdown}, segments=k, bubble_filling=False)
    report = check(sched)
    q = p - 1
    assert report.num_messages == k * q * (2 * (q - 1) + 2)
    # the same timetable as l >= 2 (what is sent when does not depend on l there)
    assert sched.num_chunks == optcc(p, {straggler: 2.0}, segments=k).num_chunks == k * q
    with_fills = optcc_plan(p, {straggler: slowdown}, segments=k)
    assert with_fills.num_fills == k  # the default still fills, as the paper does
    built = generate(
        "optcc", Situation(world_size=p, slowdowns={straggler: slowdown}, segments=k, bubble_filling=False)
    )
    assert built.num_chunks == k * q


def test_the_runtime_fills_only_where_the_simulator_says_it_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    from stragglerkit.planner import policy
    from stragglerkit.planner.policy import BUBBLE_FILLING_MIN_GAIN, optcc_bubble_filling, optcc_situation
    from stragglerkit.sim.simulator import Network, simulate

    assert policy.OPTCC_SIZING == "auto"  # the runtime's sizing
    monkeypatch.setattr(policy, "OPTCC_SIZING", "closed_form")
    # shallow pipelines and l near 2: the fills' head and tail cost more than the bubbles they fill
    assert not optcc_bubble_filling(8, {3: 1.97}, segments=9)
    assert not optcc_bubble_filling(8, {3: 1.5}, segments=3)
    # no gain against the ramped plan (measured before the ramp, the fills cost 5 % there): no fills
    assert not optcc_bubble_filling(8, {3: 8 / 7}, segments=9)
    # against the plan without fills and with its ramp: 0.7 % at k = 18 (below the margin), 1.9 %
    # at k = 36, far below l = 2
    assert not optcc_bubble_filling(8, {3: 8 / 7}, segments=18)
    assert optcc_bubble_filling(8, {3: 8 / 7}, segments=36)
    # with LP sizes on both plans (OPTCC_SIZING = "auto") they gain 2.6 % at k = 9
    monkeypatch.setattr(policy, "OPTCC_SIZING", "auto")
    assert optcc_bubble_filling(8, {3: 8 / 7}, segments=9)
    monkeypatch.setattr(policy, "OPTCC_SIZING", "closed_form")
    # nothing to choose: l >= 2 has no fills, several degraded ranks none either
    assert optcc_bubble_filling(8, {3: 2.0}, segments=3)
    assert optcc_bubble_filling(8, {1: 1.5, 5: 1.5}, segments=3)
    # the choice is the plan with fills only where it is faster by the margin, whatever the
    # bandwidth (no per-message cost)
    for slowdown, k in ((1.5, 3), (8 / 7, 9), (8 / 7, 18), (8 / 7, 36), (1.8, 18)):
        network = Network.uniform(8, alpha=0.0, bandwidth=125e6, slowdowns={3: slowdown})
        times = {
            fill: simulate(
                optcc(8, {3: slowdown}, segments=k, bubble_filling=fill), 32 * 2**20, network
            ).time_from_last_arrival
            for fill in (True, False)
        }
        pays = times[True] < (1.0 - BUBBLE_FILLING_MIN_GAIN) * times[False]
        assert optcc_bubble_filling(8, {3: slowdown}, segments=k) == pays, (slowdown, k, times)
    situation = optcc_situation(Situation(world_size=8, slowdowns={3: 1.97}), 32 * 2**20)
    assert situation.segments == 9 and situation.bubble_filling is False


def test_plans_too_large_to_simulate_run_without_fills_unsimulated(monkeypatch: pytest.MonkeyPatch) -> None:
    from stragglerkit.planner import policy
    from stragglerkit.sim import fast, simulator

    def no_simulation(*args: object, **kwargs: object) -> None:
        raise AssertionError("a plan too large to simulate was simulated")

    monkeypatch.setattr(simulator, "simulate", no_simulation)
    monkeypatch.setattr(fast, "fast_simulate", no_simulation)
    policy._bubble_filling_pays.cache_clear()
    assert 2048 * 2048 * 64 > policy.SIMULATED_MAX
    assert not policy.optcc_bubble_filling(2048, {3: 8 / 7}, segments=64)
    assert policy.optcc_bubble_filling(2048, {3: 2.0}, segments=64)  # l >= 2: nothing to choose
    policy._bubble_filling_pays.cache_clear()


def test_large_plans_choose_fills_by_the_fast_path() -> None:
    """p = 128, k = 64: far above what the full simulator times online, the fast path decides."""
    from stragglerkit.planner import policy

    policy._bubble_filling_pays.cache_clear()
    filled = policy.optcc_bubble_filling(128, {3: 8 / 7}, segments=64)
    situation = Situation(world_size=128, slowdowns={3: 8 / 7}, segments=64, optcc_sizing=policy.OPTCC_SIZING)
    times = {
        fill: policy._bandwidth_only_seconds("optcc", dataclasses.replace(situation, bubble_filling=fill))
        for fill in (True, False)
    }
    assert filled == (times[True] < (1.0 - policy.BUBBLE_FILLING_MIN_GAIN) * times[False])
    policy._bubble_filling_pays.cache_clear()


def test_the_ramp_makes_the_end_segments_smaller() -> None:
    from stragglerkit.schedules.optcc import default_ramp

    plan = optcc_plan(8, {3: 2.0}, segments=9)
    assert plan.ramp == default_ramp(9) == 3
    assert [plan.segment_weight(s) for s in range(9)] == [1, 2, 3, 4, 4, 4, 3, 2, 1]
    sizes = plan.chunk_sizes()
    q = 7
    assert sizes == tuple(plan.section_weight * plan.segment_weight(c // q) for c in range(9 * q))
    assert optcc_plan(8, {3: 2.0}, segments=9, ramp=0).chunk_sizes() == (plan.section_weight,) * (9 * q)
    assert optcc_plan(8, {3: 2.0}, segments=3).ramp == 0  # none below 4 segments
    # plans with fills or the second ordering keep equal segments
    assert optcc_plan(8, {3: 1.5}, segments=9).ramp == 0
    assert optcc_plan(8, {3: 2.0}, segments=9, orderings=2).ramp == 0
    closed = {"sizing": "closed_form"}  # auto may take the LP's sizes (test_chunk_sizing.py)
    assert optcc_plan(8, {3: 1.5}, segments=9, bubble_filling=False, **closed).ramp == 3
    assert optcc_plan(8, {1: 2.0, 5: 1.5}, segments=9, **closed).ramp == 3  # the attached rank has no fills either


@pytest.mark.parametrize(
    ("p", "slowdowns", "k", "g"),
    [
        (3, {0: 2.0}, 4, 1),
        (5, {4: 3.0}, 7, 1),
        (6, {2: 1.5}, 9, 1),
        (8, {3: 2.0}, 9, 1),
        (9, {1: 4.0, 6: 2.0}, 12, 1),
        (12, {5: 2.0}, 4, 2),
        (16, {0: 2.0, 7: 1.5}, 5, 4),
    ],
)
def test_plans_with_a_ramp_pass_the_checker(p: int, slowdowns: dict[int, float], k: int, g: int) -> None:
    sched = optcc(p, slowdowns, segments=k, gpus_per_server=g, bubble_filling=False, sizing="closed_form")
    assert sched.params["ramp"] == k // 3
    assert len(set(sched.chunk_sizes)) > 1
    check(sched)


def test_a_ramp_shortens_the_simulated_head_and_tail() -> None:
    from stragglerkit.sim.simulator import Network, simulate

    network = Network.uniform(8, 0.0, 1.0, {3: 2.0})
    flat = simulate(optcc(8, {3: 2.0}, segments=9, ramp=0), 1.0, network).makespan
    ramped = simulate(optcc(8, {3: 2.0}, segments=9, sizing="closed_form"), 1.0, network).makespan
    # over the lower bound l·n = 2: 12.7 % with equal segments, 7.1 % with the ramp (optcc_ramp.json)
    assert flat / 2 - 1 == pytest.approx(0.127, abs=0.002)
    assert ramped / 2 - 1 == pytest.approx(0.071, abs=0.002)


def test_a_ramp_is_refused_where_it_was_not_built_for() -> None:
    with pytest.raises(ValueError, match="ramp must be >= 0"):
        optcc_plan(8, {3: 2.0}, segments=9, ramp=-1)
    with pytest.raises(ValueError, match="without bubble fills and with one stage ordering"):
        optcc_plan(8, {3: 1.5}, segments=9, ramp=2)
    with pytest.raises(ValueError, match="without bubble fills and with one stage ordering"):
        optcc_plan(8, {3: 2.0}, segments=9, orderings=2, ramp=2)

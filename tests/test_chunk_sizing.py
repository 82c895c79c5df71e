"""LP chunk sizing (schedules/chunk_sizing.py) and OptCC's sizes from it.

The model is checked against the flow-level simulator (a separate implementation: max-min sharing,
events), the LP's optimum against the schedule's own sizes and against Theorem 6's lower bound,
and the sized plans against the symbolic checker. The executed runs are in
tests/test_executor_correctness.py (``test_optcc_with_lp_sizes``).
"""

from __future__ import annotations

import dataclasses

import pytest

from stragglerkit.errors import NotApplicableError
from stragglerkit.schedules.check import check
from stragglerkit.schedules.chunk_sizing import (
    WEIGHT_RESOLUTION,
    flow_graph,
    makespan,
    optimal_chunk_weights,
    optimal_shares,
    require_one_flow_per_direction,
)
from stragglerkit.schedules.ir import Op, OpKind, Schedule
from stragglerkit.schedules.optcc import LP_MIN_GAIN, optcc, optcc_plan
from stragglerkit.sim import optcc_bounds as ob
from stragglerkit.sim.simulator import Network, simulate


def simulated(schedule: Schedule, slowdowns: dict[int, float]) -> float:
    network = Network.uniform(schedule.world_size, 0.0, 1.0, slowdowns)
    return simulate(schedule, 1.0, network).makespan


@pytest.mark.parametrize(
    ("p", "slowdowns", "k", "kwargs"),
    [
        (5, {0: 8 / 7}, 4, {}),
        (8, {7: 8 / 7}, 9, {}),
        (8, {3: 1.5}, 9, {"bubble_filling": False}),
        (8, {3: 2.0}, 9, {}),
        (7, {2: 3.0}, 5, {"orderings": 2}),
        (9, {1: 1.5, 6: 1.25}, 6, {}),
    ],
)
def test_the_model_is_the_simulator_for_chained_schedules(
    p: int, slowdowns: dict[int, float], k: int, kwargs: dict[str, object]
) -> None:
    """Sends and receives chained per rank: no flows share a link, so the simulator's time is the
    longest path, with the closed-form sizes and with the LP's."""
    for sizing in ("closed_form", "lp"):
        schedule = optcc(p, slowdowns, segments=k, sizing=sizing, **kwargs)  # type: ignore[arg-type]
        assert makespan(schedule, slowdowns) == pytest.approx(simulated(schedule, slowdowns), rel=1e-9)


@pytest.mark.parametrize("p", [3, 4, 5, 8, 11, 16])
@pytest.mark.parametrize("slowdown", [8 / 7, 1.5, 1.9, 2.0, 4.0])
def test_the_lp_never_loses_to_the_closed_form_and_respects_theorem_6(p: int, slowdown: float) -> None:
    k = 9 if p <= 8 else 4
    closed = optcc(p, {1: slowdown}, segments=k, sizing="closed_form")
    shares, optimum = optimal_shares(closed, {1: slowdown})
    assert sum(shares) == pytest.approx(1.0)
    assert optimum <= makespan(closed, {1: slowdown}) * (1 + 1e-6)
    assert optimum >= ob.theorem6_bound(p, slowdown) * (1 - 1e-6)  # no sizes beat the lower bound
    # the integer weights keep the LP's time (rounding: well under 0.1 %)
    sized = dataclasses.replace(closed, chunk_sizes=optimal_chunk_weights(closed, {1: slowdown}))
    assert makespan(sized, {1: slowdown}) == pytest.approx(optimum, rel=1e-3)
    assert max(sized.chunk_weights()) == WEIGHT_RESOLUTION
    check(sized)


def test_the_floor_keeps_messages_from_shrinking() -> None:
    closed = optcc(8, {7: 8 / 7}, segments=9, sizing="closed_form")
    nc = closed.num_chunks
    for floor in (0.0, 0.25, 0.5):
        shares, _ = optimal_shares(closed, {7: 8 / 7}, floor=floor)
        assert min(shares) >= floor / nc * (1 - 1e-6)
    # a higher floor can only cost time
    times = [optimal_shares(closed, {7: 8 / 7}, floor=f)[1] for f in (0.0, 0.25, 0.9)]
    assert times[0] <= times[1] * (1 + 1e-9) <= times[2] * (1 + 1e-9)
    with pytest.raises(ValueError, match="floor"):
        optimal_shares(closed, {7: 8 / 7}, floor=1.0)


def test_the_floor_gives_way_to_a_smaller_own_chunk() -> None:
    """At l = 1.8 the fills are 1/9 of a section, under the floor; the closed form stays feasible."""
    closed = optcc(8, {3: 1.8}, segments=9, sizing="closed_form")
    _, optimum = optimal_shares(closed, {3: 1.8})
    assert optimum <= makespan(closed, {3: 1.8}) * (1 + 1e-6)


def test_lp_sizes_against_the_papers_closed_form() -> None:
    """optcc.txt eq. (2) gives 2(p-1)l/((p-2)l+2)·(k+l-1)/k for l < 2: the LP's sizes come within
    1 % of it at p = 8, l = 8/7, where the timetable's own sizes are 6 % above (the head: the slow
    rank has nothing to send before the first section climbed the ring)."""
    p, slowdown, k = 8, 8 / 7, 9
    paper = ob.optcc_single_time(p, slowdown, k)
    sized = optcc(p, {7: slowdown}, segments=k, sizing="lp")
    closed = optcc(p, {7: slowdown}, segments=k, sizing="closed_form")
    assert makespan(sized, {7: slowdown}) <= 1.01 * paper
    assert makespan(closed, {7: slowdown}) >= 1.05 * paper
    # over the fault-free ring: 11.4 % -> 5.6 %
    fault_free = ob.fault_free_time(p)
    assert simulated(closed, {7: slowdown}) / fault_free - 1 == pytest.approx(0.114, abs=0.002)
    assert simulated(sized, {7: slowdown}) / fault_free - 1 == pytest.approx(0.056, abs=0.002)


def test_auto_takes_the_lp_only_where_it_gains() -> None:
    assert optcc(8, {7: 8 / 7}, segments=9).params["sizing"] == "closed_form"  # the default
    # l = 8/7: 11.4 % -> 5.6 % over the fault-free ring
    assert optcc(8, {7: 8 / 7}, segments=9, sizing="auto").params["sizing"] == "lp"
    # l = 2: the ramp is within 0.5 % of the LP, under LP_MIN_GAIN
    plan = optcc_plan(8, {3: 2.0}, segments=9, sizing="auto")
    assert not plan.weights and plan.ramp == 3
    lp = optcc(8, {3: 2.0}, segments=9, sizing="lp")
    closed = optcc(8, {3: 2.0}, segments=9, sizing="closed_form")
    assert makespan(lp, {3: 2.0}) > (1 - LP_MIN_GAIN) * makespan(closed, {3: 2.0})
    # several GPUs per server, a ramp asked for, and big plans: the closed form
    auto = {"sizing": "auto"}
    assert optcc(12, {5: 1.5}, segments=4, gpus_per_server=2, **auto).params["sizing"] == "closed_form"
    assert optcc(8, {7: 8 / 7}, segments=9, bubble_filling=False, ramp=2, **auto).params["sizing"] == "closed_form"
    assert optcc_plan(64, {7: 8 / 7}, segments=64, sizing="auto").weights == ()  # above MAX_FLOWS
    # the plan alone stays closed-form and O(p) unless asked
    assert optcc_plan(8, {7: 8 / 7}, segments=9).weights == ()
    assert optcc_plan(8, {7: 8 / 7}, segments=9, sizing="auto").weights != ()


def test_sizing_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="sizing must be one of auto, lp, closed_form"):
        optcc(8, {7: 1.5}, segments=9, sizing="best")
    with pytest.raises(ValueError, match="leave ramp=None"):
        optcc(8, {7: 1.5}, segments=9, bubble_filling=False, ramp=2, sizing="lp")
    with pytest.raises(NotApplicableError, match="one GPU per server"):
        optcc(12, {5: 1.5}, segments=4, gpus_per_server=2, sizing="lp")
    plan = optcc_plan(8, {7: 1.5}, segments=9, sizing="closed_form")
    with pytest.raises(ValueError, match="positive integer weight"):
        dataclasses.replace(plan, weights=(1, 2, 3))


def test_lp_sized_plans_pass_the_checker_with_several_degraded_ranks() -> None:
    for p, slowdowns, k in ((6, {0: 1.5, 3: 1.25}, 3), (9, {1: 2.5, 6: 1.5}, 5), (4, {2: 8 / 7}, 1), (3, {0: 1.5}, 2)):
        schedule = optcc(p, slowdowns, segments=k, sizing="lp")
        check(schedule)
        assert schedule.params["sizing"] == "lp"
        assert makespan(schedule, slowdowns) <= makespan(
            optcc(p, slowdowns, segments=k, sizing="closed_form"), slowdowns
        ) * (1 + 1e-3)


def test_schedules_the_model_does_not_describe_are_refused() -> None:
    # two sends of one rank not chained: they could share the NIC
    unchained = Schedule(
        algorithm="two_sends",
        world_size=3,
        num_chunks=2,
        ops=[
            [Op(OpKind.SEND, (0, 1), 1), Op(OpKind.SEND, (1, 2), 2)],
            [Op(OpKind.RECV, (0, 1), 0)],
            [Op(OpKind.RECV, (1, 2), 0)],
        ],
    )
    with pytest.raises(ValueError, match="does not depend on its previous send"):
        require_one_flow_per_direction(unchained)
    local = Schedule(
        algorithm="with_a_copy",
        world_size=2,
        num_chunks=1,
        ops=[[Op(OpKind.SEND, (0, 1), 1)], [Op(OpKind.RECV, (0, 1), 0, scratch=0), Op(OpKind.COPY, (0, 1), None, 0)]],
    )
    with pytest.raises(ValueError, match="models communication only"):
        flow_graph(local)
    chained = Schedule(
        algorithm="chain",
        world_size=2,
        num_chunks=2,
        ops=[
            [Op(OpKind.SEND, (0, 1), 1), Op(OpKind.SEND, (1, 2), 1, depends=(0,))],
            [
                Op(OpKind.RECV, (0, 1), 0),
                Op(OpKind.RECV, (1, 2), 0, depends=(0,)),
            ],
        ],
        chunk_sizes=(1, 3),
    )
    graph = flow_graph(chained)
    assert len(graph) == 2 and graph.waits_for == ((), (0,))
    assert makespan(chained, {1: 2.0}) == pytest.approx(2.0)  # both chunks, at half rate

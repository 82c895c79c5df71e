"""Flow-level simulator: hand-computed cases, NIC sharing, degraded ranks, arrivals, engines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules import ScheduleBuilder, check, direct, rhd, ring, stragglar
from stragglerkit.schedules.ring import add_ring_reduce_scatter
from stragglerkit.sim import CostModel, Network, auto_delay, simulate

ALPHA, BW, GIB = 3e-6, 450e9, 2**30


def _one_message() -> ScheduleBuilder:
    b = ScheduleBuilder(2, 1)
    b.send(0, 1, (0, 1))
    b.recv(1, 0, (0, 1))
    return b


@pytest.mark.parametrize("engine", ["auto", "events"])
def test_two_ranks_one_message_is_alpha_plus_bytes_over_bandwidth(engine: str) -> None:
    sched = _one_message().build("one-message")
    net = Network(alpha=2e-6, tx_bandwidth=(10e9, 10e9), rx_bandwidth=(10e9, 4e9))
    res = simulate(sched, 1e6, net, engine=engine, record_flows=True)
    expected = 2e-6 + 1e6 / 4e9  # the receiver's NIC is the bottleneck
    assert res.completion == pytest.approx([expected, expected], rel=1e-12)
    assert res.makespan == pytest.approx(expected, rel=1e-12)
    assert res.flows is not None and len(res.flows) == 1
    flow = res.flows[0]
    assert (flow.src, flow.dst, flow.bytes) == (0, 1, 1e6)
    assert flow.start == pytest.approx(2e-6) and flow.end == pytest.approx(expected)
    assert res.rx_busy[1] == pytest.approx(1e6 / 4e9) and res.tx_busy[1] == 0


def test_two_rank_ring_matches_closed_form() -> None:
    res = simulate(ring(2), GIB, Network.uniform(2, alpha=ALPHA, bandwidth=BW))
    assert res.makespan == pytest.approx(2 * ALPHA + GIB / BW, rel=1e-12)


def _incast(senders: int) -> ScheduleBuilder:
    """``senders`` ranks each send one chunk to the last rank at once (no rounds)."""
    n = senders + 1
    b = ScheduleBuilder(n, senders)
    for s in range(senders):
        b.send(s, n - 1, (s, s + 1))
        b.recv(n - 1, s, (s, s + 1), scratch=s)
    return b


@pytest.mark.parametrize("engine", ["auto", "events"])
def test_two_flows_into_one_rank_take_twice_as_long(engine: str) -> None:
    one = simulate(_incast(1).build("x"), 1e9, Network.uniform(2, alpha=0.0, bandwidth=1e9), engine=engine)
    two = simulate(_incast(2).build("x"), 2e9, Network.uniform(3, alpha=0.0, bandwidth=1e9), engine=engine)
    assert one.makespan == pytest.approx(1.0)
    assert two.makespan == pytest.approx(2.0)  # each flow carries 1e9 bytes at half the rate
    assert two.engine == "events"  # the contention-free timeline overlaps on rank 2's NIC
    assert two.rx_busy[2] == pytest.approx(2.0)


def test_one_rank_sending_to_two_shares_its_transmit_nic() -> None:
    b = ScheduleBuilder(3, 2)
    for peer in (1, 2):
        b.send(0, peer, (peer - 1, peer))
        b.recv(peer, 0, (peer - 1, peer))
    res = simulate(b.build("fan-out"), 2e9, Network.uniform(3, alpha=1e-3, bandwidth=1e9))
    assert res.completion == pytest.approx([2.001, 2.001, 2.001])


def test_max_min_fairness_with_unequal_bottlenecks() -> None:
    """Flows a: 0->2, b: 1->2, c: 1->3; rank 0 sends at 0.25, NICs otherwise 1 byte/s."""
    b = ScheduleBuilder(4, 3)
    for chunk, (src, dst) in enumerate([(0, 2), (1, 2), (1, 3)]):
        b.send(src, dst, (chunk, chunk + 1))
        b.recv(dst, src, (chunk, chunk + 1), scratch=chunk)
    net = Network(alpha=0.0, tx_bandwidth=(0.25, 1.0, 1.0, 1.0), rx_bandwidth=(1.0,) * 4)
    res = simulate(b.build("fairness"), 3.0, net, record_flows=True)
    ends = {(f.src, f.dst): f.end for f in res.flows or []}
    # progressive filling: a is capped at 0.25 by its sender; b and c split rank 1's NIC (0.5 each)
    # and finish at t=2; a then has 0.5 bytes left at 0.25 byte/s and finishes at t=4.
    assert ends == pytest.approx({(0, 2): 4.0, (1, 2): 2.0, (1, 3): 2.0})


@pytest.mark.parametrize("n", [4, 8, 12])
def test_degraded_rank_slows_ring_by_its_slowdown(n: int) -> None:
    healthy = simulate(ring(n), GIB, Network.uniform(n, alpha=ALPHA, bandwidth=BW))
    degraded = simulate(ring(n), GIB, Network.uniform(n, alpha=ALPHA, bandwidth=BW, slowdowns={1: 2.0}))
    ratio = degraded.makespan / healthy.makespan
    assert 1.95 < ratio <= 2.0
    assert degraded.tx_busy[1] == pytest.approx(2 * healthy.tx_busy[1])


@pytest.mark.parametrize("gen", [ring, rhd, direct])
@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_engines_agree_and_match_cost_model_when_nothing_is_shared(gen, n: int) -> None:  # type: ignore[no-untyped-def]
    sched = gen(n)
    check(sched)
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BW)
    fast = simulate(sched, GIB, net)
    slow = simulate(sched, GIB, net, engine="events")
    assert fast.engine == "contention-free"
    assert slow.completion == pytest.approx(fast.completion, rel=1e-9)
    model = CostModel(CostModel.Config(alpha=ALPHA, beta=1 / BW))
    assert fast.makespan == pytest.approx(model.predict(sched, GIB), rel=0.01)


@pytest.mark.parametrize("n", [3, 6, 9])
def test_ring_closed_form_with_dataflow_too(n: int) -> None:
    res = simulate(ring(n), GIB, Network.uniform(n, alpha=ALPHA, bandwidth=BW), sync_rounds=False)
    assert res.makespan == pytest.approx(2 * (n - 1) * ALPHA + 2 * (n - 1) / n * GIB / BW, rel=1e-9)


def test_common_arrival_shifts_everything() -> None:
    n = 6
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BW)
    base = simulate(ring(n), GIB, net)
    late = simulate(ring(n), GIB, net, arrivals=[0.5] * n)
    assert late.completion == pytest.approx(base.completion + 0.5, rel=1e-12)
    assert late.time_from_last_arrival == pytest.approx(base.makespan, rel=1e-9)


@pytest.mark.parametrize("n", [4, 7, 8])
def test_ring_with_a_straggler_costs_the_whole_ring_after_it_arrives(n: int) -> None:
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BW)
    closed = 2 * (n - 1) * ALPHA + 2 * (n - 1) / n * GIB / BW
    arrivals = [0.0] * n
    arrivals[2] = 0.05
    res = simulate(ring(n), GIB, net, arrivals=arrivals, record_flows=True)
    assert (res.first_arrival, res.last_arrival) == (0.0, 0.05)
    assert res.time_from_last_arrival == pytest.approx(closed, rel=1e-9)
    assert res.time_from_first_arrival == pytest.approx(closed + 0.05, rel=1e-9)
    # sanity of the order of events
    assert np.all(res.completion >= res.arrivals)
    for f in res.flows or []:
        assert f.start >= max(arrivals[f.src], arrivals[f.dst]) + ALPHA - 1e-15
        assert f.end > f.start
    assert res.phase_done["reduce_scatter"] < res.phase_done["allgather"] == pytest.approx(res.makespan)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_ring_reduce_scatter_already_meets_the_bound_a_late_or_slow_rank_sets(n: int) -> None:
    """Why megatron-core's reduce-scatter (the distributed optimizer's) stays its own (docs/megatron.md).

    With equal shards, a rank's contribution to every shard but its own exists only on that rank
    and must leave its NIC: (n-1)/n of the buffer. For a rank that arrives late this takes
    (n-1)/n S/B after its arrival; for a NIC at 1/l, l (n-1)/n S/B. The ring reduce-scatter takes
    exactly that in the bandwidth term, so a straggler- or NIC-aware reduce-scatter could save
    only latency (at most n-2 alphas)."""
    members = list(range(n))
    builder = ScheduleBuilder(n, n)
    add_ring_reduce_scatter(builder, members, members)
    reduce_scatter = builder.build("ring_reduce_scatter")
    bound = (n - 1) / n * GIB / BW
    late = [0.0] * (n - 1) + [0.05]
    res = simulate(reduce_scatter, GIB, Network.uniform(n, alpha=ALPHA, bandwidth=BW), arrivals=late)
    assert res.time_from_last_arrival == pytest.approx(bound + (n - 1) * ALPHA, rel=1e-9)
    slow_nic = Network.uniform(n, alpha=ALPHA, bandwidth=BW, slowdowns={n // 2: 2.0})
    res = simulate(reduce_scatter, GIB, slow_nic)
    assert res.makespan == pytest.approx(2 * bound + (n - 1) * ALPHA, rel=1e-9)


def test_absent_rank_leaves_the_others_waiting() -> None:
    n = 5
    arrivals = [0.0] * (n - 1) + [math.inf]
    res = simulate(direct(n), GIB, Network.uniform(n, alpha=ALPHA, bandwidth=BW), arrivals=arrivals)
    assert math.isinf(res.makespan) and math.isinf(res.completion[n - 1])
    assert res.last_arrival == 0.0
    assert math.isfinite(res.phase_done["pre_allreduce"])


@pytest.mark.parametrize("n", [4, 6, 9])
def test_auto_delay_is_the_hidden_pre_phase(n: int) -> None:
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BW)
    delay = auto_delay(direct(n), GIB, net, phase="pre_allreduce")
    # a ring AllReduce among the n-1 punctual ranks on a buffer cut into n-1 chunks
    assert delay == pytest.approx(2 * (n - 2) * (ALPHA + GIB / (n - 1) / BW), rel=1e-9)
    with pytest.raises(ValueError, match="no phase 'reduce_scatter'"):
        auto_delay(direct(n), GIB, net)
    with pytest.raises(ValueError, match="cannot finish without rank"):
        auto_delay(ring(n), GIB, net)


def test_reduction_and_memory_rates_add_local_time() -> None:
    b = ScheduleBuilder(2, 1)
    b.send(0, 1, (0, 1))
    b.recv_reduce(1, 0, (0, 1))
    net = Network.uniform(2, alpha=1e-6, bandwidth=1e9, gamma=1e-10, delta=1e-11)
    res = simulate(b.build("x"), 1e6, net)
    assert res.completion[0] == pytest.approx(1e-6 + 1e-3)
    assert res.completion[1] == pytest.approx(1e-6 + 1e-3 + 1e6 * 1e-10 + 3e6 * 1e-11)


def test_bad_input_is_refused() -> None:
    net = Network.uniform(4, alpha=ALPHA, bandwidth=BW)
    with pytest.raises(ValueError, match="network has 4 ranks but the schedule has 5"):
        simulate(ring(5), GIB, net)
    with pytest.raises(ValueError, match="one time per rank"):
        simulate(ring(4), GIB, net, arrivals=[0.0, 0.0])
    with pytest.raises(ValueError, match="all arrivals are inf"):
        simulate(ring(4), GIB, net, arrivals=[math.inf] * 4)
    with pytest.raises(ValueError, match="size_bytes"):
        simulate(ring(4), -1, net)
    with pytest.raises(ValueError, match="engine"):
        simulate(ring(4), GIB, net, engine="magic")
    with pytest.raises(ValueError, match="slowdown of rank 1"):
        Network.uniform(4, alpha=ALPHA, bandwidth=BW, slowdowns={1: 0.5})
    with pytest.raises(ValueError, match="not a rank"):
        Network.uniform(4, alpha=ALPHA, bandwidth=BW, slowdowns={9: 2.0})
    with pytest.raises(ValueError, match="bandwidths must be positive"):
        Network(alpha=0.0, tx_bandwidth=(1.0, 0.0), rx_bandwidth=(1.0, 1.0))


def test_unmatched_messages_are_a_schedule_error() -> None:
    b = ScheduleBuilder(2, 1)
    b.send(0, 1, (0, 1))
    with pytest.raises(ScheduleError, match="do not pair up"):
        simulate(b.build("broken"), 1.0, Network.uniform(2, alpha=0.0, bandwidth=1.0))


def test_deadlock_is_reported() -> None:
    b = ScheduleBuilder(2, 2)
    # both ranks first wait for a message the other sends only afterwards
    b.recv(0, 1, (0, 1), scratch=0)
    b.send(0, 1, (1, 2), depends=[0])
    b.recv(1, 0, (1, 2), scratch=0)
    b.send(1, 0, (0, 1), depends=[0])
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(b.build("deadlock"), 1.0, Network.uniform(2, alpha=0.0, bandwidth=1.0))


PAPER_SPEEDUP_OVER_RING = {4: 1.13, 8: 1.36, 16: 1.57, 256: 1.94}  # stragglar.txt §4.3, Fig. 6(b)


@pytest.mark.parametrize("n", sorted(PAPER_SPEEDUP_OVER_RING))
def test_stragglar_reproduces_the_papers_speedup_over_ring(n: int) -> None:
    sched = stragglar(n)
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BW)
    straggler = int(sched.params["straggler"])
    delay = auto_delay(sched, GIB, net)
    # the pre-phase is a ring reduce-scatter among the n-1 punctual ranks on n-1 chunks
    assert delay == pytest.approx((n - 2) * (ALPHA + GIB / (n - 1) / BW), rel=1e-9)
    arrivals = np.zeros(n)
    arrivals[straggler] = delay
    sar = simulate(sched, GIB, net, arrivals=arrivals)
    baseline = simulate(ring(n), GIB, net, arrivals=arrivals)
    assert sar.engine == "contention-free"
    rounds = n + int(math.log2(n)) - 2
    assert sar.time_from_last_arrival == pytest.approx(rounds * (ALPHA + GIB / (n - 1) / BW), rel=1e-9)
    speedup = baseline.time_from_last_arrival / sar.time_from_last_arrival
    assert speedup == pytest.approx(PAPER_SPEEDUP_OVER_RING[n], rel=0.02)


@pytest.mark.parametrize("n", [4, 6, 10])
def test_stragglar_events_engine_and_dataflow(n: int) -> None:
    sched = stragglar(n)
    net = Network.uniform(n, alpha=ALPHA, bandwidth=BW)
    arrivals = np.zeros(n)
    arrivals[n - 1] = auto_delay(sched, GIB, net)
    fast = simulate(sched, GIB, net, arrivals=arrivals)
    slow = simulate(sched, GIB, net, arrivals=arrivals, engine="events")
    assert slow.completion == pytest.approx(fast.completion, rel=1e-9)
    # without rounds in order the straggler posts all its swaps at once and they share its NIC
    dataflow = simulate(sched, GIB, net, arrivals=arrivals, sync_rounds=False)
    assert dataflow.engine == "events"
    assert dataflow.time_from_last_arrival > fast.time_from_last_arrival

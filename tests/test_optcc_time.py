"""OptCC in the flow simulator (bandwidth only): closed forms, lower bounds, one flow per NIC/NVLink direction."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import pytest

from stragglerkit.schedules import ring
from stragglerkit.schedules.optcc import optcc
from stragglerkit.schedules.optcc_servers import nic_projection
from stragglerkit.sim import optcc_bounds as ob
from stragglerkit.sim.simulator import Flow, Network, simulate

SIZE = 1.0  # bytes, with bandwidth 1 byte/s: times are in units of n


def _simulate(p: int, slowdowns: dict[int, float], k: int) -> tuple[float, list[Flow]]:
    result = simulate(optcc(p, slowdowns, segments=k), SIZE, Network.uniform(p, 0.0, 1.0, slowdowns), record_flows=True)
    assert result.flows is not None
    return result.makespan, result.flows


def _assert_one_flow_per_nic_direction(flows: list[Flow], gpus_per_server: int = 1) -> None:
    """No port (a NIC direction, or with servers an NVLink direction) carries two flows at once."""
    by_port: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for flow in flows:
        link = "NVLink" if flow.src // gpus_per_server == flow.dst // gpus_per_server else "NIC"
        by_port[(f"{link} tx", flow.src)].append((flow.start, flow.end))
        by_port[(f"{link} rx", flow.dst)].append((flow.start, flow.end))
    for port, spans in by_port.items():
        spans.sort()
        for (_, end), (start, _) in pairwise(spans):
            assert start >= end - 1e-12, f"{port[0]} of rank {port[1]} carries two flows at once near t={start}"


@pytest.mark.parametrize(
    ("p", "slowdown"),
    [(3, 2.0), (5, 2.0), (8, 3.0), (12, 4.0), (16, 2.0), (6, 1.14), (9, 1.33), (12, 1.5), (16, 8 / 7), (16, 1.5)],
)
def test_single_straggler_meets_the_closed_form_and_respects_the_bounds(p: int, slowdown: float) -> None:
    k = 64
    time, flows = _simulate(p, {p // 3: slowdown}, k)
    closed = ob.optcc_single_time(p, slowdown, k)
    assert time <= closed * 1.03, f"p={p} l={slowdown}: simulated {time:.4f} vs closed form {closed:.4f}"
    assert time >= ob.theorem6_bound(p, slowdown) - 1e-9
    assert time >= ob.theorem1_bound(p, slowdown) - 1e-9
    _assert_one_flow_per_nic_direction(flows)


@pytest.mark.parametrize(
    ("p", "slowdowns"),
    [
        (8, [1.5, 1.5]),
        (12, [1.14, 1.33]),
        (16, [2.0, 2.0]),
        (16, [3.0, 1.5]),
        (12, [4.0, 4.0]),
        (16, [1.5, 1.5, 1.5]),
        (20, [2.0, 1.33, 1.14]),
    ],
)
def test_several_stragglers_meet_appendix_d_and_respect_theorem2(p: int, slowdowns: list[float]) -> None:
    k = 64
    degraded = {i * (p // len(slowdowns)): slowdown for i, slowdown in enumerate(slowdowns)}
    time, flows = _simulate(p, degraded, k)
    closed = ob.optcc_multi_time(p, slowdowns, k)
    assert time <= closed * 1.03, f"p={p} l={slowdowns}: simulated {time:.4f} vs App. D.3 {closed:.4f}"
    assert time >= ob.theorem2_bound(p, slowdowns) - 1e-9
    assert time < ob.ring_degraded_time(p, slowdowns)
    _assert_one_flow_per_nic_direction(flows)


def test_optcc_beats_the_degraded_ring_and_stays_near_the_fault_free_one() -> None:
    p, slowdown = 16, 8 / 7
    time, _ = _simulate(p, {0: slowdown}, 64)
    fault_free = simulate(ring(p), SIZE, Network.uniform(p, 0.0, 1.0)).makespan
    degraded = simulate(ring(p), SIZE, Network.uniform(p, 0.0, 1.0, {0: slowdown})).makespan
    assert fault_free == pytest.approx(ob.fault_free_time(p))
    assert degraded == pytest.approx(ob.ring_degraded_time(p, [slowdown]))
    assert time < degraded
    assert time <= fault_free * 1.06


@pytest.mark.parametrize(
    ("p", "slowdown", "k"), [(8, 8 / 7, 9), (8, 1.5, 9), (5, 1.25, 3), (12, 1.1, 17), (8, 8 / 7, 1)]
)
def test_the_last_fill_ends_the_pipeline_after_the_last_section(p: int, slowdown: float, k: int) -> None:
    """With bubble filling (l < 2) S's last sends are the last fill's downloads, which need no ring
    hop after them: the S4 chain of the last section runs while S still sends, so less than a chain
    of ``q-1`` section hops (what followed S's last send when it was a section) is left after it."""
    straggler = 0
    time, flows = _simulate(p, {straggler: slowdown}, k)
    sends = sorted((f for f in flows if f.src == straggler), key=lambda f: f.end)
    assert {f.phase for f in sends[-(p - 1) :]} == {"fill_down"}
    section = slowdown / (k * ((p - 2) * slowdown + 2))  # s', the time of one section on a healthy link
    assert time - sends[-1].end < (p - 2) * section
    assert time >= ob.theorem6_bound(p, slowdown) - 1e-9
    _assert_one_flow_per_nic_direction(flows)


def test_more_segments_approach_the_limit() -> None:
    times = [_simulate(7, {2: 2.0}, k)[0] for k in (4, 16, 64)]
    assert times[0] > times[1] > times[2] >= 2.0


@pytest.mark.parametrize(
    ("p", "g", "slowdown"),
    [(16, 2, 2.0), (16, 4, 1.5), (24, 4, 3.0), (32, 8, 2.0), (32, 8, 1.14), (24, 2, 4.0), (16, 4, 1.33)],
)
def test_multi_gpu_servers_meet_appendix_e_with_nvlink_modelled(p: int, g: int, slowdown: float) -> None:
    """NIC flows on per-GPU NICs, NVLink flows on NVLink ports at (g-1)x the NIC (App. E's model)."""
    k = 64
    degraded = {r: slowdown for r in range(g, 2 * g)}  # every GPU of server 1
    sched = optcc(p, degraded, segments=k, gpus_per_server=g)
    result = simulate(sched, SIZE, Network.uniform(p, 0.0, 1.0, degraded, gpus_per_server=g), record_flows=True)
    assert result.flows is not None
    time, closed = result.makespan, ob.optcc_multigpu_time(p, g, slowdown, k)
    assert time <= closed * 1.05, f"p={p} g={g} l={slowdown}: {time:.4f} vs E.4 {closed:.4f}"
    assert time >= ob.theorem13_bound(p, g, slowdown) - 1e-9
    assert time >= ob.theorem3_bound(p, g, slowdown) - 1e-9
    assert time >= ob.all_links_bound(p, g, slowdown) - 1e-9
    # every GPU reduces and broadcasts (g-1)/g of the buffer over NVLink each way: 2n/g at (g-1)x
    assert result.nvlink_rx_busy == pytest.approx([2 * SIZE / g] * p)
    assert result.nvlink_tx_busy == pytest.approx([2 * SIZE / g] * p)
    assert time >= 2 * SIZE / g - 1e-9
    _assert_one_flow_per_nic_direction(result.flows, g)
    # with NVLink taken as free (nic_projection) it can only be as fast or faster
    free = simulate(nic_projection(sched, g), SIZE, Network.uniform(p, 0.0, 1.0, degraded)).makespan
    assert free <= time + 1e-9


@pytest.mark.parametrize(("p", "slowdown"), [(8, 2.0), (12, 1.5), (16, 3.0)])
def test_second_ordering_respects_the_bounds_and_one_flow_per_nic(p: int, slowdown: float) -> None:
    degraded = {p // 2: slowdown}
    sched = optcc(p, degraded, segments=64, orderings=2)
    result = simulate(sched, SIZE, Network.uniform(p, 0.0, 1.0, degraded), record_flows=True)
    assert result.flows is not None
    assert result.makespan >= ob.theorem6_bound(p, slowdown) - 1e-9
    _assert_one_flow_per_nic_direction(result.flows)
    assert {"raw_down", "final_up"} <= {flow.phase for flow in result.flows}

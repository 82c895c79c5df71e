"""Flow simulator with servers: NVLink ports inside a server, per-GPU NICs between servers (hand-computed)."""

from __future__ import annotations

import pytest

from stragglerkit.schedules import ScheduleBuilder, ring
from stragglerkit.sim import Network, simulate

ENGINES = ["auto", "events"]


def _messages(world_size: int, pairs: list[tuple[int, int]]) -> ScheduleBuilder:
    """Every (src, dst) pair sends its own chunk at time 0, all concurrently (no rounds)."""
    b = ScheduleBuilder(world_size, len(pairs))
    for chunk, (src, dst) in enumerate(pairs):
        b.send(src, dst, (chunk, chunk + 1))
        b.recv(dst, src, (chunk, chunk + 1), scratch=chunk)
    return b


@pytest.mark.parametrize("engine", ENGINES)
def test_flow_inside_a_server_uses_nvlink_not_the_nic(engine: str) -> None:
    sched = _messages(4, [(0, 1)]).build("x")
    net = Network.uniform(4, 0.0, 1e9, {0: 4.0, 1: 4.0}, gpus_per_server=2, nvlink_bandwidth=4e9)
    res = simulate(sched, 1e9, net, engine=engine)
    assert res.makespan == pytest.approx(0.25)  # 1 GB at 4 GB/s; the degraded NICs are not on the path
    assert res.tx_busy[0] == 0 and res.rx_busy[1] == 0
    assert res.nvlink_tx_busy[0] == pytest.approx(0.25) and res.nvlink_rx_busy[1] == pytest.approx(0.25)


@pytest.mark.parametrize("engine", ENGINES)
def test_flow_between_servers_uses_the_nics(engine: str) -> None:
    sched = _messages(4, [(0, 2)]).build("x")
    net = Network.uniform(4, 1e-3, 1e9, {2: 4.0}, gpus_per_server=2, nvlink_bandwidth=100e9)
    res = simulate(sched, 1e9, net, engine=engine)
    assert res.makespan == pytest.approx(1e-3 + 4.0)  # rank 2's NIC receives at 0.25 GB/s
    assert res.rx_busy[2] == pytest.approx(4.0) and res.tx_busy[0] == pytest.approx(4.0)
    assert not res.nvlink_tx_busy.any() and not res.nvlink_rx_busy.any()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_gpus_nvlink_and_nic_work_at_once(engine: str) -> None:
    """Rank 0 sends 1 GB to rank 1 (its server) and 1 GB to rank 2 (the other server) at once."""
    sched = _messages(4, [(0, 1), (0, 2)]).build("x")
    servers = simulate(sched, 2e9, Network.uniform(4, 0.0, 1e9, gpus_per_server=2, nvlink_bandwidth=2e9), engine=engine)
    assert servers.completion[1] == pytest.approx(0.5) and servers.completion[2] == pytest.approx(1.0)
    flat = simulate(sched, 2e9, Network.uniform(4, 0.0, 1e9), engine=engine)
    assert flat.makespan == pytest.approx(2.0)  # one NIC per rank: the two flows share it


@pytest.mark.parametrize("fan", ["in", "out"])
def test_default_nvlink_reaches_all_siblings_at_nic_speed(fan: str) -> None:
    """optcc.txt App. E: NVLink at (g-1)x the NIC, so a reduce or broadcast over g-1 siblings
    takes as long as one NIC flow of the same size; the g-1 flows share one NVLink port fairly."""
    pairs = [(r, 0) for r in (1, 2, 3)] if fan == "in" else [(0, r) for r in (1, 2, 3)]
    net = Network.uniform(8, 0.0, 1e9, gpus_per_server=4)
    assert net.nvlink_rate == 3e9
    res = simulate(_messages(8, pairs).build("x"), 3e9, net)
    assert res.engine == "events"  # the three flows overlap on rank 0's NVLink port
    assert res.makespan == pytest.approx(1.0)
    busy = res.nvlink_rx_busy if fan == "in" else res.nvlink_tx_busy
    assert busy[0] == pytest.approx(1.0) and not res.tx_busy.any()


def test_ring_inside_one_server_runs_at_nvlink_speed() -> None:
    p, alpha, bandwidth, size = 4, 3e-6, 50e9, 2**30
    res = simulate(ring(p), size, Network.uniform(p, alpha, bandwidth, gpus_per_server=p))
    assert res.makespan == pytest.approx(2 * (p - 1) * (alpha + size / p / (3 * bandwidth)), rel=1e-12)


def test_ring_across_servers_waits_for_its_nic_hops() -> None:
    """Ring 0->1->2->3->0 on two servers of two: hops 1->2 and 3->0 cross servers; rank 3's NIC is slow."""
    p, size = 4, 4.0
    net = Network.uniform(p, 0.0, 1.0, {3: 2.0}, gpus_per_server=2)
    res = simulate(ring(p), size, net, record_flows=True)
    assert res.makespan == pytest.approx(2 * (p - 1) * (size / p) * 2.0)  # every round waits for 3 -> 0
    assert res.flows is not None
    nvlink = {(f.src, f.dst) for f in res.flows if f.src // 2 == f.dst // 2}
    assert nvlink == {(0, 1), (2, 3)}
    assert res.nvlink_tx_busy[2] == pytest.approx(2 * (p - 1) * size / p)  # rank 2 -> 3 at the NIC rate (g-1 = 1)
    assert res.tx_busy[2] == 0 and res.tx_busy[3] == pytest.approx(2 * (p - 1) * size / p * 2.0)


def test_one_gpu_per_server_has_no_nvlink() -> None:
    res = simulate(ring(4), 1.0, Network.uniform(4, 0.0, 1.0))
    assert res.makespan == pytest.approx(1.5)
    assert not res.nvlink_tx_busy.any() and not res.nvlink_rx_busy.any()


def test_bad_server_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="gpus_per_server = 3 must be a positive integer dividing the 4 ranks"):
        Network.uniform(4, 0.0, 1.0, gpus_per_server=3)
    with pytest.raises(ValueError, match="gpus_per_server = 0"):
        Network.uniform(4, 0.0, 1.0, gpus_per_server=0)
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="nvlink_bandwidth"):
            Network.uniform(4, 0.0, 1.0, gpus_per_server=2, nvlink_bandwidth=bad)

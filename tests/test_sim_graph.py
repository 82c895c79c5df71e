"""The flattened task graph shared by the simulator and the cost model."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules import ScheduleBuilder, direct, rhd, ring
from stragglerkit.sim.graph import _extract_fields, build_task_graph


@pytest.fixture
def native_reader() -> None:
    """stragglerkit._C with the simulator's reader (scripts/setup.sh builds it): without it
    ``native=True`` would quietly read with Python and these tests compare Python with itself."""
    native = importlib.import_module("stragglerkit._C")
    assert hasattr(native, "sim_extract_ops"), "stragglerkit._C predates the simulator reader: run scripts/setup.sh"


@pytest.mark.usefixtures("native_reader")
@pytest.mark.parametrize("sched", [ring(7), rhd(6), direct(9)], ids=["ring", "rhd", "direct"])
def test_native_and_python_readers_agree(sched) -> None:  # type: ignore[no-untyped-def]
    import stragglerkit.sim.graph as graph_module

    old = graph_module._NATIVE_MIN_OPS
    graph_module._NATIVE_MIN_OPS = 0
    try:
        native = _extract_fields(sched, native=True)
    finally:
        graph_module._NATIVE_MIN_OPS = old
    python = _extract_fields(sched, native=False)
    for a, b in zip(native, python, strict=True):
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


def test_ring_graph_shape() -> None:
    n = 5
    g = build_task_graph(ring(n))
    assert g.num_messages == 2 * n * (n - 1) and g.num_tasks == g.num_messages  # recv_reduce is fused
    assert g.phases == ["reduce_scatter", "allgather"]
    # every message task is one send and one receive, on the ranks it names
    assert np.array_equal(g.op_rank[g.task_op[: g.num_messages]], g.task_src[: g.num_messages])
    assert np.array_equal(g.op_rank[g.recv_op], g.task_dst[: g.num_messages])


def test_round_sync_adds_edges_only_for_round_ops() -> None:
    with_rounds = build_task_graph(rhd(8), sync_rounds=True)
    without = build_task_graph(rhd(8), sync_rounds=False)
    assert with_rounds.edge_dst.size > without.edge_dst.size
    b = ScheduleBuilder(2, 2)
    b.send(0, 1, (0, 1))
    b.recv(1, 0, (0, 1))
    b.send(0, 1, (1, 2))
    b.recv(1, 0, (1, 2))
    untagged = b.build("untagged")
    assert build_task_graph(untagged, sync_rounds=True).edge_dst.size == build_task_graph(untagged).edge_dst.size


def test_malformed_schedules_are_refused() -> None:
    b = ScheduleBuilder(2, 1)
    b.send(0, 1, (0, 1))
    b.recv(1, 0, (0, 1))
    sched = b.build("x")
    sched.num_chunks = 1
    sched.ops[0][0] = type(sched.ops[0][0])(sched.ops[0][0].kind, (0, 3), 1)
    with pytest.raises(ScheduleError, match=r"outside 0\.\.1"):
        build_task_graph(sched)


@pytest.mark.usefixtures("native_reader")
@pytest.mark.parametrize("sync_rounds", [True, False])
@pytest.mark.parametrize("sched", [ring(6), rhd(5), direct(7)], ids=["ring", "rhd", "direct"])
def test_native_and_numpy_graphs_are_identical(sched, sync_rounds: bool) -> None:  # type: ignore[no-untyped-def]
    import stragglerkit.sim.graph as graph_module

    old = graph_module._NATIVE_MIN_OPS
    graph_module._NATIVE_MIN_OPS = 0
    try:
        native = build_task_graph(sched, sync_rounds=sync_rounds, native=True)
    finally:
        graph_module._NATIVE_MIN_OPS = old
    python = build_task_graph(sched, sync_rounds=sync_rounds, native=False)
    for name in (
        "op_task",
        "task_src",
        "task_dst",
        "task_op",
        "recv_op",
        "edge_ptr",
        "edge_dst",
        "edge_from_op",
        "one_flow_per_nic",
    ):
        assert np.array_equal(getattr(native, name), getattr(python, name)), name
    assert (native.num_messages, native.num_tasks) == (python.num_messages, python.num_tasks)


@pytest.mark.usefixtures("native_reader")
@pytest.mark.parametrize("sched", [ring(6), rhd(5), direct(7)], ids=["ring", "rhd", "direct"])
def test_native_and_numpy_longest_paths_agree(sched) -> None:  # type: ignore[no-untyped-def]
    from stragglerkit.sim.graph import longest_path

    g = build_task_graph(sched)
    rng = np.random.default_rng(1)
    release = rng.uniform(0, 1, g.num_tasks)
    duration = rng.uniform(0, 1, g.num_tasks)
    extra = rng.uniform(0, 1, g.op_kind.size)
    import stragglerkit.sim.graph as graph_module

    old = graph_module._NATIVE_MIN_OPS
    graph_module._NATIVE_MIN_OPS = 0
    try:
        native = longest_path(g, release, duration, extra, native=True)
    finally:
        graph_module._NATIVE_MIN_OPS = old
    assert np.array_equal(native, longest_path(g, release, duration, extra, native=False))


def test_one_flow_per_nic_flag() -> None:
    assert build_task_graph(ring(5)).one_flow_per_nic
    assert build_task_graph(direct(6)).one_flow_per_nic
    assert not build_task_graph(ring(5), sync_rounds=False).one_flow_per_nic
    b = ScheduleBuilder(3, 2)
    for s in range(2):
        b.send(s, 2, (s, s + 1), round=0)
        b.recv(2, s, (s, s + 1), scratch=s, round=0)  # two receives in one round: an incast
    assert not build_task_graph(b.build("incast")).one_flow_per_nic

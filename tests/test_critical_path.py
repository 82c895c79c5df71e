"""The critical path of one AllReduce from per-op timings (stragglerkit.report.critical_path).

Synthetic traces with a known answer check the walk and its arithmetic; lowered plans check the
message dependencies; a loopback bench run checks it end to end on real timings (the segments
add up to the path's span, and every message it crosses was a real one).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from stragglerkit.planner.lowering import LoweredKind, OpColumn, lower
from stragglerkit.report.critical_path import critical_path
from stragglerkit.runtime.trace import message_dependencies
from stragglerkit.schedules.registry import Situation, generate

MS = 1_000_000  # ns


def _three_ranks() -> list[dict[str, Any]]:
    """0 -> 1 -> 2: rank 1 forwards what it received from rank 0 to rank 2; rank 2 enters late.

    rank 0: enters at 0, posts its send at 1 ms, which completes at 5 ms.
    rank 1: enters at 0, posts the receive at 2 ms (after rank 0's header), completes it at 6 ms,
            posts the send at 7 ms (1 ms post lag), which completes at 10 ms.
    rank 2: enters at 3 ms, posts the receive at 4 ms, completes it at 11 ms.
    """
    return [
        {"entered_ns": 0, "messages": [[0, "send", 1, 1000, 1 * MS, 5 * MS]], "deps": [[]]},
        {
            "entered_ns": 0,
            "messages": [[0, "recv_reduce", 0, 1000, 2 * MS, 6 * MS], [2, "send", 2, 1000, 7 * MS, 10 * MS]],
            "deps": [[], [0]],
        },
        {"entered_ns": 3 * MS, "messages": [[0, "recv", 1, 1000, 4 * MS, 11 * MS]], "deps": [[]]},
    ]


def test_walk_back_from_the_last_completion() -> None:
    path = critical_path(_three_ranks(), payload_Bps=[1e6, 1e6, 0.5e6])
    assert path is not None
    # rank 2's receive (flows from rank 1's post at 7 ms: 4 ms), rank 1's post lag (1 ms), rank 1's
    # receive (flows from its own post at 2 ms: 4 ms), posted 2 ms after its entry (its first
    # receive from rank 0, which waits for rank 0's header)
    assert path["wire_s"] == pytest.approx(0.008)
    assert path["post_lag_s"] == pytest.approx(0.003)
    assert path["first_from_peer_s"] == pytest.approx(0.002)
    assert path["total_s"] == pytest.approx(0.011) and path["start_s"] == 0.0
    assert path["wire_s"] + path["post_lag_s"] == pytest.approx(path["total_s"] - path["start_s"])
    assert (path["start_rank"], path["end_rank"], path["messages"]) == (1, 2, 2)
    # 1000 bytes at 1 MB/s (0 -> 1) and at 0.5 MB/s (1 -> 2, the slower end)
    assert path["wire_ideal_s"] == pytest.approx(0.001 + 0.002)
    # each message alone on its link: the link was busy for its ideal time of the 4 ms in flight
    assert path["wire_link_busy_s"] == pytest.approx(0.003)
    assert [s[1] for s in path["segments"]] == [
        "post lag, first from the peer",
        "recv_reduce 0->1",
        "post lag",
        "recv 1->2",
    ]
    # rank 1's receive shared rank 1's ingress with nothing; its link was busy a quarter of the 4 ms
    assert path["segments"][1][4] == {"label": "", "link_busy": pytest.approx(0.25), "shared_with": []}
    # every message's post lag, on every rank: rank 0's send 1 ms after its entry, rank 1's receive
    # 2 ms and its send 1 ms, rank 2's receive 1 ms after its entry
    assert path["post_lag_all"] == {"count": 4, "sum_s": pytest.approx(0.005), "max_s": pytest.approx(0.002)}


def test_messages_sharing_a_link_keep_it_busy() -> None:
    """Rank 0 sends 2000 bytes to rank 1 and to rank 2 at once, both done at 4 ms at 1 MB/s: each
    takes twice its time alone, and rank 0's link is busy all along."""
    traces: list[dict[str, Any]] = [
        {
            "entered_ns": 0,
            "messages": [[0, "send", 1, 2000, 0, 4 * MS], [1, "send", 2, 2000, 0, 4 * MS]],
            "deps": [[], []],
        },
        {"entered_ns": 0, "messages": [[0, "recv", 0, 2000, 0, 4 * MS]], "deps": [[]]},
        {"entered_ns": 0, "messages": [[0, "recv", 0, 2000, 0, 4 * MS]], "deps": [[]]},
    ]
    path = critical_path(traces, payload_Bps=[1e6, 1e6, 1e6])
    assert path is not None
    assert path["wire_s"] == pytest.approx(0.004) and path["wire_ideal_s"] == pytest.approx(0.002)
    assert path["wire_link_busy_s"] == pytest.approx(0.004)
    message = next(segment for segment in path["segments"] if len(segment) > 4)
    assert message[4]["link_busy"] == pytest.approx(1.0)
    assert message[4]["shared_with"] == [[0, pytest.approx(1.5, abs=0.5), "", pytest.approx(0.004)]]
    # the same message with the link idle half of the time: 2000 bytes in 4 ms
    traces[0]["messages"], traces[0]["deps"] = traces[0]["messages"][:1], [[]]
    traces[2]["messages"], traces[2]["deps"] = [], []
    half = critical_path(traces, payload_Bps=[1e6, 1e6, 1e6])
    assert half is not None and half["wire_link_busy_s"] == pytest.approx(0.002)


def test_a_connection_carries_its_messages_one_after_another() -> None:
    """Rank 0 posts two 4000-byte messages to rank 1 at once; the second flows once the first has
    arrived (4 ms), so the path runs through the first, and the link was busy all along."""
    traces: list[dict[str, Any]] = [
        {
            "entered_ns": 0,
            "messages": [[0, "send", 1, 4000, 0, 4 * MS], [1, "send", 1, 4000, 0, 8 * MS]],
            "deps": [[], []],
        },
        {
            "entered_ns": 0,
            "messages": [[0, "recv", 0, 4000, 0, 4 * MS], [1, "recv", 0, 4000, 0, 8 * MS]],
            "deps": [[], []],
        },
    ]
    path = critical_path(traces, payload_Bps=[1e6, 1e6])
    assert path is not None
    assert path["queued_on_connection"] == 1 and path["messages"] == 2
    assert path["wire_s"] == pytest.approx(0.008) and path["wire_ideal_s"] == pytest.approx(0.008)
    assert path["wire_link_busy_s"] == pytest.approx(0.008) and path["post_lag_s"] == 0.0


def test_counted_from_a_given_origin_and_without_rates() -> None:
    path = critical_path(_three_ranks(), origin_ns=3 * MS)  # from rank 2's (the straggler's) arrival
    assert path is not None
    assert path["total_s"] == pytest.approx(0.008) and path["start_s"] == pytest.approx(-0.003)
    assert path["wire_ideal_s"] is None and path["wire_link_busy_s"] is None


def test_the_sender_posting_late_moves_the_path_to_the_sender() -> None:
    traces = _three_ranks()
    traces[0]["messages"][0][4] = 3 * MS  # rank 0 posts its send at 3 ms, after rank 1's receive (2 ms)
    path = critical_path(traces)
    assert path is not None
    assert path["start_rank"] == 0 and path["segments"][0][:2] == [0, "post lag"]
    assert path["segments"][0][3] == pytest.approx(0.003)  # rank 0's entry to its post
    assert path["wire_s"] == pytest.approx(0.004 + 0.003) and path["first_from_peer_s"] == 0.0


def test_traces_of_different_calls_are_refused() -> None:
    traces = _three_ranks()
    traces[2]["messages"], traces[2]["deps"] = [], []
    with pytest.raises(ValueError, match="rank 1 sent 1 messages to rank 2, which received 0"):
        critical_path(traces)
    assert critical_path([{"entered_ns": 0, "messages": [], "deps": []}] * 2) is None


@pytest.mark.parametrize(("algorithm", "n"), [("ring", 5), ("stragglar", 6)])
def test_message_dependencies_follow_the_plan_through_local_ops(algorithm: str, n: int) -> None:
    situation = Situation(world_size=n, straggler=n - 1 if algorithm == "stragglar" else None)
    for plan in lower(generate(algorithm, situation), 6000, 4, pieces=1, divide_by=n):
        kinds = plan.ops[:, OpColumn.KIND].tolist()
        deps = message_dependencies(plan)
        messages = [op for op, kind in enumerate(kinds) if kind in (0, 1, 2)]
        assert sorted(deps) == messages
        for op, before in deps.items():
            assert all(d < op and kinds[d] != LoweredKind.REDUCE for d in before)
        # every send after a rank's first receive forwards something it received
        first_recv = min((op for op in messages if kinds[op] != LoweredKind.SEND), default=None)
        if algorithm == "ring" and first_recv is not None:
            later_sends = [op for op in messages if kinds[op] == LoweredKind.SEND and op > first_recv]
            assert later_sends and all(deps[op] for op in later_sends)


def test_loopback_bench_rows_carry_a_consistent_critical_path(tmp_path: Path) -> None:
    from stragglerkit.cli import main

    out = tmp_path / "bench.json"
    argv = ["bench", "--loopback", "--world-size", "4", "--sizes", "1MiB", "--iters", "2", "--warmup", "1"]
    argv += ["--algorithms", "gloo,ring,stragglar", "--straggler", "3", "--delay", "20", "--json", str(out)]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    rows = {row["algorithm"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["gloo"]["critical_path"] is None
    for name in ("ring", "stragglar"):
        path = rows[name]["critical_path"]
        assert path is not None and path["messages"] >= 1
        parts = path["wire_s"] + path["post_lag_s"]
        assert parts == pytest.approx(path["total_s"] - path["start_s"], abs=1e-6)
        assert path["wire_ideal_s"] is None  # loopback: no link rate
        assert 0 < path["total_s"] < 10
    # StragglAR's path is counted from the straggler's arrival, 20 ms after the others'
    assert rows["stragglar"]["critical_path"]["start_s"] <= 0.0
    # its messages carry the plan's phase/round labels
    labels = {s[4]["label"] for s in rows["stragglar"]["critical_path"]["segments"] if len(s) > 4}
    assert labels and all(label for label in labels), labels
    assert "# critical path of stragglar 1MiB" in stdout.getvalue()

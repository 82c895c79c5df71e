"""Bad input on real gloo groups: a clear error on every rank, before data moves, nobody hangs."""

from __future__ import annotations

import fault_bodies
import pytest
from _dist import run_group

WAIT_MODES = ["ordered", "concurrent"]
"""The executor's two ways of observing completions (csrc/channel_waiters.h)."""


def test_bad_arguments_on_every_rank_then_recovery() -> None:
    results = run_group(3, fault_bodies.bad_arguments_everywhere)
    for out in results.values():
        assert out["non_contiguous"].startswith("ValueError") and "contiguous" in out["non_contiguous"]
        assert out["sparse"].startswith("ValueError") and "dense" in out["sparse"]
        assert out["dtype"].startswith("ValueError") and "int8" in out["dtype"]
        assert out["complex"].startswith("ValueError") and "complex64" in out["complex"]
        assert out["op"].startswith("ValueError") and "'max'" in out["op"]
        assert out["avg_int"].startswith("ValueError") and "floating" in out["avg_int"]
        assert out["algorithm"].startswith("ValueError") and "butterfly" in out["algorithm"]
        assert out["straggler"].startswith("ValueError") and "straggler" in out["straggler"]
        assert out["good"] == "ok" and out["good_value"], out


def test_one_rank_with_bad_arguments_stops_the_others() -> None:
    results = run_group(3, fault_bodies.one_rank_bad_arguments)
    assert results[1].startswith("ValueError") and "contiguous" in results[1]
    for rank in (0, 2):
        assert results[rank].startswith("StragglerKitError"), results[rank]
        assert "rank 1 failed (invalid arguments" in results[rank], results[rank]
        assert f"on rank {rank}" in results[rank]


@pytest.mark.parametrize(
    ("variable", "hint"),
    [
        ("STRAGGLERKIT_POST_AHEAD", "give on or off"),
        ("STRAGGLERKIT_WAIT_MODE", "give auto, ordered or concurrent"),
        ("STRAGGLERKIT_OPTCC_MESSAGE_BYTES", "is not a positive size"),
        ("STRAGGLERKIT_NVTX", "give on or off"),
    ],
)
def test_one_rank_with_a_bad_setting_stops_the_others(variable: str, hint: str) -> None:
    """A STRAGGLERKIT_* setting with a bad value on one rank, set after the runtime exists: a
    ValueError there that names the variable and what to give, and an error naming that rank on
    the others, not a wait for the timeout."""
    results = run_group(3, fault_bodies.one_rank_bad_setting, variable)
    assert results[1].startswith("ValueError") and f"{variable}='maybe'" in results[1], results[1]
    assert hint in results[1], results[1]
    for rank in (0, 2):
        assert results[rank].startswith("StragglerKitError"), results[rank]
        assert "rank 1 failed (invalid arguments" in results[rank], results[rank]


def test_a_setting_that_differs_at_the_runtime_s_creation_is_named_on_every_rank() -> None:
    """STRAGGLERKIT_TCP_SEND_BUFFER=off on rank 1 only: the others would create the runtime's own
    groups (collectively) without it. Every rank raises, naming the variable and the ranks."""
    results = run_group(3, fault_bodies.one_rank_setting_at_creation, "STRAGGLERKIT_TCP_SEND_BUFFER", "off")
    for rank, out in results.items():
        assert out.startswith("ValueError") and "STRAGGLERKIT_TCP_SEND_BUFFER differs between ranks" in out, (rank, out)
        assert "'off' on rank(s) 1" in out and "unset on rank(s) 0, 2" in out, out
        assert "same value on every rank" in out


def test_a_bad_setting_at_the_runtime_s_creation_is_named_on_every_rank() -> None:
    results = run_group(3, fault_bodies.one_rank_setting_at_creation, "STRAGGLERKIT_DUPLEX", "sideways")
    for rank, out in results.items():
        assert out.startswith("ValueError") and "on rank 1: STRAGGLERKIT_DUPLEX='sideways'" in out, (rank, out)
        assert "STRAGGLERKIT_DUPLEX differs between ranks" in out, (rank, out)


@pytest.mark.parametrize("wait_mode", WAIT_MODES)
def test_size_mismatch_is_caught_on_every_rank_before_data_moves(
    wait_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRAGGLERKIT_WAIT_MODE", wait_mode)  # inherited by the spawned ranks
    results = run_group(4, fault_bodies.size_mismatch)
    for rank, out in results.items():
        assert out["error"].startswith("StragglerKitError"), (rank, out)
        assert "algorithm ring" in out["error"]
    for rank, out in results.items():
        assert "mismatch" in out["error"], (rank, out)
    for rank in (1, 3):  # ring neighbours of rank 2: found it themselves or were told by rank 2
        assert "rank 2" in results[rank]["error"]
    detailed = [out["error"] for out in results.values() if "mismatch detected before any data moved" in out["error"]]
    assert detailed and all("1000 elements of Float" in e and "1001 elements" in e for e in detailed), detailed
    assert results[2]["unchanged"], "the mismatched rank's tensor was written"


@pytest.mark.parametrize("wait_mode", WAIT_MODES)
def test_dtype_mismatch_is_caught_on_every_rank(wait_mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAGGLERKIT_WAIT_MODE", wait_mode)  # inherited by the spawned ranks
    results = run_group(3, fault_bodies.dtype_mismatch)
    for rank, out in results.items():
        assert out["error"].startswith("StragglerKitError") and "mismatch" in out["error"], (rank, out)
    assert "Double" in results[0]["error"] and "Float" in results[0]["error"]
    assert results[0]["unchanged"]


def test_mismatch_notes_carry_what_their_origin_passed() -> None:
    """A rank told of a mismatch by a note can name the difference even if the origin's header has not
    reached it yet (the note can overtake it): the note carries the origin's numel, dtype and plan."""
    results = run_group(3, fault_bodies.dtype_mismatch_notes)
    dtype_code = {0: 7, 1: 6, 2: 6}  # c10::ScalarType: Double 7, Float 6 (rank 0 passed float64)
    mismatch = 1  # AbortReason kReasonMismatch
    notes = [note for out in results.values() for note in out["notes"] if note[2] == mismatch]
    assert notes, results  # at least one side of the mismatched pair sent one
    for _call_number, origin, _reason, remote, numel, dtype, plan_id in notes:
        assert numel == 1000 and dtype == dtype_code[origin], notes
        assert remote in (0, 1, 2) and remote != origin and plan_id != 0, notes
        assert (origin == 0) != (remote == 0), notes  # every mismatch involves rank 0


def test_an_idle_group_outlives_its_timeout() -> None:
    """Gloo closes every connection of a group when one of its waits times out; the executor's
    listener for abort notes waits on every gloo group it used, so it must never time out: a run
    idle for longer than the group's timeout (1 s here; 30 min by default) still works after."""
    n = 3
    results = run_group(n, fault_bodies.idle_past_the_group_timeout, 2.5)
    total = float(sum(range(1, n + 1)))
    assert all(results[r] == [total] * 3 for r in range(n)), results


def test_a_misspelt_setting_is_named_once() -> None:
    results = run_group(2, fault_bodies.misspelt_setting)
    assert results[0] == [
        "STRAGGLERKIT_WAITMODE is not a stragglerkit setting (did you mean STRAGGLERKIT_WAIT_MODE?); it has no effect"
    ]
    assert results[1] == []  # rank 0 speaks for the group

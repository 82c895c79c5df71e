"""Bad input on real gloo groups: a clear error on every rank, before data moves, nobody hangs.

The cases of one world size run one after the other in one process group (:func:`launches`), each
from a clean slate (tests/_dist.py, ``several``): no session, the default wait mode and
the environment as before it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fault_bodies
import pytest
from _launch import Case
from _launch import launches as launched

WAIT_MODES = ["ordered", "concurrent"]
"""The executor's two ways of observing completions (csrc/channel_waiters.h)."""

CASES: dict[str, Case] = {
    # case: (world size, (its test, its parameters), its body in tests/fault_bodies.py, its arguments)
    "misspelt": (3, ("test_a_misspelt_setting_is_named_once", ""), fault_bodies.misspelt_setting, ()),
    "setting_differs": (
        3,
        ("test_a_setting_that_differs_at_init_is_named_on_every_rank", ""),
        fault_bodies.one_rank_setting_at_init,
        ("STRAGGLERKIT_TCP_SEND_BUFFER", "off"),
    ),
    "bad_setting": (
        3,
        ("test_a_bad_setting_at_init_is_named_on_every_rank", ""),
        fault_bodies.one_rank_setting_at_init,
        ("STRAGGLERKIT_TCP_SEND_BUFFER", "sideways"),
    ),
    "bad_arguments": (
        3,
        ("test_bad_arguments_on_every_rank_then_recovery", ""),
        fault_bodies.bad_arguments_everywhere,
        (),
    ),
    "one_rank_bad_arguments": (
        3,
        ("test_one_rank_with_bad_arguments_stops_the_others", ""),
        fault_bodies.one_rank_bad_arguments,
        (),
    ),
    **{
        f"dtype_mismatch/{mode}": (
            3,
            ("test_dtype_mismatch_is_caught_on_every_rank", mode),
            fault_bodies.dtype_mismatch,
            (mode,),
        )
        for mode in WAIT_MODES
    },
    "mismatch_notes": (
        3,
        ("test_mismatch_notes_carry_what_their_origin_passed", ""),
        fault_bodies.dtype_mismatch_notes,
        (),
    ),
    "idle": (3, ("test_an_idle_group_outlives_its_timeout", ""), fault_bodies.idle_past_the_group_timeout, (2.5,)),
    **{
        f"size_mismatch/{mode}": (
            4,
            ("test_size_mismatch_is_caught_on_every_rank_before_data_moves", mode),
            fault_bodies.size_mismatch,
            (mode,),
        )
        for mode in WAIT_MODES
    },
}


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest) -> Callable[[str], dict[int, Any]]:
    """``launches(case)``: {rank: what the case's body returned}, from one process group per world
    size that runs the cases of the tests selected in this session (tests/_launch.py)."""
    return launched(request, CASES, timeout=600.0)


def _is_config_error(out: dict[str, Any]) -> bool:
    """A ConfigError, which is a ValueError (what a Python user catches around a bad argument)."""
    return out["error"].startswith("ConfigError") and "ValueError" in out["kinds"]


def test_bad_arguments_on_every_rank_then_recovery(launches: Callable[[str], dict[int, Any]]) -> None:
    results = launches("bad_arguments")
    for out in results.values():
        assert _is_config_error(out["non_contiguous"]) and "contiguous" in out["non_contiguous"]["error"]
        assert _is_config_error(out["sparse"]) and "dense" in out["sparse"]["error"]
        assert _is_config_error(out["dtype"]) and "int8" in out["dtype"]["error"]
        assert _is_config_error(out["complex"]) and "complex64" in out["complex"]["error"]
        assert _is_config_error(out["op"]) and "'max'" in out["op"]["error"]
        assert _is_config_error(out["avg_int"]) and "floating" in out["avg_int"]["error"]
        assert _is_config_error(out["algorithm"]) and "butterfly" in out["algorithm"]["error"]
        assert _is_config_error(out["straggler"]) and "straggler" in out["straggler"]["error"]
        assert out["good"]["error"] == "ok" and out["good_value"], out


def test_one_rank_with_bad_arguments_stops_the_others(launches: Callable[[str], dict[int, Any]]) -> None:
    results = launches("one_rank_bad_arguments")
    assert _is_config_error(results[1]) and "contiguous" in results[1]["error"]
    for rank in (0, 2):
        error = results[rank]["error"]
        assert error.startswith("PeerError") and "RuntimeError" in results[rank]["kinds"], error
        assert results[rank]["peer"] == 1, results[rank]
        assert "rank 1 failed (invalid arguments" in error, error
        assert f"on rank {rank}" in error


def test_a_setting_that_differs_at_init_is_named_on_every_rank(launches: Callable[[str], dict[int, Any]]) -> None:
    """STRAGGLERKIT_TCP_SEND_BUFFER=off on rank 1 only: the others would create the runtime's own
    groups (collectively) without it. Every rank raises in init, naming the field and the ranks."""
    results = launches("setting_differs")
    for rank, out in results.items():
        error = out["error"]
        assert _is_config_error(out) and "executor.send_buffer differs" in error, (rank, error)
        assert "None on rank(s) 1" in error and f"{1024 * 1024} on rank(s) 0, 2" in error, error
        assert "give every rank the same configuration" in error


def test_a_bad_setting_at_init_is_named_on_every_rank(launches: Callable[[str], dict[int, Any]]) -> None:
    """A bad value on rank 1 only: rank 1 cannot build its configuration, and the others, already in
    init's collective steps, raise naming it instead of waiting."""
    results = launches("bad_setting")
    for rank, out in results.items():
        error = out["error"]
        assert _is_config_error(out) and "on rank 1: STRAGGLERKIT_TCP_SEND_BUFFER='sideways'" in error, (rank, error)
        assert "give a size" in error, (rank, error)


@pytest.mark.parametrize("wait_mode", WAIT_MODES)
def test_size_mismatch_is_caught_on_every_rank_before_data_moves(
    wait_mode: str, launches: Callable[[str], dict[int, Any]]
) -> None:
    results = launches(f"size_mismatch/{wait_mode}")
    for rank, out in results.items():
        assert "CollectiveError" in out["kinds"] and "StragglerKitError" in out["kinds"], (rank, out)
        assert "algorithm ring" in out["error"]
    for rank, out in results.items():
        assert "mismatch" in out["error"], (rank, out)
    for rank in (1, 3):  # ring neighbours of rank 2: found it themselves or were told by rank 2
        assert "rank 2" in results[rank]["error"]
        assert fault_bodies.blames_its_peer(results[rank], 2), results[rank]
    detailed = [out["error"] for out in results.values() if "mismatch detected before any data moved" in out["error"]]
    assert detailed and all("1000 elements of Float" in e and "1001 elements" in e for e in detailed), detailed
    assert results[2]["unchanged"], "the mismatched rank's tensor was written"


@pytest.mark.parametrize("wait_mode", WAIT_MODES)
def test_dtype_mismatch_is_caught_on_every_rank(wait_mode: str, launches: Callable[[str], dict[int, Any]]) -> None:
    results = launches(f"dtype_mismatch/{wait_mode}")
    for rank, out in results.items():
        assert "CollectiveError" in out["kinds"] and "mismatch" in out["error"], (rank, out)
    assert "Double" in results[0]["error"] and "Float" in results[0]["error"]
    assert results[0]["unchanged"]


def test_mismatch_notes_carry_what_their_origin_passed(launches: Callable[[str], dict[int, Any]]) -> None:
    """A rank told of a mismatch by a note can name the difference even if the origin's header has not
    reached it yet (the note can overtake it): the note carries the origin's numel, dtype and plan."""
    results = launches("mismatch_notes")
    dtype_code = {0: 7, 1: 6, 2: 6}  # c10::ScalarType: Double 7, Float 6 (rank 0 passed float64)
    mismatch = 1  # AbortReason kReasonMismatch
    notes = [note for out in results.values() for note in out["notes"] if note[2] == mismatch]
    assert notes, results  # at least one side of the mismatched pair sent one
    for _call_number, origin, _reason, remote, numel, dtype, plan_id in notes:
        assert numel == 1000 and dtype == dtype_code[origin], notes
        assert remote in (0, 1, 2) and remote != origin and plan_id != 0, notes
        assert (origin == 0) != (remote == 0), notes  # every mismatch involves rank 0


def test_an_idle_group_outlives_its_timeout(launches: Callable[[str], dict[int, Any]]) -> None:
    """Gloo closes every connection of a group when one of its waits times out; the executor's
    listener for abort notes waits on every gloo group it used, so it must never time out: a run
    idle for longer than the group's timeout (1 s here; 30 min by default) still works after."""
    n = 3
    results = launches("idle")
    total = float(sum(range(1, n + 1)))
    assert all(results[r] == [total] * 3 for r in range(n)), results


def test_a_misspelt_setting_is_named_once(launches: Callable[[str], dict[int, Any]]) -> None:
    results = launches("misspelt")
    assert results[0] == [
        "STRAGGLERKIT_TIME_OUT is not a stragglerkit setting (did you mean STRAGGLERKIT_TIMEOUT?); it has no effect"
    ]
    assert results[1] == results[2] == []  # rank 0 speaks for the group

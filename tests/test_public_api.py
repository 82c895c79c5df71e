"""The public API on real gloo groups: a torch.distributed program runs with stragglerkit.all_reduce
after one init, with torch's results; errors before init, for ops it cannot do, and on a second init.

The runs of one world size share one process group (:func:`launches`), one after the other, each
from a clean slate (tests/_dist.py, ``several``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import api_bodies
import pytest
import torch
import torch.distributed as dist
from _dist import run_group
from _launch import Case
from _launch import launches as launched

import stragglerkit
from stragglerkit import NotInitializedError

SALT = {"sum_async": 0, "avg": 1, "subgroup": 2}

PROGRAM = "test_a_torch_program_runs_with_stragglerkit_all_reduce_after_one_init"
CASES: dict[str, Case] = {
    # case: (world size, (its test, its parameters), its body in tests/api_bodies.py, its arguments)
    "before_init": (2, ("test_using_stragglerkit_before_init_says_to_call_init", ""), api_bodies.before_init, ()),
    **{
        f"{library}/{n}": (n, (PROGRAM, str(n)), api_bodies.torch_program, (library,))
        for n in (2, 3, 5)
        for library in ("torch", "stragglerkit")
    },
    "init_twice": (
        3,
        ("test_init_twice_is_refused_and_destroy_allows_another", ""),
        api_bodies.init_twice_then_again,
        (),
    ),
    "unsupported_op": (
        3,
        ("test_an_unsupported_op_fails_on_its_rank_and_is_reported_to_the_others", ""),
        api_bodies.unsupported_op_on_rank_0,
        (),
    ),
}


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest) -> Callable[[str], dict[int, Any]]:
    """``launches(case)``: {rank: what the case's body returned}, from one process group per world
    size that runs the cases of the tests selected in this session (tests/_launch.py)."""
    return launched(request, CASES, timeout=600.0)


def _tensor(bits: bytes, dtype: torch.dtype) -> torch.Tensor:
    """A result as the rank body sent it (its bytes)."""
    return torch.frombuffer(bytearray(bits), dtype=torch.uint8).view(dtype) if bits else torch.empty(0, dtype=dtype)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_torch_program_runs_with_stragglerkit_all_reduce_after_one_init(
    n: int, launches: Callable[[str], dict[int, Any]]
) -> None:
    """The same program, once with ``dist.all_reduce`` and once with ``stragglerkit.all_reduce``:
    positional ``(tensor, op, group, async_op)``, ``op=``/``group=`` keywords, a user's subgroup,
    Work's ``wait``/``get_future``/``is_completed``; integer results equal torch's, floating ones
    are within the dtype's rounding bound of the exact sum (as torch's are, which may add in
    another order) and have the same bits on every rank."""
    theirs = launches(f"torch/{n}")
    ours = launches(f"stragglerkit/{n}")
    for rank in range(n):
        for library, out in (("torch", theirs[rank]), ("stragglerkit", ours[rank])):
            failed = sorted(check for check, ok in out["work_api"].items() if not ok)
            assert not failed, (library, rank, failed)
        assert ours[rank]["results"].keys() == theirs[rank]["results"].keys()
    assert len(ours[0]["results"]) == 4 * 4 + 3 * 4 + 4 * 4  # sum, avg (floats), subgroup
    for case in ours[0]["results"]:
        dtype_name, numel_text, kind = case.split("/")
        dtype, numel = getattr(torch, dtype_name), int(numel_text)
        ranks = range(n - 1) if kind == "subgroup" else range(n)
        inputs = [api_bodies.program_input(r, dtype, numel, SALT[kind]) for r in ranks]
        first = ours[ranks[0]]["results"][case]
        for rank in ranks:
            assert ours[rank]["results"][case] == first, f"{case}: rank {rank}'s bits differ from rank {ranks[0]}'s"
            got = _tensor(ours[rank]["results"][case], dtype)
            reference = _tensor(theirs[rank]["results"][case], dtype)
            assert got.shape == reference.shape == (numel,), (case, rank, got.shape, reference.shape)
            if not dtype.is_floating_point:
                exact = torch.stack(inputs).sum(0)
                assert torch.equal(got, reference) and torch.equal(got, exact), case
                continue
            exact = torch.stack([x.double() for x in inputs]).sum(0)
            eps, tiny = torch.finfo(dtype).eps, torch.finfo(dtype).tiny
            bound = 2 * len(ranks) * eps * torch.stack([x.double().abs() for x in inputs]).sum(0) + tiny
            if kind == "avg":
                exact = exact / len(ranks)
                bound = bound / len(ranks) + eps * exact.abs() + tiny
            for library, result in (("stragglerkit", got), ("torch", reference)):
                error = (result.double() - exact).abs()
                assert bool(torch.all(error <= bound)), (case, library, rank, float((error / bound).max()))
            assert bool(torch.all((got.double() - reference.double()).abs() <= 2 * bound)), (case, rank)


def test_a_world_of_one_rank_leaves_the_tensor_and_warns_of_nothing() -> None:
    checks = run_group(1, api_bodies.world_of_one)[0]
    failed = sorted(check for check, ok in checks.items() if not ok)
    assert checks and not failed, failed


def test_using_stragglerkit_before_init_says_to_call_init(launches: Callable[[str], dict[int, Any]]) -> None:
    if dist.is_initialized():
        pytest.skip("this process has a default group")
    for call in (lambda: stragglerkit.all_reduce(torch.ones(3)), stragglerkit.last_run):
        with pytest.raises(NotInitializedError, match=r"stragglerkit\.init\(\)"):
            call()
    assert not stragglerkit.is_initialized()
    results = launches("before_init")
    for rank, out in results.items():
        for name in ("all_reduce", "last_run"):
            assert out[name].startswith("NotInitializedError"), (rank, name, out[name])
            assert "call stragglerkit.init() on every rank" in out[name], (rank, name, out[name])
        assert out["is_initialized"] == "False"


def test_an_unsupported_op_fails_on_its_rank_and_is_reported_to_the_others(
    launches: Callable[[str], dict[int, Any]],
) -> None:
    """Rank 0 passes ReduceOp.MAX, the others SUM: rank 0 raises a ConfigError naming the ops it can
    do, and the others a PeerError naming rank 0 within seconds (their timeout is 300 s)."""
    n = 3
    results = launches("unsupported_op")
    refused = results[0]
    assert refused["error"].startswith("ConfigError") and "ValueError" in refused["kinds"], refused
    assert "ReduceOp.SUM" in refused["error"] and "ReduceOp.AVG" in refused["error"], refused
    assert "MAX" in refused["error"], refused
    for rank in range(1, n):
        out = results[rank]
        assert out["error"].startswith("PeerError") and out["peer"] == 0, (rank, out)
        assert "rank 0 failed (invalid arguments" in out["error"], (rank, out)
        assert out["seconds"] < 10.0, (rank, out)


def test_last_run_says_what_ran() -> None:
    n = 4
    results = run_group(n, api_bodies.what_ran)
    for rank, out in results.items():
        assert out["before"] is None
        assert out["stragglar"] == ("stragglar", "stragglar", True), (rank, out)
        assert out["auto_straggler"] == ("auto", "stragglar", True), (rank, out)
        assert out["ring"] == ("ring", "ring", True), (rank, out)
        assert out["async"] == "stragglar", (rank, out)


def test_init_twice_is_refused_and_destroy_allows_another(launches: Callable[[str], dict[int, Any]]) -> None:
    n = 3
    results = launches("init_twice")
    total = float(sum(range(n)))
    for rank, out in results.items():
        assert out["second"].startswith("ConfigError") and "already called" in out["second"], (rank, out)
        assert "stragglerkit.destroy" in out["second"], (rank, out)
        assert out["first_sum"] == [total] * 5 and out["second_sum"] == [total] * 5, (rank, out)
        assert out["after_destroy"] is False and out["timeout"] == 60.0, (rank, out)

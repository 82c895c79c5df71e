"""``stragglerkit.straggler_aware`` without Horovod: on a gloo group over loopback it trains like
data parallelism written by hand (each gradient all-reduced, then divided), with Horovod's
options; a late rank moves the buckets to StragglAR; bad input, models that differ across ranks
and a rank that dies or stalls are named on every rank.

The runs of one world size that end cleanly share one process group (:func:`launches`), one after
the other, each from a clean slate (tests/_dist.py, ``several``)."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import straggler_aware_bodies
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _dist import run_group
from _launch import Case
from _launch import launches as launched

import stragglerkit
from stragglerkit.integrations.optimizer_buckets import BUCKET_BYTES, bucket_cap

CASES: dict[str, dict[str, Any]] = {
    "instance": {},
    "class": {"form": "class", "in_place_zero": True},
    "function": {"form": "function"},
    "two_backward_passes": {"passes": 2},
    "synchronize_clip_skip": {"clip": True},
    "op_sum": {"op": "sum"},
    "op_reduceop_sum": {"op": "ReduceOp.SUM"},
    "op_reduceop_avg": {"op": "ReduceOp.AVG"},
    "predivide": {"predivide": 4.0},
    "float64_compression": {"compression": "float64"},
    "fp16_compression": {"compression": "fp16"},
    "sparse_gradients": {"sparse": True},
}

DIFFERENCES = {
    "shape": "parameter 2: rank 1 has '2.weight' of shape (9, 192) float32, rank 0 has '2.weight' of shape (8, 192)",
    "dtype": "parameter 0: rank 1 has '0.weight' of shape (192, 64) float64, rank 0 has '0.weight' of shape (192, 64)",
    "count": "parameter 4: rank 1 has '3.weight' of shape (8, 8) float32 there, rank 0 has no parameter",
}
"""What every rank's error says when rank 1's model differs from rank 0's in one way."""


STEPS = 12
"""Steps of each case of CASES."""

LAUNCHED: dict[str, Case] = {
    # case: (world size, (its test, its parameters), its body in tests/straggler_aware_bodies.py, its arguments)
    **{
        f"cases/{n}": (
            n,
            ("test_trains_like_data_parallelism_by_hand_in_every_form_and_option", str(n)),
            straggler_aware_bodies.cases_side_by_side,
            (STEPS, CASES),
        )
        for n in (2, 3)
    },
    "norm_first": (
        3,
        ("test_buckets_take_the_order_the_first_step_made_the_gradients_ready", ""),
        straggler_aware_bodies.cases_side_by_side,
        (6, {"norm_first": {"norm_first": True}}),
    ),
    "bad_input": (2, ("test_bad_input_is_named", ""), straggler_aware_bodies.bad_input, ()),
    "mismatched": (
        3,
        ("test_parameters_that_differ_across_ranks_are_named_on_every_rank", ""),
        straggler_aware_bodies.mismatched_parameters,
        (),
    ),
    "close": (  # the folder of the event logs is added
        2,
        ("test_close_ends_the_loop_and_writes_its_last_records", ""),
        straggler_aware_bodies.close_writes_the_last_records,
        (),
    ),
}


@pytest.fixture(scope="module")
def event_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of test_close_ends_the_loop_and_writes_its_last_records's event logs."""
    return tmp_path_factory.mktemp("event_logs")


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest, event_logs: Path) -> Callable[[str], dict[int, Any]]:
    """``launches(case)``: {rank: what the case's body returned}, from one process group per world
    size that runs the cases of the tests selected in this session (tests/_launch.py)."""
    size, test, body, args = LAUNCHED["close"]
    return launched(request, {**LAUNCHED, "close": (size, test, body, (str(event_logs), *args))})


def _check_same_training(name: str, results: dict[int, Any], steps: int, tolerance: float = 1e-5) -> None:
    for rank, result in results.items():
        assert len(result["diffs"]) == steps, (name, rank)
        assert max(result["diffs"]) <= tolerance * max(result["scale"], 1.0), (name, rank, result["diffs"])
    assert all(r["ours"] == results[0]["ours"] for r in results.values()), f"{name}: the ranks' parameters differ"


@pytest.mark.parametrize("n", [2, 3])
def test_trains_like_data_parallelism_by_hand_in_every_form_and_option(
    n: int, launches: Callable[[str], dict[int, Any]]
) -> None:
    """12 steps per case; every case's parameters within 1e-5 of the reference at every step
    (fp16 compression: within its rounding) and bit-identical on every rank."""
    steps = STEPS
    results = launches(f"cases/{n}")
    for name in CASES:
        by_rank = {rank: results[rank][name] for rank in range(n)}
        _check_same_training(name, by_rank, steps, 2e-3 if name == "fp16_compression" else 1e-5)
        for result in by_rank.values():
            assert result["is_sgd"] and result["class"] == ("MySGD" if name == "class" else "SGD"), (name, result)
            # nothing is wrong: the group's own all_reduce (on 3 ranks, and the ring's link probes)
            assert "allreduce" in result["ran"] and set(result["ran"]) <= {"allreduce", "ring"}, (name, result["ran"])
    assert results[0]["float64_compression"]["compress_calls"] >= steps


def test_buckets_take_the_order_the_first_step_made_the_gradients_ready(
    launches: Callable[[str], dict[int, Any]],
) -> None:
    """A model that registers its norm last but applies it first, in 256-byte buckets: the first
    step's buckets go in reverse registration order (the norm first); from the second step on,
    every rank's buckets go in rank 0's ready order (the norm last), and the model still trains
    like data parallelism by hand, identically on every rank."""
    steps, n = 6, 3
    results = launches("norm_first")
    by_rank = {rank: results[rank]["norm_first"] for rank in range(n)}
    _check_same_training("norm_first", by_rank, steps)
    first, second, third = by_rank[0]["layouts"]
    assert len(first) > 2, first  # several buckets, or the order could not matter
    order = [name for bucket in first for name in bucket]
    learned = [name for bucket in second for name in bucket]
    assert {*order[:2]} == {"norm.weight", "norm.bias"}, order
    assert {*learned[:2]} == {"down.weight", "down.bias"} and {*learned[-2:]} == {"norm.weight", "norm.bias"}, learned
    assert third == second, "the layout is learned once, from the first step"
    assert all(result["layouts"] == by_rank[0]["layouts"] for result in by_rank.values()), "the ranks' buckets differ"


def test_the_bucket_cap_is_an_eighth_of_the_gradients_from_1_to_25_mib() -> None:
    assert bucket_cap(50 << 20) == (50 << 20) // 8
    assert bucket_cap(4 << 30) == BUCKET_BYTES == 25 << 20
    assert bucket_cap(3 << 20) == bucket_cap(0) == 1 << 20


def test_a_late_rank_switches_the_buckets_to_stragglar_with_the_same_parameters() -> None:
    """4 ranks, rank 3 late by 30 ms from step 5: the buckets move off the group's all_reduce to
    StragglAR at the same step on every rank, and the parameters stay the reference's."""
    steps = 60
    results = run_group(4, straggler_aware_bodies.train_side_by_side, steps, {}, 3, 0.03)
    _check_same_training("late rank", results, steps)
    assert all(r["events"] == results[0]["events"] for r in results.values())
    assert "stragglar" in results[0]["ran"] and "allreduce" in results[0]["ran"], (
        results[0]["ran"],
        results[0]["events"],
    )


def test_bad_input_is_named(launches: Callable[[str], dict[int, Any]]) -> None:
    results = launches("bad_input")
    for rank, errors in results.items():
        expected = {
            "twice": ("ConfigError", "already distributed"),
            "not_an_optimizer": ("ConfigError", "int"),
            "duplicate_names": ("ConfigError", "'same'"),
            "not_pairs": ("ConfigError", "(name, parameter) pairs"),
            "unnamed": ("ConfigError", "4 of the optimizer's 6 parameters are not in it"),
            "passes": ("ConfigError", "backward_passes_per_step must be > 0"),
            "op": ("ConfigError", "'max'"),
            "predivide_with_sum": ("ConfigError", "gradient_predivide_factor"),
            "process_set": ("ConfigError", "process_set"),
            "groups": ("ConfigError", "groups asks for Horovod's grouped allreduce"),
            "num_groups": ("ConfigError", "num_groups asks for Horovod's grouped allreduce"),
            "compression": ("ConfigError", "compression must have compress"),
            "zero_grad_in_flight": ("StragglerKitError", "optimizer.zero_grad() was called after loss.backward()"),
            "too_many_passes": ("ConfigError", "more than backward_passes_per_step (1) times"),
        }
        for case, (kind, text) in expected.items():
            assert errors[case].startswith(kind) and text in errors[case], (rank, case, errors[case])
        if rank == 1:
            assert "'same'" in errors["one_rank_duplicates"], errors["one_rank_duplicates"]
        else:
            assert "rank 1 refused its arguments" in errors["one_rank_duplicates"], errors["one_rank_duplicates"]
        assert float(errors["one_rank_seconds"]) < 30.0, errors  # not the timeout (300 s)


def test_without_horovod_or_torch_distributed_it_says_what_to_call() -> None:
    assert not dist.is_initialized()
    with pytest.raises(stragglerkit.ConfigError, match=r"hvd\.init\(\).*dist\.init_process_group.*stragglerkit\.init"):
        stragglerkit.straggler_aware(torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1))


def test_a_world_of_one_rank_steps_exactly_like_the_plain_optimizer() -> None:
    result = run_group(1, straggler_aware_bodies.one_rank)[0]
    assert result == {"equal": True, "loop": True, "state_dict_keys": True}, result


def test_parameters_that_differ_across_ranks_are_named_on_every_rank(launches: Callable[[str], dict[int, Any]]) -> None:
    """3 ranks; rank 1 (and in ``count`` rank 2 too) builds another model: every rank raises the
    same ConfigError naming rank 1 and the first parameter that differs. Other values alone are
    not an error (they are broadcast afterwards)."""
    results = launches("mismatched")
    for rank, errors in results.items():
        assert errors["values"] == "no error", (rank, errors["values"])
        for kind, text in DIFFERENCES.items():
            assert errors[kind].startswith("ConfigError") and text in errors[kind], (rank, kind, errors[kind])
            assert errors[kind] == results[0][kind], (rank, kind)  # the same words on every rank
        assert "rank 1 has 6 parameters, rank 0 has 4" in errors["count"], errors["count"]


def _fault_entry(rank: int, n: int, store_path: str, queue: Any, fault: str, step: int, timeout: float) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, n), rank=rank, world_size=n)
    try:
        queue.put((rank, straggler_aware_bodies.faulty_rank(rank, n, fault, step, timeout)))
    except BaseException:
        queue.put((rank, {"error": "crashed", "message": traceback.format_exc()}))
    queue.close()
    queue.join_thread()
    os._exit(0)  # the group is broken: do not wait for its threads


@pytest.mark.parametrize("fault", ["dies", "stalls"])
def test_a_rank_that_dies_or_stalls_is_named_on_every_other_rank_within_the_timeout(fault: str) -> None:
    """3 ranks, rank 2 exits or stalls at step 6 (after the warm-up): ranks 0 and 1 raise
    PeerError naming rank 2 within the timeout (3 s) plus the report window (2 s), never hang."""
    n, step, timeout = 3, 6, 3.0
    ctx = mp.get_context("spawn")
    queue: multiprocessing.Queue[Any] = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        args = (n, path, queue, fault, step, timeout)
        procs = [ctx.Process(target=_fault_entry, args=(rank, *args), daemon=True) for rank in range(n)]
        for p in procs:
            p.start()
        expected = n - 1 if fault == "dies" else n
        results = dict(queue.get(timeout=120) for _ in range(expected))
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    for rank in (0, 1):
        outcome = results[rank]
        assert outcome["error"] == "PeerError" and outcome["peer"] == 2, outcome
        assert f"rank 2 did not reach step {step}" in outcome["message"], outcome
        assert outcome["seconds"] < timeout + 2.0 + 5.0, outcome  # timeout + report window + loaded cores


def test_close_ends_the_loop_and_writes_its_last_records(launches: Callable[[str], dict[int, Any]]) -> None:
    results = launches("close")
    for rank in (0, 1):
        assert results[rank]["kinds"][0] == "run", results[rank]
    assert results[0]["running"] and results[0]["stopped"], results[0]
    steps = [s for window in results[0]["windows"] for s in window]
    assert steps and steps == list(range(len(steps))), steps

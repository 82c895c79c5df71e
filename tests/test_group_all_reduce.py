"""Weighted group AllReduce on real gloo process groups of 3, 4 and 5 ranks.

Each world runs, in one process group, several sets of disjoint groups (every subset size, ranks
in no group, groups of one) x float32/float64/bfloat16/float16 x sizes 0, 1, 7, 1001 and 2^20+3
(tests/group_reduce_bodies.py). Members must hold their group's weighted average within the
dtype's rounding bound of the float64 reference and have the same bytes as each other; ranks in
no group must keep their tensor's bytes; bad arguments give ConfigError on every rank, and a
plain AllReduce afterwards still works. Each world ends with one failure: tensors of different
sizes between members (n = 3), bad weights on one rank only (n = 4), members given different
weights (n = 5).
"""

from __future__ import annotations

from _dist import run_group
from group_reduce_bodies import CASES, sweep


def check_results(n: int, results: dict[int, dict]) -> None:
    for rank in range(n):
        r = results[rank]
        assert r["after"] == [float(n)] * 3, f"rank {rank}: the AllReduce after the group calls gave {r['after']}"
        errors = r["errors"]
        assert "rank 1 is in group 0 and in group 1: groups must not overlap" in errors["overlap"]
        assert f"names rank {n}, which is not a rank of this {n}-rank group" in errors["out_of_range"]
        assert "group 1 is empty" in errors["empty_group"]
        assert "weights[0] must hold one weight per member of group 0" in errors["weights_shape"]
        assert "the weight of rank 1 in group 0 must be a finite number >= 0" in errors["negative"]
        assert "needs a floating-point tensor, got torch.int64" in errors["integer"]
        bad = {case: ratio for case, ratio in r["worst"].items() if not ratio <= 1.0}
        assert not bad, f"n={n} rank {rank}: error above the dtype's bound (ratio > 1): {bad}"
        changed = [case for case, same in r["untouched"].items() if not same]
        assert not changed, f"n={n} rank {rank} is in no group but its tensor changed: {changed}"
    for case, (groups, _) in enumerate(CASES[n]):
        members = {rank for group in groups for rank in group}
        for rank in range(n):
            mine = [key for key in results[rank]["digests"] if key.startswith(f"{case}/")]
            others = [key for key in results[rank]["untouched"] if key.startswith(f"{case}/")]
            assert (mine and not others) if rank in members else (others and not mine), (n, case, rank)
        for group in groups:
            lead = results[group[0]]["digests"]
            for rank in group[1:]:
                for key, value in results[rank]["digests"].items():
                    if key.startswith(f"{case}/"):
                        assert value == lead[key], f"n={n} {key}: rank {rank} differs from rank {group[0]}"


def test_three_ranks_and_mismatched_sizes() -> None:
    results = run_group(3, sweep, "mismatched_sizes")
    check_results(3, results)
    for rank in (0, 1):
        ending = results[rank]["ending"]
        assert ending["outcome"].startswith("PeerError"), ending
        assert "elements" in ending["outcome"] and "every rank must pass a tensor of the same size" in ending["outcome"]
        assert ending["seconds"] < 30, ending  # told at once, not after the 60 s timeout
    ending = results[2]["ending"]  # in no group: done at once, or told of the members' failure
    assert ending["value"] == [1.0] * 8
    assert ending["outcome"] == "ok" or ending["outcome"].startswith("PeerError"), ending


def test_four_ranks_and_bad_weights_on_one_rank() -> None:
    results = run_group(4, sweep, "bad_weights_on_one_rank")
    check_results(4, results)
    first = results[0]["ending"]
    assert first["outcome"].startswith("ConfigError") and "rank 1 in group 0" in first["outcome"], first
    partner = results[1]["ending"]  # waits for rank 0's data: told that rank 0 failed
    assert partner["outcome"].startswith("PeerError(peer=0)"), partner
    assert partner["seconds"] < 30, partner
    for rank in (2, 3):  # the other group: finishes, unless rank 0's note reached it first
        ending = results[rank]["ending"]
        assert ending["outcome"] == "ok" or ending["outcome"].startswith("PeerError(peer=0)"), ending
        if ending["outcome"] == "ok":
            assert ending["value"] == [2.5] * 5


def test_five_ranks_and_different_weights() -> None:
    results = run_group(5, sweep, "different_weights")
    check_results(5, results)
    for rank in (0, 1, 2):  # the members of the group whose weights disagree: found it, or told of it
        outcome = results[rank]["ending"]["outcome"]
        assert outcome.startswith("PeerError") and ("runs a different plan" in outcome or "plan mismatch" in outcome)
        assert results[rank]["ending"]["seconds"] < 30, results[rank]["ending"]
    for rank in (3, 4):  # the other group: finishes, unless a note of the failure reached it first
        ending = results[rank]["ending"]
        assert ending["outcome"] == "ok" or ending["outcome"].startswith("PeerError"), ending
        if ending["outcome"] == "ok":
            assert ending["value"] == [3.5] * 6

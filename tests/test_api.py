"""all_reduce (blocking and async_op=True): algorithm choice, fallback, async order, rank maps, timings."""

from __future__ import annotations

import api_bodies
import pytest
from _dist import run_group

from stragglerkit.planner.choice import choose_algorithm
from stragglerkit.schedules.registry import Situation


def test_auto_rule() -> None:
    """``auto`` with the default model: the ring (rhd below one element per rank) unless an
    algorithm built for the situation is predicted 5 % faster (planner/choice.py)."""
    assert choose_algorithm("auto", Situation(world_size=8), 10_000) == ("ring", None)
    assert choose_algorithm("auto", Situation(world_size=8, straggler=3), 10_000) == ("stragglar", None)
    assert choose_algorithm("auto", Situation(world_size=8, straggler=3), 1 << 20) == ("stragglar", None)
    # a NIC near full rate: the balanced ring (predicted faster than OptCC's plan for 32 MiB)
    eighth = Situation(world_size=8, slowdowns={2: 8 / 7})
    assert choose_algorithm("auto", eighth, 8 * 2**20) == ("balanced_ring", None)
    assert choose_algorithm("auto", Situation(world_size=8, slowdowns={2: 2.0}), 8 * 2**20) == ("optcc", None)
    # small buckets are latency-bound: neither NIC plan pays its extra messages there
    assert choose_algorithm("auto", Situation(world_size=8, slowdowns={2: 4.0}), 10_000) == ("ring", None)
    assert choose_algorithm("auto", eighth, 100_000) == ("ring", None)
    assert choose_algorithm("auto", Situation(world_size=8), 5) == ("rhd", None)
    # odd world: StragglAR does not apply, the baseline runs
    assert choose_algorithm("auto", Situation(world_size=7, straggler=3), 10_000) == ("ring", None)


def test_named_algorithm_that_does_not_apply_falls_back_with_a_reason() -> None:
    chosen, why = choose_algorithm("stragglar", Situation(world_size=5, straggler=1), 1000)
    assert chosen == "ring"
    assert why is not None and "stragglar does not apply" in why and "even world size" in why and "ring" in why
    chosen, why = choose_algorithm("optcc", Situation(world_size=4), 1000)
    assert chosen == "ring" and why is not None and "degraded" in why
    assert choose_algorithm("rhd", Situation(world_size=5), 1000) == ("rhd", None)


def test_unknown_algorithm() -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'fastest'"):
        choose_algorithm("fastest", Situation(world_size=4), 10)


def test_api_on_a_real_group() -> None:
    n = 3
    results = run_group(n, api_bodies.api_features)
    for rank, out in results.items():
        assert out["fallback_ran"] == ["ring", "ring"]
        assert len(out["fallback_warnings"]) == 1, out["fallback_warnings"]
        assert "stragglar does not apply" in out["fallback_warnings"][0]
        assert out["async_ring"] == "ring" and out["future_is_tensor"]
        assert out["async_values"] == [6.0, 2.0, 6.0]
        assert out["remapped_ok"]
        assert out["remapped_peers"] == sorted({(rank + 1) % n, (rank - 1) % n})
        # ring: 2(n-1) sends + 2(n-1) receives of 4096/n floats each
        assert out["timing_rows"] == 4 * (n - 1) and out["timings_sane"]
        assert abs(out["timing_bytes"] - 4 * (n - 1) * 4096 * 4 / n) <= 4 * (n - 1) * 64

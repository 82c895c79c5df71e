"""Lower bounds of optcc.txt §3 against an independent numeric min-max and the paper's Table 1."""

from __future__ import annotations

import numpy as np
import pytest

from stragglerkit.sim import optcc_bounds as ob


def _minmax(p: int, slowdown: float, tight: bool) -> float:
    """min over z >= 1 of the max of the bottleneck terms (proofs of Theorems 1 and 6), on a grid."""
    z = np.linspace(1.0, 4.0, 300001)
    healthy = 2.0 + ((slowdown - 2.0) * z if tight else -z) / (p - 1)
    return float(np.min(np.maximum(healthy, slowdown * z)))


@pytest.mark.parametrize("p", [3, 5, 16, 64, 256])
@pytest.mark.parametrize("slowdown", [1.0, 1.14, 8 / 7, 1.5, 2.0, 3.0])
def test_single_straggler_bounds_solve_their_minmax(p: int, slowdown: float) -> None:
    assert ob.theorem1_bound(p, slowdown) == pytest.approx(_minmax(p, slowdown, tight=False), rel=1e-4)
    assert ob.theorem6_bound(p, slowdown) == pytest.approx(_minmax(p, slowdown, tight=True), rel=1e-4)
    assert ob.theorem6_bound(p, slowdown) >= ob.theorem1_bound(p, slowdown) - 1e-12


@pytest.mark.parametrize("p", [4, 16, 128])
def test_no_fault_gives_t0_and_table1_expansion(p: int) -> None:
    t0 = ob.fault_free_time(p)
    assert ob.theorem1_bound(p, 1.0) == pytest.approx(t0)
    assert ob.theorem6_bound(p, 1.0) == pytest.approx(t0)
    slowdown = 1.5  # Table 1: (1 + (l-1)/(l p) + O(1/p^2)) T0
    approx = (1 + (slowdown - 1) / (slowdown * p)) * t0
    assert abs(ob.theorem1_bound(p, slowdown) - approx) < 4.0 / p**2


def test_special_cases_reduce_to_theorem1() -> None:
    for p, slowdown in [(5, 1.3), (32, 2.0), (64, 4.0)]:
        assert ob.theorem2_bound(p, [slowdown]) == pytest.approx(ob.theorem1_bound(p, slowdown))
        assert ob.theorem3_bound(p, 1, slowdown) == pytest.approx(ob.theorem1_bound(p, slowdown))
        assert ob.theorem13_bound(p, 1, slowdown) == pytest.approx(ob.theorem6_bound(p, slowdown))


def test_multi_straggler_bound_balances_or_is_capped_by_the_worst() -> None:
    p, ls = 32, [1.5, 1.2]
    balanced = 2 * 31 / (30 + 1 / 1.5 + 1 / 1.2)
    assert ob.theorem2_bound(p, ls) == pytest.approx(balanced)
    assert ob.theorem2_bound(p, [3.0, 1.2]) == pytest.approx(3.0)


def test_multigpu_bounds_scale_with_servers() -> None:
    # 8 GPUs per server, 16 servers: the bound is the single-GPU bound on q servers, divided by g
    assert ob.theorem13_bound(128, 8, 1.5) == pytest.approx(ob.theorem6_bound(16, 1.5) / 8)
    assert ob.theorem3_bound(128, 8, 3.0) == pytest.approx(3.0 / 8)


def test_closed_forms_match_the_paper_limits() -> None:
    # eq. (2) at l = 2 is 2n (k+1)/k, continuous with eq. (1)
    assert ob.optcc_single_time(16, 2.0 - 1e-12, 64) == pytest.approx(ob.optcc_single_time(16, 2.0, 64))
    # App. C: overhead over T0 at most 1 + 1/(p-1) (k -> infinity)
    for p in (5, 16, 64):
        for slowdown in (1.1, 1.5, 1.99):
            ratio = ob.optcc_single_time(p, slowdown, 10**9) / ob.fault_free_time(p)
            assert 1.0 <= ratio <= 1 + 1 / (p - 1) + 1e-9
    assert ob.optcc_multi_time(7, [1.5, 1.5], 10**9) == pytest.approx(2 * 6 / 5)
    assert ob.optcc_multigpu_time(64, 8, 3.0, 10**9) == pytest.approx(3.0 / 8)
    assert ob.ring_degraded_time(8, [2.0]) == pytest.approx(2 * ob.fault_free_time(8))


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="p >= 3"):
        ob.theorem1_bound(2, 1.5)
    with pytest.raises(ValueError, match="slowdown"):
        ob.theorem6_bound(8, 0.5)
    with pytest.raises(ValueError, match="divide"):
        ob.theorem3_bound(10, 4, 1.5)


def test_all_links_bound_counts_nvlink() -> None:
    # g = 1: no NVLink, the counting argument of Theorem 1's first branch
    for p, slowdown in [(5, 1.5), (16, 8 / 7), (64, 1.14)]:
        balanced = 2 * slowdown * (p - 1) / (slowdown * (p - 1) + 1)
        assert ob.all_links_bound(p, 1, slowdown) == pytest.approx(balanced)
    # v = g - 1: (2n/g)(p-1)/(p-1+1/l), e.g. p = 32, g = 4, l = 8/7: 0.5 * 31/31.875
    assert ob.all_links_bound(32, 4, 8 / 7) == pytest.approx(0.5 * 31 / 31.875)
    assert ob.all_links_bound(32, 4, 8 / 7) > ob.theorem13_bound(32, 4, 8 / 7)
    # infinitely fast NVLink leaves nothing of it
    assert ob.all_links_bound(32, 4, 2.0, nvlink=1e12) < 1e-9
    with pytest.raises(ValueError, match="nvlink"):
        ob.all_links_bound(32, 4, 2.0, nvlink=-1.0)


def test_attached_limit_is_the_per_body_work() -> None:
    # p = 16, two stragglers at 8/7: q = 14 healthy, each body 2*13 + 16/7 section-times
    assert ob.attached_limit(16, [8 / 7, 8 / 7]) == pytest.approx((26 + 16 / 7) / 14)
    assert ob.attached_limit(32, [3.0, 1.5]) == pytest.approx(3.0)  # the slowest straggler's q sections
    # never above App. D.3's limit: equal when every l_i = 2, below by D.3's 2(m-1)/q term for large l_1
    for p, ls in [(16, [1.5, 2.0]), (32, [1.33, 1.33, 1.33]), (64, [4.0, 4.0]), (20, [2.0, 2.0])]:
        assert ob.attached_limit(p, ls) <= ob.optcc_multi_time(p, ls, 10**9) + 1e-9
        assert ob.attached_limit(p, ls) >= ob.theorem2_bound(p, ls) - 1e-9
    assert ob.attached_limit(20, [2.0, 2.0]) == pytest.approx(ob.optcc_multi_time(20, [2.0, 2.0], 10**9), rel=1e-8)
    assert ob.attached_limit(32, [3.0, 3.0]) == pytest.approx(ob.optcc_multi_time(32, [3.0, 3.0], 10**9) - 2 / 30)

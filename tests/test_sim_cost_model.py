"""GenModel cost terms from the IR versus stragglar.txt Table 1, and fitting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stragglerkit.schedules import ScheduleBuilder, direct, rhd, ring, stragglar
from stragglerkit.sim import CostModel, CostTerms, cost_terms, fit

ALPHA, BETA, S = 3e-6, 1 / 450e9, 2**30
AB = CostModel(CostModel.Config(alpha=ALPHA, beta=BETA))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 13, 16, 24, 32])
def test_ring_matches_table_1(n: int) -> None:
    terms = cost_terms(ring(n), S)
    assert terms.A == 2 * (n - 1)
    assert terms.B == pytest.approx(2 * (n - 1) / n * S, rel=1e-12)
    assert AB.predict(ring(n), S) == pytest.approx(2 * (n - 1) * ALPHA + 2 * (n - 1) / n * S * BETA, rel=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32, 64])
def test_rhd_matches_table_1_at_powers_of_two(n: int) -> None:
    log_n = int(math.log2(n))
    assert AB.predict(rhd(n), S) == pytest.approx(2 * log_n * ALPHA + 2 * (n - 1) / n * S * BETA, rel=1e-12)
    assert cost_terms(rhd(n), S).A == 2 * log_n


@pytest.mark.parametrize("n", [6, 12])
def test_rhd_other_sizes_pay_two_whole_buffer_rounds(n: int) -> None:
    p = 1 << (n.bit_length() - 1)
    terms = cost_terms(rhd(n), S)
    assert terms.A == 2 * math.log2(p) + 2
    assert terms.B == pytest.approx(2 * (p - 1) / p * S + 2 * S, rel=1e-12)


@pytest.mark.parametrize("n", [4, 8, 16, 32])
def test_direct_with_hidden_pre_allreduce_is_log_n_broadcast(n: int) -> None:
    log_n = int(math.log2(n))
    predicted = AB.predict(direct(n), S, hidden_phases=("pre_allreduce",))
    assert predicted == pytest.approx(log_n * ALPHA + log_n * S * BETA, rel=1e-12)
    # not hiding it adds the punctual ranks' ring AllReduce on n-1 chunks
    whole = AB.predict(direct(n), S)
    assert whole == pytest.approx(predicted + 2 * (n - 2) * (ALPHA + S / (n - 1) * BETA), rel=1e-12)


@pytest.mark.parametrize("n", [4, 8, 16, 32, 64])
def test_stragglar_matches_table_1_with_pre_phase_hidden(n: int) -> None:
    rounds = n + int(math.log2(n)) - 2
    sched = stragglar(n)
    terms = cost_terms(sched, S, hidden_phases=("reduce_scatter",))
    assert terms.A == rounds
    assert terms.B == pytest.approx(rounds / (n - 1) * S, rel=1e-12)
    assert AB.predict(sched, S, hidden_phases=("reduce_scatter",)) == pytest.approx(
        rounds * ALPHA + rounds / (n - 1) * S * BETA, rel=1e-12
    )


@pytest.mark.parametrize("n", [4, 8])
def test_reduction_terms_follow_the_critical_path(n: int) -> None:
    weights = CostModel.Config(alpha=ALPHA, beta=BETA, gamma=1e-12, delta=1e-13)
    terms = cost_terms(ring(n), S, weights=weights)
    # the ring's reduce-scatter reduces one chunk per step on the path; the all-gather none
    assert terms.C == pytest.approx((n - 1) / n * S, rel=1e-12)
    assert terms.D == pytest.approx(3 * terms.C, rel=1e-12)
    assert terms.w == 1
    model = CostModel(weights)
    assert model.predict(ring(n), S) == pytest.approx(
        terms.A * ALPHA + terms.B * BETA + terms.C * 1e-12 + terms.D * 1e-13, rel=1e-12
    )


def test_incast_degree_and_epsilon_term() -> None:
    b = ScheduleBuilder(4, 3)
    for s in range(3):
        b.send(s, 3, (s, s + 1))
        b.recv(3, s, (s, s + 1), scratch=s)
    sched = b.build("incast")
    terms = cost_terms(sched, 3e9)
    assert (terms.A, terms.B, terms.w) == (1.0, 1e9, 3)
    model = CostModel(CostModel.Config(alpha=0.0, beta=1e-9, epsilon=2e-10, incast_threshold=1))
    assert model.predict(sched, 3e9) == pytest.approx(1.0 + 2 * 1e9 * 2e-10)


def test_cost_terms_refuses_unknown_hidden_phase() -> None:
    with pytest.raises(ValueError, match="hidden phase 'reduce_scatterr'"):
        cost_terms(ring(4), S, hidden_phases=("reduce_scatterr",))
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        CostModel.Config(alpha=-1.0)


def _synthetic(rng: np.random.Generator, count: int) -> list[CostTerms]:
    return [
        CostTerms(
            A=float(rng.integers(2, 300)),
            B=float(rng.uniform(1e5, 4e9)),
            C=float(rng.uniform(0, 2e9)),
            D=float(rng.uniform(0, 6e9)),
            w=int(rng.integers(1, 6)),
        )
        for _ in range(count)
    ]


def test_fit_recovers_known_parameters_from_noisy_samples() -> None:
    rng = np.random.default_rng(7)
    truth = CostModel.Config(
        alpha=5e-6, beta=1 / 100e9, gamma=1 / 300e9, delta=1 / 900e9, epsilon=1 / 400e9, incast_threshold=2
    )
    model = CostModel(truth)
    samples = [(t, model.predict_terms(t) * (1 + rng.normal(0, 0.01))) for t in _synthetic(rng, 200)]
    result = fit(samples, incast_threshold=2)
    for name in ("alpha", "beta", "gamma", "delta", "epsilon"):
        assert getattr(result.config, name) == pytest.approx(getattr(truth, name), rel=0.1), name
    assert 0.005 < result.relative_rms < 0.02
    assert result.max_relative_error < 0.05
    assert result.num_samples == 200 and result.unidentified == ()


def test_fit_alpha_beta_from_real_schedules() -> None:
    rng = np.random.default_rng(3)
    truth = CostModel(CostModel.Config(alpha=20e-6, beta=1 / 12e9))
    samples = []
    for gen, n in ((ring, 8), (rhd, 8), (ring, 16), (rhd, 6)):
        for size in (2**10, 2**16, 2**22, 2**28):
            terms = cost_terms(gen(n), size)
            samples.append((terms, truth.predict_terms(terms) * (1 + rng.normal(0, 0.02))))
    result = fit(samples, params=("alpha", "beta"))
    assert result.config.alpha == pytest.approx(20e-6, rel=0.1)
    assert result.config.beta == pytest.approx(1 / 12e9, rel=0.05)
    assert (result.config.gamma, result.config.delta, result.config.epsilon) == (0.0, 0.0, 0.0)


def test_fit_refuses_bad_input() -> None:
    terms = cost_terms(ring(8), 2**20)
    with pytest.raises(ValueError, match="at least 3 samples"):
        fit([(terms, 1e-3), (cost_terms(ring(8), 2**24), 2e-3)], params=("alpha", "beta"))
    same_ratio = [(cost_terms(ring(8), 2**20), 1e-3 * k) for k in (1, 2, 3, 4)]
    with pytest.raises(ValueError, match="cannot tell alpha, beta apart"):
        fit(same_ratio, params=("alpha", "beta"))
    with pytest.raises(ValueError, match="positive finite"):
        fit([(terms, 0.0)] * 5)
    with pytest.raises(ValueError, match="CostTerms, measured seconds"):
        fit([(1, 2)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="params must name"):
        fit([(terms, 1.0)] * 5, params=("alpha", "bogus"))
    with pytest.raises(ValueError, match="zero terms"):
        fit([(CostTerms(A=0, B=0, C=0, D=0, w=1), 1.0)] * 5)

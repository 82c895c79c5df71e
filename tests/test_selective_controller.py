"""Selective reduce's controller algorithms (stragglerkit/selective/) on hand-checked cases.

Each case is worked out by hand from the rules of "Progress and Bandwidth Aware Partial Model
Synchronization With Selective Reduce" (Algorithms 1-3, Eq. (2) and (4)); the arithmetic is in the
comments. Pure Python, one process, well under a second.
"""

from __future__ import annotations

import heapq
import math
import random

import pytest

from stragglerkit.errors import ConfigError, PeerError
from stragglerkit.selective import (
    Expected,
    PartialReduceController,
    ProgressModel,
    SelectiveConfig,
    SelectiveReduceController,
    Sync,
    SyncDone,
    Tick,
    WorkerReady,
    bag,
    bpawr,
    iteration_weights,
    ring_time,
)

# --------------------------------------------------------------------------------------------- BAG


def test_bag_extends_a_group_down_to_the_threshold_and_no_further() -> None:
    # p = 2: workers 0 (10) and 1 (9) fill the group; b* = 9 x (1 - 0.3) = 6.3 admits 2 (7), not 3 (5).
    bw = {0: 10.0, 1: 9.0, 2: 7.0, 3: 5.0}
    assert bag([0, 1, 2, 3], 2, 0.3, bw) == [[0, 1, 2], [3]]


def test_bag_threshold_comes_from_the_pth_worker_and_is_inclusive() -> None:
    # b* = 8 x 0.5 = 4: worker 2 at exactly 4 joins; worker 3 at 3.9 opens the next group.
    bw = {0: 10.0, 1: 8.0, 2: 4.0, 3: 3.9, 4: 3.8}
    assert bag([4, 3, 2, 1, 0], 2, 0.5, bw) == [[0, 1, 2], [3, 4]]


def test_bag_fills_p_workers_before_testing_the_threshold() -> None:
    # The first p = 2 join whatever their bandwidth; the 3rd (1 < 9 x 0.7) does not (Algorithm 1's
    # "len(g) <= p" read literally would have admitted it as a (p+1)-th member).
    assert bag([0, 1, 2], 2, 0.3, {0: 10.0, 1: 9.0, 2: 1.0}) == [[0, 1], [2]]


def test_bag_with_eta_zero_makes_groups_of_p_unless_bandwidths_tie() -> None:
    assert bag([0, 1, 2, 3], 2, 0.0, {0: 8.0, 1: 6.0, 2: 4.0, 3: 2.0}) == [[0, 1], [2, 3]]
    assert bag([0, 1, 2, 3], 2, 0.0, {0: 8.0, 1: 6.0, 2: 6.0, 3: 2.0}) == [[0, 1, 2], [3]]


def test_bag_breaks_ties_by_queue_order() -> None:
    assert bag([3, 1, 2], 1, 0.0, {1: 5.0, 2: 5.0, 3: 5.0}) == [[3, 1, 2]]


def test_bag_never_admits_a_worker_below_the_threshold_random() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 24)
        p = rng.randint(1, n)
        eta = rng.choice([0.0, 0.1, 0.3, 0.5, 0.9])
        bw = {w: round(20 * rng.uniform(0.05, 1.0), 3) for w in range(n)}
        queue = rng.sample(range(n), n)
        groups = bag(queue, p, eta, bw)
        assert sorted(w for g in groups for w in g) == list(range(n))
        flat = [bw[w] for g in groups for w in g]
        assert flat == sorted(flat, reverse=True)
        for index, group in enumerate(groups):
            if index + 1 < len(groups):
                assert len(group) >= p
                # The next group's first worker was below this group's threshold.
                assert bw[groups[index + 1][0]] < bw[group[p - 1]] * (1 - eta)
            for worker in group[p:]:
                assert bw[worker] >= bw[group[p - 1]] * (1 - eta)


def test_bag_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match=r"workers \[2\]"):
        bag([0, 2], 1, 0.3, {0: 1.0})
    with pytest.raises(ConfigError, match="eta"):
        bag([0], 1, 1.0, {0: 1.0})
    with pytest.raises(ConfigError, match="p must"):
        bag([0], 0, 0.3, {0: 1.0})


# ----------------------------------------------------------------------------------- progress model


def test_progress_model_conditional_estimates_on_a_known_sample() -> None:
    model = ProgressModel.warm([1.0, 2.0, 3.0, 4.0])
    assert model.cdf(2.5) == 0.5
    assert model.cdf(0.5) == 0.0 and model.cdf(4.0) == 1.0
    # (F(2.5) - F(1.5)) / (1 - F(1.5)) = (0.5 - 0.25) / 0.75
    assert model.finish_within(1.5, 1.0) == pytest.approx(1 / 3)
    # t below every sample: F(t) = 0, so the conditional equals F(t + dt) = F(1.5) = 0.25
    assert model.finish_within(0.5, 1.0) == pytest.approx(0.25)
    # (F(4) - F(3)) / (1 - F(3)) = 0.25 / 0.25
    assert model.finish_within(3.0, 1.0) == pytest.approx(1.0)
    # Past every sample: no evidence it is about to finish.
    assert model.finish_within(5.0, 1.0) == 0.0


def test_progress_model_paper_formula_is_f_of_t_plus_dt() -> None:
    model = ProgressModel.warm([1.0, 2.0, 3.0, 4.0], formula="paper")
    assert model.finish_within(1.5, 1.0) == pytest.approx(0.5)
    assert model.finish_within(5.0, 1.0) == 1.0


def test_progress_model_cold_start_learns_and_warm_start_stays() -> None:
    cold = ProgressModel.cold()
    assert cold.finish_within(0.0, 10.0) == 0.0  # nothing seen yet
    cold.observe(2.0)
    cold.observe(4.0)
    assert len(cold) == 2 and cold.finish_within(0.0, 3.0) == pytest.approx(0.5)
    warm = ProgressModel.warm([2.0])
    warm.observe(100.0)
    assert len(warm) == 1 and warm.finish_within(0.0, 3.0) == 1.0
    learning = ProgressModel.warm([2.0], learn=True)
    learning.observe(100.0)
    assert learning.finish_within(0.0, 3.0) == pytest.approx(0.5)


def test_progress_model_window_forgets_the_oldest() -> None:
    model = ProgressModel(window=2)
    for seconds in (1.0, 5.0, 6.0):
        model.observe(seconds)
    assert len(model) == 2 and model.cdf(1.0) == 0.0 and model.cdf(6.0) == 1.0


def test_progress_model_rejects_bad_input() -> None:
    with pytest.raises(ConfigError, match="at least one"):
        ProgressModel.warm([])
    with pytest.raises(ConfigError, match="iteration time"):
        ProgressModel.warm([1.0, -2.0])
    with pytest.raises(ConfigError, match="formula"):
        ProgressModel(formula="exact")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ BPAWR

# A warm model with every iteration taking 1 s: a worker e < 1 s in finishes within dt = 1 for sure.
SURE = ProgressModel.warm([1.0])


def test_bpawr_holds_a_group_smaller_than_p() -> None:
    d = bpawr({5: 0.1}, [0], 2, 0.0, 1.0, 10.0, {0: 1.0, 5: 1.0}, 1.0, SURE)
    assert d.wait and d.excluded == () and d.remaining == {5: 0.1}


def test_bpawr_waits_to_replace_a_slow_worker() -> None:
    # g = [0 (10), 1 (1)]; worker 5 (10) will be ready (p = 1) -> k = 1 stand-in at 10 B/s.
    # BAG([0, E, 1], p=2, eta=0) -> [[0, E], [1]]; t_X = 2x10/1 - 2x10/10 = 18 > theta x dt = 0.1.
    d = bpawr({5: 0.9}, [0, 1], 2, 0.0, 0.1, 10.0, {0: 10.0, 1: 1.0, 5: 10.0}, 1.0, SURE)
    assert d.wait and d.excluded == (1,)
    assert d.expected == 1 and d.expected_bandwidth == 10.0 and d.saved == pytest.approx(18.0)
    assert d.remaining == {}


@pytest.mark.parametrize(("theta", "dt", "wait"), [(17.9, 1.0, True), (18.0, 1.0, False), (1.0, 18.0, False)])
def test_bpawr_waits_only_when_the_saving_exceeds_theta_times_dt(theta: float, dt: float, wait: bool) -> None:
    # Same case, t_X = 18: wait iff 18 > theta x dt (strictly). Elapsed 0 < 1, so p = 1 for any dt >= 1.
    d = bpawr({5: 0.0}, [0, 1], 2, 0.0, dt, 10.0, {0: 10.0, 1: 1.0, 5: 10.0}, theta, SURE)
    assert d.saved == pytest.approx(18.0)
    assert d.wait is wait
    assert d.excluded == ((1,) if wait else ())


def test_bpawr_counts_only_faster_workers_and_removes_them_from_s() -> None:
    # Worker 6's bandwidth equals the group's bottleneck (1): not a candidate, stays in S.
    d = bpawr({5: 0.0, 6: 0.0}, [0, 1], 2, 0.0, 1.0, 10.0, {0: 10.0, 1: 1.0, 5: 10.0, 6: 1.0}, 1.0, SURE)
    assert d.expected == 1 and d.remaining == {6: 0.0}


def test_bpawr_expected_number_is_floored_and_bandwidth_weighted() -> None:
    model = ProgressModel.warm([1.0, 2.0, 3.0, 4.0])
    bw = {0: 10.0, 1: 1.0, 5: 10.0, 6: 6.0}
    # dt = 1: worker 5 at 0 s -> F(1) = 0.25; worker 6 at 3 s -> (1 - 0.75) / 0.25 = 1.
    # k = floor(1.25) = 1; b = (0.25 x 10 + 1 x 6) / 1.25 = 6.8.
    d = bpawr({5: 0.0, 6: 3.0}, [0, 1], 2, 0.0, 1.0, 10.0, bw, 1.0, model)
    assert d.expected == 1 and d.expected_bandwidth == pytest.approx(6.8)
    # g* = [0, E(6.8)]: t_X = 20/1 - 20/6.8
    assert d.saved == pytest.approx(20.0 - 20.0 / 6.8) and d.wait and d.excluded == (1,)
    # Worker 6 at 1.5 s instead: (F(2.5) - F(1.5)) / 0.75 = 1/3; k = floor(0.25 + 1/3) = 0: nothing to wait for.
    d = bpawr({5: 0.0, 6: 1.5}, [0, 1], 2, 0.0, 1.0, 10.0, bw, 1.0, model)
    assert d.expected == 0 and not d.wait and d.saved == 0.0


def test_bpawr_does_not_wait_only_to_grow_a_group() -> None:
    # The expected worker (10) would join [0, 1] (5, 5) but replace no one: t_X = 0, no wait.
    d = bpawr({5: 0.0}, [0, 1], 2, 0.3, 1.0, 10.0, {0: 5.0, 1: 5.0, 5: 10.0}, 0.0, SURE)
    assert d.expected == 1 and d.saved == 0.0 and not d.wait


def test_expected_stand_ins_are_distinct_keys() -> None:
    assert Expected(0) != Expected(1) and Expected(0) == Expected(0)


def test_ring_time_is_eq_2() -> None:
    # 2(m-1) alpha + 2 (m-1)/m v / min b = 2 x 2 x 0.5 + 2 x 2/3 x 12 / 4
    assert ring_time([0, 1, 2], {0: 8.0, 1: 4.0, 2: 6.0}, 12.0, alpha=0.5) == pytest.approx(2.0 + 4.0)
    assert ring_time([0], {0: 1.0}, 12.0) == 0.0


# ------------------------------------------------------------------------------------- weights


def test_iteration_weights_are_relative_iteration_counts() -> None:
    assert iteration_weights([3, 1]) == (0.75, 0.25)
    assert iteration_weights([2, 2, 4]) == (0.25, 0.25, 0.5)


# ---------------------------------------------------------------------------------- controller


def _config(**changes: object) -> SelectiveConfig:
    fields: dict[str, object] = {"p": 2, "eta": 0.0, "theta": 1.0, "dt": 1.0, "model_bytes": 10.0}
    fields.update(changes)
    return SelectiveConfig(**fields)  # type: ignore[arg-type]


BW4 = {0: 10.0, 1: 10.0, 2: 1.0, 3: 10.0}


def test_controller_scripted_sequence_waits_replaces_and_weights() -> None:
    # Every iteration takes 1 or 2 s (warm): F = 0 below 1, 0.5 on [1, 2), 1 from 2.
    ctl = SelectiveReduceController(_config(), 4, BW4, ProgressModel.warm([1.0, 2.0]))
    assert ctl.step(WorkerReady(0, 1.0)) == []  # Q = [0] < p
    assert ctl.next_deadline == 2.0
    # Q = [0, 2]; workers 1, 3 (10 B/s > 1) are 1.2 s in: (F(2.2) - F(1.2)) / (1 - F(1.2)) = 1 each.
    # k = 2 at 10 B/s replace worker 2: t_X = 20/1 - 20/10 = 18 > 1 x 1 -> wait.
    assert ctl.step(WorkerReady(2, 1.2)) == []
    [(group, verdict)] = ctl.last_verdicts
    assert group == (0, 2) and verdict.wait and verdict.excluded == (2,) and verdict.expected == 2
    # Q = [0, 2, 1] -> BAG [[0, 1], [2]]; [0, 1] has no faster worker to wait for -> launch.
    [sync] = ctl.step(WorkerReady(1, 1.5))
    assert sync == Sync(id=0, workers=(0, 1), weights=(0.5, 0.5), full=False, time=1.5)
    assert ctl.ready == (2,) and ctl.round == 1
    assert ctl.step(Tick(2.0)) == []  # before the deadline (2.5): nothing is decided
    assert ctl.step(SyncDone(0, 2.5)) == []
    # Q = [2, 3]: workers 0, 1 are 0.1 s in: (F(1.1) - F(0.1)) / 1 = 0.5 each -> k = 1 -> wait again.
    assert ctl.step(WorkerReady(3, 2.6)) == []
    assert ctl.last_verdicts[0][1].wait
    # Q = [2, 3, 0] -> BAG [[3, 0], [2]] (3 before 0: queue order); launch [0, 3].
    # Iterations: worker 0 has finished 2, worker 3 one -> weights 2/3, 1/3.
    [sync] = ctl.step(WorkerReady(0, 3.0))
    assert sync.workers == (0, 3) and sync.weights == pytest.approx((2 / 3, 1 / 3))
    assert math.fsum(sync.weights) == pytest.approx(1.0)
    assert ctl.ready == (2,) and ctl.iterations == (2, 1, 1, 1)


def test_controller_theta_decides_between_waiting_and_launching() -> None:
    # The scripted case again with theta = 20: t_X = 18 < 20 x 1, so [0, 2] launches at once.
    ctl = SelectiveReduceController(_config(theta=20.0), 4, BW4, ProgressModel.warm([1.0, 2.0]))
    ctl.step(WorkerReady(0, 1.0))
    [sync] = ctl.step(WorkerReady(2, 1.2))
    assert sync.workers == (0, 2)


def test_controller_decides_again_on_a_tick_after_dt() -> None:
    # Waiting at 1.2 (as in the scripted case); no one comes; at the deadline 2.2 the two workers
    # are 2.2 s in, past every sample: probability 0, k = 0 -> launch [0, 2].
    ctl = SelectiveReduceController(_config(), 4, BW4, ProgressModel.warm([1.0, 2.0]))
    ctl.step(WorkerReady(0, 1.0))
    assert ctl.step(WorkerReady(2, 1.2)) == [] and ctl.next_deadline == pytest.approx(2.2)
    assert ctl.step(Tick(2.1)) == []
    [sync] = ctl.step(Tick(2.2))
    assert sync.workers == (0, 2)


def test_controller_full_round_every_c_and_k_counts_it() -> None:
    ctl = SelectiveReduceController(_config(c=2), 4, {w: 10.0 for w in range(4)})
    for worker, t in ((0, 1.0), (1, 1.1), (2, 1.2)):
        assert ctl.step(WorkerReady(worker, t)) == []  # round 0 is full: needs all 4
    [full] = ctl.step(WorkerReady(3, 1.3))
    assert full.full and full.workers == (0, 1, 2, 3) and full.weights == (0.25,) * 4
    ctl.step(SyncDone(full.id, 2.0))
    ctl.step(WorkerReady(0, 3.0))
    [partial] = ctl.step(WorkerReady(1, 3.1))  # round 1 is partial
    assert not partial.full and partial.workers == (0, 1) and ctl.round == 2
    assert ctl.step(WorkerReady(2, 3.2)) == []
    assert ctl.step(WorkerReady(3, 3.3)) == []  # round 2 is full again: [2, 3] wait for [0, 1]
    ctl.step(SyncDone(partial.id, 4.0))
    ctl.step(WorkerReady(0, 5.0))
    [full] = ctl.step(WorkerReady(1, 5.1))
    assert full.full and full.workers == (0, 1, 2, 3)
    assert full.weights == pytest.approx((3 / 10, 3 / 10, 2 / 10, 2 / 10))


def test_controller_stops_launching_when_the_full_round_is_due() -> None:
    # theta = 0 and eta = 0; every iteration 1 s (warm). Bandwidths 0, 1: 10; 2, 3: 1.
    ctl = SelectiveReduceController(
        _config(c=2, theta=0.0), 4, {0: 10.0, 1: 10.0, 2: 1.0, 3: 1.0}, ProgressModel.warm([1.0])
    )
    for worker in range(4):
        result = ctl.step(WorkerReady(worker, 1.0))
    ctl.step(SyncDone(result[0].id, 2.0))
    assert ctl.step(WorkerReady(2, 2.1)) == []
    # [2, 3] waits: 0 and 1 (10 B/s) are due within dt and would replace both.
    assert ctl.step(WorkerReady(3, 2.2)) == [] and ctl.last_verdicts[0][1].excluded == (2, 3)
    assert ctl.step(WorkerReady(0, 2.3)) == []
    # BAG -> [[0, 1], [2, 3]]; [0, 1] launches (round 1 -> 2); [2, 3] could too, but round 2 is full.
    [sync] = ctl.step(WorkerReady(1, 2.4))
    assert sync.workers == (0, 1) and ctl.ready == (2, 3) and ctl.round == 2


def test_controller_moves_replaced_workers_into_the_next_group() -> None:
    # Every iteration 1 s (warm): a worker under 1 s in is due within dt = 1 for sure.
    bw = {0: 10.0, 1: 5.0, 2: 1.0, 3: 10.0, 4: 1.0}
    ctl = SelectiveReduceController(_config(), 5, bw, ProgressModel.warm([1.0]))
    assert ctl.step(WorkerReady(2, 0.5)) == []
    assert ctl.step(WorkerReady(1, 0.6)) == []  # [1, 2] waits for 0 and 3 (10 B/s), due within dt
    # Q = [2, 1, 0] -> BAG [[0, 1], [2]]. [0, 1] waits for 3 to replace 1 (t_X = 20/5 - 20/10 = 2 > 1);
    # worker 1 moves to the next group, which becomes [2, 1]: nothing faster than 1 B/s is left
    # in S (3 was claimed, 4 is as slow), so it launches. Without the move [2] alone would wait.
    [sync] = ctl.step(WorkerReady(0, 0.7))
    assert [verdict.wait for _, verdict in ctl.last_verdicts] == [True, False]
    assert ctl.last_verdicts[1][0] == (2, 1)
    assert sync.workers == (1, 2) and ctl.ready == (0,)


def test_controller_reports_a_worker_that_never_reports() -> None:
    ctl = SelectiveReduceController(_config(c=1, worker_timeout=5.0), 3, {0: 1.0, 1: 1.0, 2: 1.0})
    ctl.step(WorkerReady(0, 1.0))
    ctl.step(WorkerReady(1, 1.1))
    with pytest.raises(PeerError, match=r"worker 2 has not reported ready for 5\.000 s") as caught:
        for _ in range(10):  # a driver that ticks on every deadline learns of it within the timeout
            deadline = ctl.next_deadline
            assert deadline <= 5.0
            ctl.step(Tick(deadline))
    assert caught.value.peer == 2


def test_controller_keeps_a_slow_worker_that_does_report() -> None:
    ctl = SelectiveReduceController(_config(c=1, worker_timeout=5.0), 2, {0: 1.0, 1: 1.0})
    ctl.step(WorkerReady(0, 1.0))
    [sync] = ctl.step(WorkerReady(1, 4.9))
    assert sync.full and sync.workers == (0, 1)


def test_controller_rejects_impossible_events() -> None:
    ctl = SelectiveReduceController(_config(), 3, {0: 1.0, 1: 1.0, 2: 1.0})
    with pytest.raises(ConfigError, match="worker 7"):
        ctl.step(WorkerReady(7, 1.0))
    ctl.step(WorkerReady(0, 1.0))
    with pytest.raises(ConfigError, match="worker 0 reported ready while ready"):
        ctl.step(WorkerReady(0, 1.5))
    with pytest.raises(ConfigError, match="time order"):
        ctl.step(Tick(0.5))
    with pytest.raises(ConfigError, match="sync 3"):
        ctl.step(SyncDone(3, 2.0))
    assert ctl.now == 1.0  # a rejected event changes nothing
    with pytest.raises(TypeError, match="not a controller event"):
        ctl.step("ready")  # type: ignore[arg-type]


def test_controller_bandwidth_is_checked_and_updatable() -> None:
    with pytest.raises(ConfigError, match=r"no bandwidth for workers \[2\]"):
        SelectiveReduceController(_config(), 3, {0: 1.0, 1: 1.0})
    with pytest.raises(ConfigError, match="bandwidth of worker 1"):
        SelectiveReduceController(_config(), 2, {0: 1.0, 1: -1.0})
    ctl = SelectiveReduceController(_config(theta=20.0), 4, BW4)
    ctl.set_bandwidth({2: 10.0})
    with pytest.raises(ConfigError, match="worker 9"):
        ctl.set_bandwidth({9: 1.0})
    ctl.step(WorkerReady(0, 1.0))
    [sync] = ctl.step(WorkerReady(2, 1.2))
    assert sync.workers == (0, 2)


# --------------------------------------------------------------------------------- bad parameters


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"p": 0}, "selective.p must be"),
        ({"p": 2.5}, "selective.p must be"),
        ({"eta": 1.0}, r"selective.eta must be in \[0, 1\)"),
        ({"eta": -0.1}, r"selective.eta must be in \[0, 1\)"),
        ({"theta": -1.0}, "selective.theta"),
        ({"theta": math.inf}, "selective.theta"),
        ({"dt": 0.0}, "selective.dt must be positive"),
        ({"c": 0}, "selective.c must be"),
        ({"model_bytes": 0}, "selective.model_bytes"),
        ({"worker_timeout": 0.5}, "selective.worker_timeout .* must exceed selective.dt"),
    ],
)
def test_config_rejects_bad_parameters(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(**changes)


def test_p_larger_than_n_is_a_clear_error() -> None:
    config = _config(p=12)
    with pytest.raises(ConfigError, match=r"selective.p = 12 is larger than the number of workers \(8\)"):
        config.check_world(8)
    with pytest.raises(ConfigError, match=r"selective\.p = 12"):
        SelectiveReduceController(config, 8, {w: 1.0 for w in range(8)})
    with pytest.raises(ConfigError, match="p = 5 is larger"):
        PartialReduceController(4, 5)


def test_paper_defaults() -> None:
    config = SelectiveConfig.paper(40, 500e6)
    assert (config.p, config.eta, config.theta, config.model_bytes) == (12, 0.3, 1.0, 500e6)
    assert SelectiveConfig.paper(200, 500e6, dt=0.05).p == 60


# ------------------------------------------------------------------------------- partial reduce


def test_partial_reduce_launches_the_first_p_ready() -> None:
    ctl = PartialReduceController(5, 2)
    assert ctl.step(WorkerReady(3, 0.5)) == []
    [sync] = ctl.step(WorkerReady(1, 0.6))
    assert sync == Sync(id=0, workers=(1, 3), weights=(0.5, 0.5), full=False, time=0.6)
    assert ctl.step(WorkerReady(4, 0.7)) == [] and ctl.ready == (4,)
    ctl.step(SyncDone(0, 1.0))
    [sync] = ctl.step(WorkerReady(3, 1.5))
    assert sync.workers == (3, 4) and sync.weights == pytest.approx((2 / 3, 1 / 3))


def test_partial_reduce_reports_a_worker_that_never_reports() -> None:
    ctl = PartialReduceController(3, 3, worker_timeout=2.0)
    ctl.step(WorkerReady(0, 0.5))
    ctl.step(WorkerReady(1, 0.6))
    assert ctl.next_deadline == 2.0
    with pytest.raises(PeerError, match="worker 2") as caught:
        ctl.step(Tick(ctl.next_deadline))
    assert caught.value.peer == 2


# ---------------------------------------------------------------------- a small driven run


def _bandwidths(n: int, seed: int) -> dict[int, float]:
    """The paper's setting: round(20u, 3) Gbit/s with u ~ U[0.05, 1], in bytes/s."""
    rng = random.Random(seed)
    return {w: round(20 * rng.uniform(0.05, 1.0), 3) * 1e9 / 8 for w in range(n)}


def _drive(ctl: SelectiveReduceController | PartialReduceController, bw: dict[int, float], p: int) -> list[Sync]:
    """A tiny event loop: iteration times from a skewed sample, sync times from Eq. (2)."""
    rng = random.Random(11)
    pending: list[tuple[float, int, str, int]] = []  # (time, order, "ready" | "done", worker | sync id)
    order = 0

    def push(t: float, kind: str, key: int) -> None:
        nonlocal order
        heapq.heappush(pending, (t, order, kind, key))
        order += 1

    for worker in bw:
        push(rng.choice([0.1, 0.12, 0.15, 0.4]), "ready", worker)
    syncs: dict[int, Sync] = {}
    busy: set[int] = set()
    while pending and len(syncs) < 60:
        event: WorkerReady | SyncDone | Tick
        if ctl.next_deadline < pending[0][0]:
            event = Tick(ctl.next_deadline)
        else:
            t, _, kind, key = heapq.heappop(pending)
            event = WorkerReady(key, t) if kind == "ready" else SyncDone(key, t)
        for sync in ctl.step(event):
            assert sync.full or len(sync.workers) >= p
            assert not busy & set(sync.workers)
            assert math.fsum(sync.weights) == pytest.approx(1.0)
            busy |= set(sync.workers)
            syncs[sync.id] = sync
            push(sync.time + ring_time(sync.workers, bw, 50e6, alpha=1e-3), "done", sync.id)
        if isinstance(event, SyncDone):
            for worker in syncs[event.sync].workers:
                busy.discard(worker)
                push(event.time + rng.choice([0.1, 0.12, 0.15, 0.4]), "ready", worker)
    return list(syncs.values())


def test_driven_run_keeps_synchronising() -> None:
    n, p = 10, 3
    bw = _bandwidths(n, 3)
    selective = _drive(SelectiveReduceController(SelectiveConfig.paper(n, 50e6, c=5), n, bw), bw, p)
    baseline = _drive(PartialReduceController(n, p), bw, p)
    assert len(selective) == 60 and len(baseline) == 60
    assert any(sync.full for sync in selective) and not any(sync.full for sync in baseline)
    assert all(len(sync.workers) == p for sync in baseline)

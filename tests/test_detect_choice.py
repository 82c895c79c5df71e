"""The plan choice alone: pure functions from what the detector believes, the model and the
measured delays to a plan (the critical delay, min_gain, tiny buckets, the queue of runs, blocked
plans) and the cost model's prediction of a step."""

from __future__ import annotations

import numpy as np
import pytest

from stragglerkit.detect.choice import best_plan, bucket_delays, predicted_total
from stragglerkit.detect.model import OnlineModel
from stragglerkit.detect.settings import Settings
from stragglerkit.plans import Plan
from stragglerkit.sim.cost_model import CostModelParams

N = 8
MIB8 = 8 << 20


def never(algorithm: str, straggler: int | None, slow: dict[int, float], step: int) -> bool:
    return False


@pytest.fixture(scope="module")
def model() -> OnlineModel:
    """20 us and 1 GB/s, no samples: what every prediction here is made with."""
    return OnlineModel(N, CostModelParams(alpha=20e-6, beta=1 / 1e9))


def plan_for(model: OnlineModel, delays: list[float] | None, sizes: list[int], **fields: object) -> Plan:
    settings = Settings.of(**fields)
    array = None if delays is None else np.array(delays)
    return best_plan(settings, model, N, 3 if delays is not None else None, {}, array, sizes, 40, never)


# -- bucket_delays -----------------------------------------------------------------------------
def test_bucket_delays_are_the_median_gap_to_the_fastest_other_rank() -> None:
    # window[step, rank, bucket]; rank 2 has the smallest spans (it arrived last) in steps 0 and 1
    window = np.array(
        [
            [[0.05, 0.02], [0.06, 0.02], [0.01, 0.015], [0.07, 0.02]],
            [[0.05, 0.02], [0.05, 0.03], [0.02, 0.025], [0.07, 0.02]],
            [[0.001, 0.001], [0.06, 0.02], [0.05, 0.02], [0.07, 0.02]],  # rank 0 last: not counted
        ]
    )
    delays = bucket_delays(window, straggler=2)
    # bucket 0: gaps 0.04 and 0.03; bucket 1: 0.005 and -0.005 -> 0 (never negative)
    assert delays == pytest.approx([0.035, 0.0025])
    # a straggler never last in the window: every step counts
    assert bucket_delays(window, straggler=3) == pytest.approx([0.0, 0.0])


def test_bucket_delays_treat_missing_spans_as_no_delay() -> None:
    window = np.array([[[0.05, np.nan], [0.01, np.nan], [0.06, np.nan]]])
    assert bucket_delays(window, straggler=1) == pytest.approx([0.04, 0.0])


# -- best_plan ---------------------------------------------------------------------------------
def test_nothing_believed_keeps_the_baseline(model: OnlineModel) -> None:
    assert plan_for(model, None, [MIB8, MIB8]) == Plan("allreduce")
    assert plan_for(model, None, [MIB8], baseline="ring") == Plan("ring")


def test_stragglar_is_chosen_from_the_critical_delay_on(model: OnlineModel) -> None:
    critical = model.critical_delay(3, MIB8, "allreduce", 0.05)
    assert 0 < critical < 0.1
    assert plan_for(model, [0.9 * critical], [MIB8]) == Plan("allreduce")
    plan = plan_for(model, [1.1 * critical], [MIB8])
    assert plan == Plan("allreduce", ("stragglar",), 3, ())
    assert plan.rank_map(N) == [0, 1, 2, 4, 5, 6, 7, 3]
    # the planner's margin: a larger min_gain moves the critical delay up
    assert model.critical_delay(3, MIB8, "allreduce", 0.3) > 1.1 * critical
    assert plan_for(model, [1.1 * critical], [MIB8], min_gain=0.3) == Plan("allreduce")
    # what it chose is predicted at least min_gain faster than the baseline
    stragglar = model.predict("stragglar", MIB8, straggler=3, delay=1.1 * critical)
    assert stragglar <= 0.95 * model.predict("allreduce", MIB8, straggler=3, delay=1.1 * critical)


def test_small_buckets_keep_the_baseline(model: OnlineModel) -> None:
    plan = plan_for(model, [0.05, 0.05], [MIB8, 1024])
    assert plan.buckets == ("stragglar", "allreduce")
    assert plan_for(model, [0.05], [MIB8], min_bucket_bytes=MIB8 + 1) == Plan("allreduce")


def test_a_delay_before_the_backward_is_hidden_by_the_first_run_and_a_slow_gpus_is_not(
    model: OnlineModel,
) -> None:
    """The same delay for every bucket (a rank that sleeps before its backward): once the first
    bucket's run ends, the later buckets are not late any more. Growing delays (a slow GPU computes
    every bucket late): each later bucket is late still."""
    sleeps = plan_for(model, [0.05, 0.05, 0.05], [MIB8] * 3)
    assert sleeps.buckets == ("stragglar", "allreduce", "allreduce")
    slow_gpu = plan_for(model, [0.05, 0.1, 0.15], [MIB8] * 3)
    assert slow_gpu.buckets == ("stragglar",) * 3 and slow_gpu.straggler == 3


def test_buckets_past_max_buckets_run_the_default(model: OnlineModel) -> None:
    plan = plan_for(model, [0.05, 0.1, 0.15], [MIB8] * 3, max_buckets=2)
    assert plan.buckets == ("stragglar", "stragglar") and plan.algorithm_for(2) == "allreduce"


def test_stragglar_needs_an_even_world_size(model: OnlineModel) -> None:
    odd = OnlineModel(7, CostModelParams(alpha=20e-6, beta=1 / 1e9))
    plan = best_plan(Settings(), odd, 7, 3, {}, np.array([1.0]), [MIB8], 40, never)
    assert plan == Plan("allreduce")


def test_a_degraded_rank_gets_a_nic_plan_with_its_slowdown(model: OnlineModel) -> None:
    plan = best_plan(Settings(), model, N, None, {5: 2.0, 1: 3.0}, None, [MIB8], 40, never)
    assert plan.runs_nic_plan and plan.straggler is None
    assert plan.slowdowns == ((1, 3.0), (5, 2.0))  # sorted by rank
    assert plan.rank_map(N) == [0, 2, 3, 4, 6, 7, 1, 5]


def test_a_blocked_plan_is_not_chosen_and_the_block_is_asked_about_the_belief(model: OnlineModel) -> None:
    asked: list[tuple[str, int | None, dict[int, float], int]] = []

    def stragglar_blocked(algorithm: str, straggler: int | None, slow: dict[int, float], step: int) -> bool:
        asked.append((algorithm, straggler, slow, step))
        return algorithm == "stragglar"

    plan = best_plan(Settings(), model, N, 3, {}, np.array([0.05]), [MIB8], 40, stragglar_blocked)
    assert plan == Plan("allreduce")
    assert ("stragglar", 3, {}, 40) in asked
    plan = best_plan(Settings(), model, N, None, {5: 2.0}, None, [MIB8], 40, stragglar_blocked)
    assert plan.runs_nic_plan  # only StragglAR is blocked


def test_best_plan_is_pure(model: OnlineModel) -> None:
    slow, delays, sizes = {5: 2.0}, np.array([0.05, 0.1]), [MIB8, MIB8]
    first = best_plan(Settings(), model, N, 3, slow, delays, sizes, 40, never)
    second = best_plan(Settings(), model, N, 3, slow, delays, sizes, 40, never)
    assert first == second
    assert slow == {5: 2.0} and delays.tolist() == [0.05, 0.1] and sizes == [MIB8, MIB8]


# -- predicted_total ---------------------------------------------------------------------------
def test_predicted_total_sums_the_buckets_as_the_plan_runs_them(model: OnlineModel) -> None:
    plan = Plan("allreduce", ("stragglar", "allreduce"), 3, ())
    sizes, delays = [MIB8, 0, 1 << 20], np.array([0.02, 0.0, 0.01])
    total = predicted_total(model, plan, sizes, 3, {}, delays)
    expected = model.predict("stragglar", MIB8, straggler=3, delay=0.02, planned_straggler=3) + model.predict(
        "allreduce", 1 << 20, straggler=3, delay=0.01, planned_straggler=3
    )  # the empty bucket costs nothing
    assert total == pytest.approx(expected)
    # a step whose first bucket ran the baseline instead: predicted without the plan's straggler
    ran = predicted_total(model, plan, sizes, 3, {}, delays, ran=["allreduce"])
    assert ran == pytest.approx(model.predict("allreduce", MIB8, straggler=3, delay=0.02))
    assert predicted_total(model, plan, [], 3, {}, None) == 0.0

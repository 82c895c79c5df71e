"""The switch verifier alone: what it records, how it counts the steps after a switch, the verdict
(kept when the measured time beats the lower edge, rolled back with its reason when not), the
rollback's block, cancel, and a pickle."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest

from stragglerkit import defaults
from stragglerkit.detect.settings import Settings
from stragglerkit.detect.verification import SwitchVerifier
from stragglerkit.plans import ALLREDUCE_PART, STEP_PERIOD, Plan

BASELINE = Plan("allreduce")
STRAGGLAR = Plan("allreduce", ("stragglar",), 3, ())
OPTCC = Plan("allreduce", ("optcc",), None, ((5, 2.0),))


def verifier_for(**fields: Any) -> SwitchVerifier:
    return SwitchVerifier(Settings.of(verify_steps=4, **fields))


def switch(verifier: SwitchVerifier, step: int, target: Plan = STRAGGLAR, exchange_every: int = 2) -> dict[str, Any]:
    """Start a switch to ``target`` at ``step`` with the controller's evidence (its predictions made up)."""
    evidence = {
        **verifier.measured_before(step, exchange_every),
        "predicted_before_s": 0.1,
        "predicted_after_s": 0.05,
    }
    verifier.start(step, BASELINE, target, evidence)
    return evidence


def record(verifier: SwitchVerifier, steps: range, allreduce: float, period: float | None = None) -> None:
    """Steps with this AllReduce part and, with ``period``, ends ``period`` s apart."""
    for step in steps:
        verifier.record(step, allreduce, step * period if period is not None else math.nan)


# -- measurements ------------------------------------------------------------------------------
def test_it_records_medians_of_the_allreduce_part_and_the_step_period() -> None:
    verifier = verifier_for()
    for step, (allreduce, end) in enumerate([(0.1, 1.0), (math.nan, 1.5), (0.3, 2.5), (0.2, 3.0), (0.4, 3.1)]):
        verifier.record(step, allreduce, end)
    assert verifier.recent(0, 5) == (pytest.approx(0.25), 4)  # the unknown AllReduce part is skipped
    assert verifier.recent(2, 4) == (pytest.approx(0.25), 2)  # since <= step < until
    # a period is half the time from the end of step - 2: (2.5 - 1) / 2, (3 - 1.5) / 2, (3.1 - 2.5) / 2
    assert verifier.recent(0, 5, STEP_PERIOD) == (pytest.approx(0.75), 3)
    value, count = verifier.recent(10, 20)
    assert math.isnan(value) and count == 0


def test_a_step_without_an_end_starts_the_pairs_again() -> None:
    verifier = verifier_for()
    for step, end in [(0, 1.0), (1, 2.0), (2, math.nan), (3, 4.0), (4, 5.0), (5, 6.0)]:
        verifier.record(step, 0.1, end)
    # periods only where steps s - 2, s - 1 and s all had an end: step 5 alone
    assert verifier.recent(0, 6, STEP_PERIOD) == (pytest.approx(1.0), 1)


def test_measured_before_takes_the_window_and_the_exchange_before_the_switch() -> None:
    verifier = verifier_for(window=8)
    record(verifier, range(0, 10), 1.0)
    record(verifier, range(10, 20), 0.2, period=0.5)
    before = verifier.measured_before(20, exchange_every=2)  # steps 10..19
    assert before == {
        "measure": STEP_PERIOD,
        "measured_before_s": pytest.approx(0.5),
        "measured_steps": 8,  # the first two of the window have no end two steps back
        "allreduce_before_s": pytest.approx(0.2),
    }
    without_ends = verifier_for(window=8)
    record(without_ends, range(0, 20), 0.2)
    before = without_ends.measured_before(20, exchange_every=2)
    assert before["measure"] == ALLREDUCE_PART and before["measured_before_s"] == pytest.approx(0.2)
    assert before["measured_steps"] == 10


# -- verdicts ----------------------------------------------------------------------------------
def test_a_switch_that_pays_is_verified_after_settle_and_verify_steps() -> None:
    verifier = verifier_for()
    assert (verifier.settings.settle_steps, defaults.SETTLE_STEPS) == (2, 2)
    record(verifier, range(0, 20), 0.1)
    switch(verifier, 20)
    assert verifier.pending == STRAGGLAR
    record(verifier, range(20, 22), 1.0)  # settling: slow whatever the plan, not measured
    record(verifier, range(22, 25), 0.05)
    assert verifier.judge(25, STRAGGLAR) is None  # three of the four steps
    record(verifier, range(25, 26), 0.05)
    verdict = verifier.judge(26, STRAGGLAR)
    assert verdict is not None
    kind, evidence, plan = verdict
    assert kind == "verified" and plan == STRAGGLAR and verifier.pending is None
    assert evidence == {
        "switched_at_step": 20,
        "predicted_before_s": 0.1,
        "predicted_after_s": 0.05,
        "measure": ALLREDUCE_PART,
        "measured_before_s": pytest.approx(0.1),
        "measured_after_s": pytest.approx(0.05),
        "measured_after_steps": 4,
        "allreduce_before_s": pytest.approx(0.1),
        "allreduce_after_s": pytest.approx(0.05),
        "rollback_margin": 0.0,
        "kept": STRAGGLAR.describe(),
    }
    assert verifier.judge(30, STRAGGLAR) is None  # judged once


@pytest.mark.parametrize("after", [0.1, 0.12])
def test_a_switch_that_is_not_faster_is_rolled_back_and_blocked(after: float) -> None:
    verifier = verifier_for(cooldown_steps=50)
    record(verifier, range(0, 20), 0.1)
    switch(verifier, 20)
    record(verifier, range(20, 26), after)
    verdict = verifier.judge(26, STRAGGLAR)
    assert verdict is not None
    kind, evidence, plan = verdict
    assert kind == "rollback" and plan == BASELINE and verifier.pending is None
    assert evidence["rejected"] == STRAGGLAR.describe() and evidence["restored"] == BASELINE.describe()
    assert evidence["measured_before_s"] == pytest.approx(0.1)
    assert evidence["measured_after_s"] == pytest.approx(after)
    assert evidence["blocked_until_step"] == 76
    # StragglAR for this straggler is not tried again until then; for another one it is
    assert verifier.is_blocked("stragglar", 3, {}, 75)
    assert not verifier.is_blocked("stragglar", 3, {}, 76)
    assert not verifier.is_blocked("stragglar", 4, {}, 30)
    assert not verifier.is_blocked("optcc", None, {5: 2.0}, 30)


def test_a_rolled_back_nic_plan_is_blocked_for_its_degraded_ranks() -> None:
    verifier = verifier_for()
    record(verifier, range(0, 20), 0.1)
    switch(verifier, 20, OPTCC)
    record(verifier, range(20, 26), 0.2)
    verdict = verifier.judge(26, OPTCC)
    assert verdict is not None and verdict[0] == "rollback"
    assert verifier.is_blocked("optcc", None, {5: 2.5}, 27)  # whatever l: the same ranks
    assert not verifier.is_blocked("optcc", None, {4: 2.0, 5: 2.0}, 27)
    assert not verifier.is_blocked("balanced_ring", None, {5: 2.0}, 27)


def test_the_lower_edge_is_the_measured_time_before_less_the_rollback_margin() -> None:
    for after, kind in [(0.85, "rollback"), (0.79, "verified")]:
        verifier = verifier_for(rollback_margin=0.2)
        record(verifier, range(0, 20), 1.0)
        switch(verifier, 20)
        record(verifier, range(20, 26), after)
        verdict = verifier.judge(26, STRAGGLAR)
        assert verdict is not None and verdict[0] == kind, after
        assert verdict[1]["rollback_margin"] == 0.2


def test_without_a_measurement_before_the_switch_is_kept() -> None:
    verifier = verifier_for()
    switch(verifier, 20)  # nothing recorded before
    record(verifier, range(20, 26), 5.0)
    verdict = verifier.judge(26, STRAGGLAR)
    assert verdict is not None and verdict[0] == "verified"
    assert math.isnan(verdict[1]["measured_before_s"])


def test_the_step_period_is_judged_where_known() -> None:
    """The AllReduce part halves but the step period grows: rolled back by the period."""
    verifier = verifier_for()
    record(verifier, range(0, 20), 0.1, period=0.5)
    end = 19 * 0.5
    switch(verifier, 20)
    for step in range(20, 30):
        end += 0.55
        verifier.record(step, 0.05, end)
    verdict = verifier.judge(30, STRAGGLAR)
    assert verdict is not None
    kind, evidence, _ = verdict
    assert kind == "rollback" and evidence["measure"] == STEP_PERIOD
    assert evidence["measured_before_s"] == pytest.approx(0.5) and evidence["measured_after_s"] == pytest.approx(0.55)
    assert evidence["allreduce_after_s"] == pytest.approx(0.05)


def test_when_the_step_ends_stop_coming_the_allreduce_part_is_judged() -> None:
    verifier = verifier_for()
    record(verifier, range(0, 20), 0.1, period=0.5)
    switch(verifier, 20)
    record(verifier, range(20, 40), 0.05)  # no ends after the switch
    start = 20 + verifier.settings.settle_steps
    assert verifier.judge(start + 4 * 4 - 1, STRAGGLAR) is None  # waits 4 x verify_steps for the ends
    verdict = verifier.judge(start + 4 * 4, STRAGGLAR)
    assert verdict is not None
    kind, evidence, _ = verdict
    assert kind == "verified" and evidence["measure"] == ALLREDUCE_PART
    assert evidence["measured_before_s"] == pytest.approx(0.1)  # the AllReduce part before, not the period
    assert evidence["measured_after_s"] == pytest.approx(0.05)


def test_no_verdict_for_another_plan_a_baseline_switch_or_a_cancelled_one() -> None:
    verifier = verifier_for()
    record(verifier, range(0, 20), 0.1)
    switch(verifier, 20)
    record(verifier, range(20, 30), 0.2)
    assert verifier.judge(30, OPTCC) is None  # the plan in force is not the switch's
    assert verifier.pending == STRAGGLAR
    verifier.cancel()
    assert verifier.pending is None and verifier.judge(30, STRAGGLAR) is None
    assert not verifier.is_blocked("stragglar", 3, {}, 31)  # cancelled: nothing blocked
    switch(verifier, 30)
    switch(verifier, 32, BASELINE)  # a switch back to the baseline replaces it and is not verified
    assert verifier.pending is None
    record(verifier, range(30, 50), 0.2)
    assert verifier.judge(50, BASELINE) is None


def test_a_pickled_verifier_gives_the_same_verdict() -> None:
    verifier = verifier_for()
    record(verifier, range(0, 20), 0.1, period=0.5)
    switch(verifier, 20)
    record(verifier, range(20, 24), 0.2, period=0.6)
    copy = pickle.loads(pickle.dumps(verifier))
    assert copy.pending == STRAGGLAR and copy.settings == verifier.settings
    for each in (verifier, copy):
        record(each, range(24, 30), 0.2, period=0.6)
    verdict, copied = verifier.judge(30, STRAGGLAR), copy.judge(30, STRAGGLAR)
    assert verdict is not None and verdict[0] == "rollback" and copied == verdict

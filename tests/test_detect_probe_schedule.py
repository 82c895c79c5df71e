"""The probe schedule alone: when the probes back off and come back, the interval shipped for each
plan, the exchange interval, and its state across a plan switch and a pickle."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from stragglerkit import defaults
from stragglerkit.detect.detector import Detector
from stragglerkit.detect.probe_schedule import ProbeSchedule, off_plan
from stragglerkit.detect.settings import Settings
from stragglerkit.plans import Plan

N = 8
BASELINE = Plan("allreduce")
OPTCC = Plan("allreduce", ("optcc",), None, ((5, 2.0),))
HEALTHY = np.ones(N)
UNMEASURED = np.full(N, np.nan)  # an exchange without a probe step


def reading(**slow: float) -> np.ndarray:
    """One probe's per-rank ``l``: healthy but for ``r<rank>=l``."""
    values = np.ones(N)
    for name, value in slow.items():
        values[int(name[1:])] = value
    return values


def run(probes: ProbeSchedule, detector: Detector, start: int, stop: int, tail: float, **slow: float) -> None:
    """Steps ``start..stop-1`` each with a plain AllReduce of ``tail`` s; at each multiple of the
    probe interval in force, an exchange whose probe read the links (``slow``: ``r<rank>=l``)."""
    for step in range(start, stop):
        probes.record_plain_tail(step, tail)
        if step > 0 and step % probes.probe_target == 0:
            probes.probing(step, reading(**slow), BASELINE, detector)
            probes.adopt(probes.interval_for(BASELINE), None)


def backed_off(settings: Settings | None = None) -> tuple[ProbeSchedule, Detector]:
    """A schedule whose probes backed off after four healthy probes (steps 8..32)."""
    settings = settings or Settings()
    probes, detector = ProbeSchedule(settings), Detector(settings)
    run(probes, detector, 0, 34, tail=0.1)
    assert probes.probe_target == settings.quiet_probe_every
    probes.take_events(BASELINE)
    return probes, detector


def test_it_starts_at_the_configured_intervals_and_adopts_a_decisions() -> None:
    probes = ProbeSchedule(Settings.of(probe_every=4, exchange_every=3, quiet_exchange_every=9))
    assert (probes.probe_every, probes.probe_target, probes.exchange_every, probes.exchange_target) == (4, 4, 3, 3)
    assert not probes.news and probes.take_events(BASELINE) == []
    probes.adopt(None, 9)
    assert (probes.probe_every, probes.exchange_every) == (4, 9)
    probes.adopt(64, None)
    assert (probes.probe_every, probes.exchange_every) == (64, 9)
    assert probes.probe_target == 4  # adopting is every rank's; the target is what rank 0 ships


def test_probes_back_off_after_quiet_after_healthy_probes() -> None:
    settings = Settings()
    probes, detector = ProbeSchedule(settings), Detector(settings)
    run(probes, detector, 0, 32, tail=0.1)  # probes at 8, 16, 24: three healthy readings
    assert probes.probe_target == 8 and not probes.news
    run(probes, detector, 32, 33, tail=0.1)  # the fourth (defaults.QUIET_AFTER)
    assert probes.probe_target == settings.quiet_probe_every == defaults.QUIET_PROBE_EVERY
    assert probes.interval_for(BASELINE) == 64 and probes.news
    (event,) = probes.take_events(BASELINE)
    assert event["kind"] == "probing" and event["evidence"]["every"] == 64
    assert "the last 4 probes found the links healthy" in event["evidence"]["reason"]
    assert event["evidence"]["largest_l"] == [1.0] * 4
    assert event["evidence"]["reference_allreduce_s"] == pytest.approx(0.1)
    assert not probes.news and probes.take_events(BASELINE) == []  # shipped once


def test_exchanges_without_a_probe_do_not_count_towards_the_back_off() -> None:
    settings = Settings()
    probes, detector = ProbeSchedule(settings), Detector(settings)
    for step in range(40):
        probes.record_plain_tail(step, 0.1)
        probes.probing(step, UNMEASURED, BASELINE, detector)
    assert probes.probe_target == 8 and not probes.news


def test_the_quiet_interval_is_a_multiple_of_the_busy_one() -> None:
    settings = Settings.of(probe_every=12)
    assert settings.quiet_probe_every == 72  # 64 rounded up to a multiple of 12
    probes, detector = ProbeSchedule(settings), Detector(settings)
    run(probes, detector, 0, 50, tail=0.1)  # probes at 12, 24, 36, 48
    assert probes.probe_target == 72


@pytest.mark.parametrize(
    "settings",
    [Settings.of(quiet_probe_every=0), Settings.of(quiet_probe_every=8), Settings.of(baseline="ring")],
    ids=["quiet 0", "quiet = busy", "ring baseline"],
)
def test_probes_never_back_off_when_the_settings_say_so(settings: Settings) -> None:
    probes, detector = ProbeSchedule(settings), Detector(settings)
    assert not settings.probes_back_off
    run(probes, detector, 0, 100, tail=0.1)
    assert probes.probe_target == 8 and not probes.news


def test_a_believed_straggler_keeps_the_probes_busy_and_restarts_the_count() -> None:
    settings = Settings()
    probes, detector = ProbeSchedule(settings), Detector(settings)
    run(probes, detector, 0, 25, tail=0.1)  # three healthy probes
    detector.straggler = 3
    run(probes, detector, 25, 33, tail=0.1)
    assert probes.probe_target == 8
    detector.straggler = None
    run(probes, detector, 33, 57, tail=0.1)  # 40, 48, 56: three after the count restarted
    assert probes.probe_target == 8
    run(probes, detector, 57, 65, tail=0.1)  # the fourth
    assert probes.probe_target == 64


def test_a_slow_allreduce_brings_the_probes_back_and_noise_does_not() -> None:
    probes, detector = backed_off()
    for step in range(34, 60):  # within probe_alarm (1.3) of the 0.1 s when they backed off
        probes.record_plain_tail(step, 0.125)
        probes.probing(step, UNMEASURED, BASELINE, detector)
    assert probes.probe_target == 64 and not probes.news
    probes.record_plain_tail(60, 0.18)
    probes.probing(60, UNMEASURED, BASELINE, detector)
    assert probes.probe_target == 64  # the median of the last alarm_steps (4) is still 0.125
    probes.record_plain_tail(61, 0.18)
    probes.probing(61, UNMEASURED, BASELINE, detector)
    assert probes.probe_target == 8
    (event,) = probes.take_events(BASELINE)
    assert event["evidence"]["every"] == 8
    assert "the AllReduce took 0.1525 s (median of 4 steps)" in event["evidence"]["reason"]
    assert "over 1.3 x the 0.1 s of when the probes backed off" in event["evidence"]["reason"]


def test_a_slow_quiet_probe_is_checked_by_the_next_one() -> None:
    """One quiet probe reads a link slow: busy again; the next probe reads healthy links, and the
    probes back off at once (not after another quiet_after probes)."""
    probes, detector = backed_off()
    run(probes, detector, 34, 65, tail=0.1, r6=1.6)  # the quiet probe at 64
    assert probes.probe_target == 8
    (event,) = probes.take_events(BASELINE)
    assert "a probe read l = 1.6 (>= 1.5); the next probe checks it" in event["evidence"]["reason"]
    run(probes, detector, 65, 73, tail=0.1)  # the probe at 72
    assert probes.probe_target == 64
    (event,) = probes.take_events(BASELINE)
    assert "the check probe read the links healthy (largest l: 1 < 1.5)" in event["evidence"]["reason"]
    # a slow link read twice in a row keeps them busy (the detector gets its evidence)
    run(probes, detector, 73, 129, tail=0.1, r5=2.0)  # 128: slow
    run(probes, detector, 129, 137, tail=0.1, r5=2.0)  # 136: slow again
    assert probes.probe_target == 8
    assert "l = 2" in probes.take_events(BASELINE)[0]["evidence"]["reason"]


def test_probes_do_not_back_off_while_the_allreduce_is_slower_than_its_healthy_best() -> None:
    settings = Settings.of(healthy_memory_steps=64)
    probes, detector = ProbeSchedule(settings), Detector(settings)
    run(probes, detector, 0, 20, tail=0.1)
    run(probes, detector, 20, 84, tail=0.18)  # four healthy readings, but 1.8x slower
    assert probes.probe_target == 8
    run(probes, detector, 84, 97, tail=0.18)  # the healthy medians left the memory by step 88
    assert probes.probe_target == 64


def test_a_nic_plan_ships_its_own_interval_and_checks_readings_off_the_plan() -> None:
    settings = Settings()
    probes, detector = backed_off(settings)
    detector.degraded = {5: 2.0}
    probes.new_plan()
    assert probes.interval_for(OPTCC) == settings.plan_probe_every == defaults.PLAN_PROBE_EVERY
    probes.probing(100, reading(r5=2.1), OPTCC, detector)  # as planned (within replan_ratio)
    assert probes.interval_for(OPTCC) == 64 and not probes.news
    assert probes.probe_target == 8  # the baseline's resumes busy after the plan
    probes.probing(164, reading(r5=3.0), OPTCC, detector)  # 1.5x the plan's l
    assert probes.interval_for(OPTCC) == 8
    (event,) = probes.take_events(OPTCC)
    assert event["evidence"]["under"] == "optcc" and event["evidence"]["every"] == 8
    assert "rank 5 at l = 3 (planned 2)" in event["evidence"]["reason"]
    probes.probing(172, UNMEASURED, OPTCC, detector)  # nothing measured: no verdict
    assert probes.interval_for(OPTCC) == 8
    probes.probing(180, reading(r5=2.0), OPTCC, detector)  # the check probe reads it as planned
    assert probes.interval_for(OPTCC) == 64
    assert "the reading before was noise" in probes.take_events(OPTCC)[0]["evidence"]["reason"]


def test_a_new_plan_starts_at_its_own_interval_and_the_baseline_at_the_busy_one() -> None:
    settings = Settings()
    probes, detector = backed_off(settings)
    detector.degraded = {5: 2.0}
    probes.probing(100, reading(r5=3.0), OPTCC, detector)
    assert probes.interval_for(OPTCC) == 8
    probes.new_plan()  # e.g. a rebuild for the new l
    assert probes.interval_for(OPTCC) == 64
    # back on the baseline the back-off starts over: busy, quiet_after fresh probes to back off
    detector.degraded = {}
    assert probes.interval_for(BASELINE) == 8
    probes.adopt(8, None)
    run(probes, detector, 101, 128, tail=0.1)  # 104, 112, 120
    assert probes.probe_target == 8
    run(probes, detector, 128, 129, tail=0.1)  # the fourth
    assert probes.probe_target == 64


def test_a_baseline_interval_change_is_not_shipped_with_a_nic_plan() -> None:
    """A back-off for the baseline decided while the next decision is for OptCC (whose interval
    differs) is dropped: every rank would read it as the plan's interval."""
    settings = Settings.of(plan_probe_every=32)
    probes, detector = ProbeSchedule(settings), Detector(settings)
    run(probes, detector, 0, 33, tail=0.1)
    assert probes.news and probes.probe_target == 64
    assert probes.take_events(OPTCC) == [] and not probes.news
    assert probes.interval_for(OPTCC) == 32


def test_off_plan_compares_by_the_ratio_both_ways() -> None:
    assert off_plan(2.6, 2.0, 1.25) == (True, False)
    assert off_plan(1.5, 2.0, 1.25) == (False, True)
    assert off_plan(2.4, 2.0, 1.25) == (False, False)
    above, below = off_plan(np.array([1.0, 2.0, 3.0]), 2.0, 1.25)
    assert above.tolist() == [False, False, True] and below.tolist() == [True, False, False]


# -- the exchange interval ---------------------------------------------------------------------
def calm_detector(settings: Settings) -> Detector:
    """A detector whose window is full of steps with the last arriver taking turns."""
    detector = Detector(settings)
    window = settings.detection.window
    spans = np.full((window, N), 0.02)
    for i in range(window):
        spans[i, i % N] = 0.019  # 1 ms late, each rank in 1/8 of the steps
    detector.update(list(range(window)), spans, None, lambda rank: 0.004)
    assert "candidate" in detector.last_evidence
    return detector


def quiet_schedule(settings: Settings) -> tuple[ProbeSchedule, Detector]:
    """A schedule that lengthened the exchanges: quiet for a window after a doubt at step 15."""
    probes, detector = ProbeSchedule(settings), calm_detector(settings)
    probes.exchanging(BASELINE, Detector(settings), lambda rank: 0.004, [14, 15], None)
    assert probes.exchange_target == 2 and not probes.news  # the window is not full: short, as it was
    probes.exchanging(BASELINE, detector, lambda rank: 0.004, [16, 17], None)
    assert probes.exchange_target == 2  # quiet for less than a window since the doubt at 15
    probes.exchanging(BASELINE, detector, lambda rank: 0.004, [30, 31], None)
    assert probes.exchange_target == 6
    return probes, detector


def test_exchanges_lengthen_once_all_is_quiet_for_a_window() -> None:
    settings = Settings.of(quiet_probe_every=0)  # probes never back off: not a reason for doubt
    assert (settings.detection.exchange_every, settings.detection.quiet_exchange_every) == (2, 6)
    probes, _ = quiet_schedule(settings)
    (event,) = probes.take_events(BASELINE)
    assert event["kind"] == "exchange" and event["evidence"]["every"] == 6
    assert event["evidence"]["reason"] == (
        "all quiet for 16 steps: the baseline runs, nothing is believed wrong, no straggler suspect"
    )
    assert probes.exchange_every == 2  # until the decision is adopted


@pytest.mark.parametrize(
    ("doubt", "reason"),
    [
        ("degraded", "a straggler or degraded rank is believed"),
        ("straggler", "a straggler or degraded rank is believed"),
        ("plan", "a plan other than the baseline runs (optcc)"),
        ("reading", "the latest link reading has l = 1.7 (>= 1.5)"),
        ("probes", "the probes have not backed off (the links are in question)"),
    ],
)
def test_the_first_doubt_shortens_the_exchanges_with_its_reason(doubt: str, reason: str) -> None:
    settings = Settings() if doubt == "probes" else Settings.of(quiet_probe_every=0)
    if doubt == "probes":  # backed-off probes are part of "all quiet": back them off first
        probes, detector = ProbeSchedule(settings), calm_detector(settings)
        run(probes, detector, 0, 34, tail=0.1)
        probes.exchanging(BASELINE, detector, lambda rank: 0.004, [40, 41], None)
        assert probes.exchange_target == 6
        probes.take_events(BASELINE)
        probes.probing(64, reading(r2=3.0), BASELINE, detector)  # a slow reading: busy again
    else:
        probes, detector = quiet_schedule(settings)
        probes.take_events(BASELINE)
    plan, latest = BASELINE, None
    if doubt == "degraded":
        detector.degraded = {2: 1.8}
    elif doubt == "straggler":
        detector.straggler = 3
    elif doubt == "plan":
        plan = OPTCC
    elif doubt == "reading":
        latest = np.array([1.0] * 7 + [1.7])
    probes.exchanging(plan, detector, lambda rank: 0.004, [66, 67], latest)
    assert probes.exchange_target == 2
    events = [e for e in probes.take_events(BASELINE) if e["kind"] == "exchange"]
    assert events[0]["evidence"] == {"every": 2, "reason": reason}


def test_a_suspect_in_the_window_shortens_the_exchanges() -> None:
    settings = Settings.of(quiet_probe_every=0)
    probes, detector = quiet_schedule(settings)
    probes.take_events(BASELINE)
    window = settings.detection.window
    spans = np.full((window, N), 0.02)
    others = [r for r in range(N) if r != 3]
    for i in range(window):  # rank 3 last, 10 ms late, in half the steps; the others take turns
        spans[i, 3 if i % 2 == 0 else others[i // 2 % len(others)]] = 0.01 if i % 2 == 0 else 0.0199
    detector.update(list(range(32, 32 + window)), spans, None, lambda rank: 0.004)
    assert detector.straggler is None  # a suspect, not a straggler (late in 50 % < 75 %)
    probes.exchanging(BASELINE, detector, lambda rank: 0.004, [46, 47], None)
    assert probes.exchange_target == 2
    reason = probes.take_events(BASELINE)[0]["evidence"]["reason"]
    assert reason == "rank 3 was last in 50% of the window's steps with a median delay of 10 ms"
    # late by less than clear_delay_ratio x the critical delay: no doubt, quiet a window later
    probes.exchanging(BASELINE, detector, lambda rank: 0.1, [50, 51], None)
    assert probes.exchange_target == 2
    probes.exchanging(BASELINE, detector, lambda rank: 0.1, [62, 63], None)
    assert probes.exchange_target == 6


def test_without_a_quiet_exchange_interval_nothing_changes() -> None:
    settings = Settings.of(quiet_exchange_every=0, quiet_probe_every=0)
    probes, detector = ProbeSchedule(settings), calm_detector(settings)
    probes.exchanging(BASELINE, detector, lambda rank: 0.004, [100, 101], None)
    assert probes.exchange_target == 2 and not probes.news


# -- pickling ----------------------------------------------------------------------------------
def test_a_pickled_schedule_carries_on_as_the_original() -> None:
    """A checkpoint mid-back-off: the copy makes the same decisions as the original from there."""
    settings = Settings()
    original, detector = ProbeSchedule(settings), Detector(settings)
    run(original, detector, 0, 26, tail=0.1)  # three healthy probes counted, tails remembered
    copy = pickle.loads(pickle.dumps(original))
    assert copy.settings == settings and copy.__getstate__().keys() == original.__getstate__().keys()
    for probes in (original, copy):
        run(probes, detector, 26, 33, tail=0.1)  # the fourth probe
    assert original.probe_target == copy.probe_target == 64
    assert original.take_events(BASELINE) == copy.take_events(BASELINE)
    for probes in (original, copy):  # the alarm compares with the reference both kept
        for step in range(33, 40):
            probes.record_plain_tail(step, 0.2)
            probes.probing(step, UNMEASURED, BASELINE, detector)
    assert original.probe_target == copy.probe_target == 8

"""Controller.observe as a function of its components' state: the same exchanges give the same
decisions on any freshly built controller, and the exchanges' figures are left as they came."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
from _detect_helpers import quiet_window, window

from stragglerkit.detect.controller import Controller
from stragglerkit.detect.settings import Settings
from stragglerkit.plans import Decision, WindowStats

N = 8


def exchanges() -> list[tuple[WindowStats, int]]:
    """A run with every kind of figure: plain steps with probes, then rank 3 late from step 30
    (detected, switched to, verified or rolled back), wall clocks, idle time and a degraded NIC."""
    out = []
    end = 0.0
    for start in range(0, 120, 2):
        steps = range(start, start + 2)
        if start < 30:
            stats = quiet_window(N, steps, 0.1, 8)
        else:
            stats = window(N, steps, 3, 0.05, [8 << 20, 1 << 20], slow={5: 2.0} if start >= 80 else None)
            stats.algorithms = [["ring", "allreduce"] for _ in steps]
            stats.tails = np.array([0.1, np.nan])
        ends = []
        for _ in steps:
            end += 0.5
            ends.append(end)
        stats.ends = np.array(ends)
        stats.hosts = list(range(N))
        late = [0.05 if start >= 30 and r == 3 else 0.001 * r for r in range(N)]
        stats.arrival_wall = np.array([[end + delay for delay in late] for end in ends])
        stats.finish_wall = np.array([[end + 0.1] * N for end in ends])  # all finish together
        stats.idle = np.full((len(steps), N), 0.001)
        stats.lateness = np.zeros((len(steps), N))
        out.append((stats, start + 4))
    return out


def run(controller: Controller, feed: list[tuple[WindowStats, int]]) -> list[Decision]:
    decisions = []
    for stats, apply_step in feed:
        decision = controller.observe(stats, apply_step)
        if decision is not None:
            controller.apply(decision)
            decisions.append(decision)
    return decisions


def same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN (in arrays and in the evidence's floats)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
    return repr(a) == repr(b)


def test_the_same_exchanges_give_the_same_decisions_on_two_fresh_controllers() -> None:
    settings = Settings.of(warmup_steps=4, min_gain=0.0, verify_steps=4)
    first, second = Controller(N, 0, settings), Controller(N, 0, settings)
    first.records_wanted = second.records_wanted = True
    decisions = run(first, exchanges())
    assert same(run(second, exchanges()), decisions)
    kinds = {e["kind"] for d in decisions for e in d.events}
    assert {"probing", "detected_straggler", "switch"} <= kinds, kinds  # the run reached a decision
    assert same(first.events, second.events) and first.plan == second.plan
    assert len(first.outbox) == len(second.outbox) > 0


def test_observe_leaves_the_exchanges_figures_as_they_came() -> None:
    controller = Controller(N, 0, Settings.of(warmup_steps=4, min_gain=0.0, verify_steps=4))
    controller.records_wanted = True
    for stats, apply_step in exchanges():
        before = copy.deepcopy(stats)
        decision = controller.observe(stats, apply_step)
        for field in dataclasses.fields(WindowStats):
            assert same(getattr(stats, field.name), getattr(before, field.name)), (apply_step, field.name)
        if decision is not None:
            controller.apply(decision)

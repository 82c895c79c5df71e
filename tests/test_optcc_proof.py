"""OptCC's window proof (stragglerkit/schedules/optcc_proof.py): tied to the generator and the
full checker at every small p, failing on purpose when the timetable is wrong."""

from __future__ import annotations

import itertools

import pytest

from stragglerkit.errors import ScheduleError
from stragglerkit.schedules import check
from stragglerkit.schedules.optcc import optcc_plan
from stragglerkit.schedules.optcc_proof import lane_flows, prove_optcc
from stragglerkit.schedules.optcc_timetable import OptccPlan

PLANS = [
    (p, k, slowdown, filling)
    for p, k, slowdown, filling in itertools.product(
        [3, 4, 5, 6, 7, 8, 9, 12, 13, 16], [1, 2, 3, 5, 9], [8 / 7, 1.5, 2.0, 4.0], [True, False]
    )
    if filling or slowdown < 2.0
]


@pytest.mark.parametrize("p", sorted({p for p, *_ in PLANS}))
def test_the_lanes_are_the_generators_flows_and_both_proofs_pass(p: int) -> None:
    """Every window of every plan shape: the proof's flows equal the generator's, the window proof
    passes, and the full checker proves the lowered schedule; the proof counts every message."""
    for _, k, slowdown, filling in (plan for plan in PLANS if plan[0] == p):
        for degraded in {0, p // 2, p - 1}:
            plan = optcc_plan(p, {degraded: slowdown}, k, bubble_filling=filling)
            for window in range(plan.num_windows):
                generated = {(f.src, f.dst, f.chunk, f.stage) for f in plan.flows(window)}
                assert generated == lane_flows(plan, window), (p, k, slowdown, filling, degraded, window)
            report = prove_optcc(plan)
            schedule = plan.lower()
            check(schedule)
            assert report.messages == schedule.num_ops() // 2 and report.windows == plan.num_windows


def test_the_ramp_and_lp_sizes_do_not_change_what_is_proved() -> None:
    for plan in (optcc_plan(8, {3: 2.0}, 9), optcc_plan(6, {1: 1.25}, 4, sizing="lp")):
        assert prove_optcc(plan).messages == plan.lower().num_ops() // 2


def test_plans_outside_the_window_proof_are_refused() -> None:
    with pytest.raises(ScheduleError, match="full checker"):
        prove_optcc(optcc_plan(8, {1: 2.0, 5: 1.5}, 4))  # an attached straggler
    with pytest.raises(ScheduleError, match="full checker"):
        prove_optcc(optcc_plan(8, {1: 2.0}, 4, orderings=2))


def test_a_generator_that_leaves_the_proved_lanes_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator's sections permuted within a segment (another timetable, whatever it is
    worth): the proof sees that the generator's flows are not the lanes it proves."""
    original = OptccPlan.section_chunk

    def next_owner(self: OptccPlan, window: int) -> int | None:
        chunk = original(self, window)
        return None if chunk is None else chunk - chunk % self.q + (chunk + 1) % self.q

    monkeypatch.setattr(OptccPlan, "section_chunk", next_owner)
    plan = optcc_plan(7, {2: 1.5}, 4)
    with pytest.raises(ScheduleError, match="the generator's flows differ from the lanes'"):
        prove_optcc(plan)


def test_fills_sent_down_before_every_upload_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof's own timetable broken (fill b down in body b): its checks see it, and the
    generator broken the same way fails the full checker."""
    from stragglerkit.schedules import optcc_proof

    def same_body(plan: OptccPlan, body: int) -> int:
        return body if plan.fill_weight and body < plan.segments else -1

    monkeypatch.setattr(optcc_proof, "_fill_down", same_body)
    plan = optcc_plan(7, {2: 1.5}, 4)
    with pytest.raises(ScheduleError, match="fill 0 goes down before all healthy ranks' uploads"):
        prove_optcc(plan, link_samples=0)
    monkeypatch.setattr(OptccPlan, "fill_download_body", lambda self, body: same_body(self, body))
    with pytest.raises(ScheduleError):
        check(optcc_plan(7, {2: 1.5}, 4).lower())


def test_an_upload_before_its_chain_ends_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof's own timetable broken: every section uploaded (and downloaded) one window early,
    or the S1 chains carrying their neighbours' sections. Its checks see both."""
    from stragglerkit.schedules import optcc_proof

    original = optcc_proof._section
    monkeypatch.setattr(optcc_proof, "_section", lambda plan, window: original(plan, window + 1))
    with pytest.raises(ScheduleError, match="the upload leaves before the S1 chain"):
        prove_optcc(optcc_plan(7, {2: 2.0}, 4), link_samples=0)
    monkeypatch.setattr(optcc_proof, "_section", original)
    lane0 = optcc_proof._rs_lane0
    monkeypatch.setattr(optcc_proof, "_rs_lane0", lambda plan, window: lane0(plan, window) + 1)
    with pytest.raises(ScheduleError, match="an S1 hop leaves a rank that does not hold"):
        prove_optcc(optcc_plan(7, {2: 2.0}, 4), link_samples=0)

"""Detection on synthetic statistics: last arrivers, NIC health, the detector's hysteresis, the controller."""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _detect_helpers import T, fix_the_model, quiet_window, ring_rates, spans_for, window

from stragglerkit.detect.arrival import (
    ArrivalProfiler,
    ClockOffsets,
    StepArrival,
    last_arrivers,
    wall_clock_lateness,
)
from stragglerkit.detect.controller import Controller
from stragglerkit.detect.detector import Detector
from stragglerkit.detect.exchange import StatsExchange
from stragglerkit.detect.model import OnlineModel
from stragglerkit.detect.nic_health import (
    RingLinkMessages,
    local_link_speed,
    message_link_rates,
    ring_link_messages,
    server_slowdowns,
    slowdowns_from_links,
    slowdowns_from_speeds,
    sysfs_links,
)
from stragglerkit.detect.settings import Settings, settings_for
from stragglerkit.plans import Decision, Plan, WindowStats, log_path_for
from stragglerkit.runtime.executor import OpTiming
from stragglerkit.sim.cost_model import CostModel


# -- synthetic AllReduce spans ---------------------------------------------------------------------
def straggler_stream(rng: random.Random, n: int, late: int | None, delay: float, noise: float) -> list[float]:
    arrivals = [rng.uniform(0, noise) for _ in range(n)]
    if late is not None:
        arrivals[late] += delay
    return spans_for(arrivals)


def feed(detector: Detector, rows: list[list[float]], first_step: int, k: int, critical: float) -> list:
    findings = []
    for i in range(0, len(rows), k):
        block = rows[i : i + k]
        steps = list(range(first_step + i, first_step + i + len(block)))
        for f in detector.update(steps, np.array(block), None, lambda rank: critical):
            findings.append((steps[-1], f))
    return findings


# -- arrival ----------------------------------------------------------------------------------------
def test_last_arriver_is_the_rank_that_waited_least() -> None:
    spans = np.array([spans_for([0.0, 0.002, 0.030, 0.001]), spans_for([0.004, 0.0, 0.001, 0.020])])
    ranks, delays = last_arrivers(spans)
    assert ranks.tolist() == [2, 3]
    assert delays == pytest.approx([0.028, 0.016])
    ranks, delays = last_arrivers(np.array([[0.1, np.nan, 0.2]]))
    assert ranks.tolist() == [-1] and math.isnan(delays[0])
    with pytest.raises(ValueError, match="at least 2 ranks"):
        last_arrivers(np.zeros((3, 1)))


def test_profiler_start_is_the_end_of_the_previous_allreduce() -> None:
    profiler = ArrivalProfiler()
    first = profiler.begin(0, 0, 100)
    second = profiler.begin(0, 1, 200)  # handed over while the first still runs
    profiler.finish(first, "ring", first.hook_ns + 5_000_000)
    profiler.finish(second, "ring", first.hook_ns + 8_000_000)
    assert first.span == pytest.approx(0.005)
    assert second.span == pytest.approx(0.003)  # it could start only when the first ended
    step = profiler.step_arrival(0, 4)
    assert step is not None and step.total_span == pytest.approx(0.008)
    assert step.bucket_bytes == (100, 200, 0, 0) and math.isnan(step.bucket_spans[2])


def test_profiler_overlapping_group_allreduces_start_at_their_hand_over() -> None:
    """gloo runs two buckets' all_reduce at once and the small one may end first: the large one's
    span still counts from its own hand-over, and the step's time is their union, not their sum."""
    profiler = ArrivalProfiler()
    large = profiler.begin(0, 0, 7_000_000)
    small = profiler.begin(0, 1, 1_000_000)
    small.hook_ns = large.hook_ns + 2_000_000
    profiler.finish(small, "allreduce", large.hook_ns + 90_000_000, queued=False)  # ends first
    profiler.finish(large, "allreduce", large.hook_ns + 100_000_000, queued=False)
    assert large.span == pytest.approx(0.100) and small.span == pytest.approx(0.088)
    step = profiler.step_arrival(0, 2)
    assert step is not None and step.total_span == pytest.approx(0.100)
    # a queued run after them still waits only for the queue (stragglerkit's own runs)
    probe = profiler.begin(1, 0, 7_000_000)
    profiler.finish(probe, "ring", probe.hook_ns + 50_000_000)
    assert probe.span == pytest.approx(0.050)


def test_profiler_idle_is_the_time_between_a_slow_ranks_buckets() -> None:
    """A rank that computes its buckets slowly hands them over one by one, each after the previous
    AllReduce ended: the gaps between are idle, not time in the AllReduce. Overlapping runs (the
    group's own all_reduce) leave none."""
    profiler = ArrivalProfiler()
    base = time.monotonic_ns()
    for bucket, (handed, done) in enumerate([(0, 10), (30, 45), (100, 130)]):  # ms
        timing = profiler.begin(0, bucket, 1000)
        timing.hook_ns = base + handed * 1_000_000
        profiler.finish(timing, "allreduce", base + done * 1_000_000, queued=False)
    step = profiler.step_arrival(0, 3)
    assert step is not None and step.total_span == pytest.approx(0.130)
    assert step.idle == pytest.approx(0.020 + 0.055)  # 10-30 ms and 45-100 ms
    for bucket, (handed, done) in enumerate([(0, 90), (5, 60), (20, 130)]):
        timing = profiler.begin(1, bucket, 1000)
        timing.hook_ns = base + handed * 1_000_000
        profiler.finish(timing, "allreduce", base + done * 1_000_000, queued=False)
    step = profiler.step_arrival(1, 3)
    assert step is not None and step.total_span == pytest.approx(0.130) and step.idle == pytest.approx(0.0)


def test_wall_clock_lateness_uses_offsets() -> None:
    arrivals = np.array([[100.000, 99.500, 100.020]])  # rank 1's clock is 0.5 s behind
    offsets = ClockOffsets((0, 500_000_000, 0), (0, 100, 300))
    assert wall_clock_lateness(arrivals, offsets)[0] == pytest.approx([0.0, 0.0, 0.020])
    assert offsets.per_host([0, 1, 1]) == {0: 0, 1: 500_000_000}


# -- NIC health -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_degraded_rank_is_blamed_not_its_neighbours(n: int) -> None:
    slowdowns = slowdowns_from_links(ring_rates(n, 1e9, {1: 2.0}))
    assert slowdowns[1] == pytest.approx(2.0)
    assert np.delete(slowdowns, 1) == pytest.approx(np.ones(n - 1))


def test_healthy_ring_and_unobserved_ranks() -> None:
    assert slowdowns_from_links(ring_rates(6, 1e9, {})) == pytest.approx(np.ones(6))
    assert np.isnan(slowdowns_from_links(np.full((4, 4), np.nan))).all()
    with pytest.raises(ValueError, match="square"):
        slowdowns_from_links(np.ones((2, 3)))


def test_ring_link_messages_keep_successor_and_predecessor() -> None:
    start = 1_000_000_000
    ms = 1_000_000
    links = ring_link_messages(
        [
            OpTiming(0, 2, 4096, "send", start, start + 10),
            OpTiming(1, 0, 2000, "recv_reduce", start + 5 * ms, start + 9 * ms),  # posted second
            OpTiming(2, 0, 1000, "recv_reduce", start, start + 4 * ms),  # posted first
            OpTiming(3, 2, 4096, "send", start + 4 * ms, start + 4 * ms + 10),
            OpTiming(4, 3, 3000, "recv", start + ms, start + 2 * ms),  # a stray peer: fewer messages
            OpTiming(5, 0, 3000, "recv", start + 9 * ms, start + 12 * ms),
        ],
        start,
        most=2,
    )
    assert links.send_peer == 2 and links.send_posts == pytest.approx([0.0, 0.004])
    assert links.recv_peer == 0
    assert links.recv_posts == pytest.approx([0.0, 0.005]) and links.recv_ends == pytest.approx([0.004, 0.009])
    assert links.recv_bytes.tolist() == [1000, 2000]  # the third receive is beyond most=2
    empty = ring_link_messages([], start)
    assert empty.send_peer == -1 and empty.recv_peer == -1 and empty.recv_ends.size == 0


def simulate_ring_links(
    rates: np.ndarray, enter: np.ndarray, messages: int = 12, size: float = 1e6
) -> list[RingLinkMessages]:
    """A pipelined ring: rank i forwards message k once it received message k-1 (message 0 on
    entry); each receive is posted on entry or when the previous one completed; a message moves
    once sent, received-for and its link is free, at ``rates[src, dst]`` bytes/s."""
    n = enter.size
    send = np.zeros((n, messages))  # [src, k], absolute
    post = np.zeros((n, messages))  # [dst, k]
    end = np.zeros((n, messages))  # [dst, k]
    for k in range(messages):
        for dst in range(n):  # ranks in ring order: src = dst-1 was filled for k-1 already
            src = (dst - 1) % n
            send[src, k] = enter[src] if k == 0 else end[src, k - 1]
        for dst in range(n):
            src = (dst - 1) % n
            post[dst, k] = enter[dst] if k == 0 else end[dst, k - 1]
            free = -np.inf if k == 0 else end[dst, k - 1]
            end[dst, k] = max(send[src, k], post[dst, k], free) + size / rates[src, dst]
    return [
        RingLinkMessages(
            send_peer=(r + 1) % n,
            send_posts=send[r] - enter[r],
            recv_peer=(r - 1) % n,
            recv_posts=post[r] - enter[r],
            recv_ends=end[r] - enter[r],
            recv_bytes=np.full(messages, size),
        )
        for r in range(n)
    ]


@pytest.mark.parametrize("n", [3, 4, 7])
def test_message_link_rates_charge_only_the_busy_period(n: int) -> None:
    """Rank 1's NIC at half speed, rank 0 entering 5 ms late: every link after rank 1 waits for its
    sender, and the receivers' own post-to-completion times read those links as slow."""
    nic = np.full(n, 100e6)
    nic[1] = 50e6
    rates = np.minimum(nic[:, None], nic[None, :])
    enter = np.zeros(n)
    enter[0] = 0.005
    links = simulate_ring_links(rates, enter)
    healthy_after_slow = links[3 % n]  # receives from rank 2 (rank 0 when n = 3: a late sender)
    waited = healthy_after_slow.recv_ends - healthy_after_slow.recv_posts
    assert np.median(1e6 / waited) < 0.75 * 100e6  # what a receiver-only estimate would read
    measured = message_link_rates(enter[None, :], [links])
    for src in range(n):
        dst = (src + 1) % n
        assert measured[src, dst] == pytest.approx(rates[src, dst]), (src, dst)
    assert np.isnan(measured[1, 0])
    assert slowdowns_from_links(measured) == pytest.approx([2.0 if r == 1 else 1.0 for r in range(n)])


def test_message_link_rates_skip_unpaired_and_small_messages() -> None:
    n = 4
    rates = np.full((n, n), 100e6)
    enter = np.zeros(n)
    links: list[RingLinkMessages | None] = list(simulate_ring_links(rates, enter, size=1e6))
    links[2] = None  # rank 2 not measured: links 1->2 and 2->3 have no pairs
    measured = message_link_rates(enter[None, :], [links])
    assert np.isnan(measured[1, 2]) and np.isnan(measured[2, 3]) and measured[3, 0] == pytest.approx(100e6)
    small = simulate_ring_links(rates, enter, size=1e3)
    assert np.isnan(message_link_rates(enter[None, :], [small])).all()  # latency-bound: no estimate
    with pytest.raises(ValueError, match="run, rank"):
        message_link_rates(enter[None, :], [links[:2]])


def test_speeds_and_servers() -> None:
    assert slowdowns_from_speeds([100e9, 50e9, float("nan")])[:2] == pytest.approx([1.0, 2.0])
    assert server_slowdowns([1.0, 2.0, 1.0, float("nan")], hosts=[0, 0, 1, 1]) == {0: 2.0, 1: 1.0}


def test_sysfs_links_parses_net_and_infiniband(tmp_path: Path) -> None:
    net = tmp_path / "class" / "net"
    for name, state, speed in (("eth0", "up", "25000"), ("eth1", "down", "100000"), ("veth0", "up", "")):
        (net / name).mkdir(parents=True)
        (net / name / "operstate").write_text(state + "\n")
        (net / name / "speed").write_text(speed + "\n")
    port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    links = {link.name: link for link in sysfs_links(tmp_path)}
    assert links["eth0"].up and links["eth0"].speed == pytest.approx(25e9 / 8)
    assert not links["eth1"].up and math.isnan(links["veth0"].speed)
    assert links["mlx5_0/1"].kind == "infiniband" and links["mlx5_0/1"].speed == pytest.approx(200e9 / 8)
    assert local_link_speed(tmp_path) == pytest.approx(200e9 / 8)
    assert local_link_speed(tmp_path, interface="eth0") == pytest.approx(25e9 / 8)


# -- detector ---------------------------------------------------------------------------------------
def test_persistent_straggler_detected_and_moved_then_cleared() -> None:
    rng = random.Random(1)
    det = Detector()
    delay = 2 * T
    rows = [straggler_stream(rng, 8, None, 0, 0.002) for _ in range(50)]
    rows += [straggler_stream(rng, 8, 5, delay, 0.002) for _ in range(50)]
    rows += [straggler_stream(rng, 8, 2, delay, 0.002) for _ in range(50)]
    rows += [straggler_stream(rng, 8, None, 0, 0.002) for _ in range(50)]
    found = feed(det, rows, 0, 2, critical=0.005)
    kinds = [(step, f.kind, sorted(f.ranks)) for step, f in found]
    assert [k[1:] for k in kinds] == [("detected_straggler", [5]), ("detected_straggler", [2]), ("cleared", [2])]
    assert 50 < kinds[0][0] <= 50 + 16 and 100 < kinds[1][0] <= 100 + 16 and 150 < kinds[2][0] <= 150 + 16
    assert found[1][1].evidence["moved_from"] == 5
    assert found[0][1].ranks[5] == pytest.approx(delay, rel=0.2)


def test_random_jitter_of_the_same_size_never_triggers_in_1000_steps() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        det = Detector()
        rows = [straggler_stream(rng, n, None, 0, 2 * T) for n in [4] for _ in range(1000)]
        assert feed(det, rows, 0, 2, critical=0.005) == []
        rows = [straggler_stream(rng, 8, None, 0, 2 * T) for _ in range(1000)]
        assert feed(Detector(), rows, 0, 2, critical=0.005) == []


def test_delay_below_the_critical_delay_is_not_acted_on() -> None:
    rng = random.Random(3)
    rows = [straggler_stream(rng, 4, 1, 0.003, 0.0005) for _ in range(100)]
    assert feed(Detector(), rows, 0, 2, critical=0.005) == []
    assert [f.kind for _, f in feed(Detector(), rows, 0, 2, critical=0.001)] == ["detected_straggler"]
    assert feed(Detector(), rows, 0, 2, critical=math.inf) == []


def feed_with_gaps(detector: Detector, rows: list[list[float]], gaps: list[list[float]], critical: float) -> list:
    findings = []
    for i in range(0, len(rows), 2):
        steps = [i, i + 1]
        block, gap_block = np.array(rows[i : i + 2]), np.array(gaps[i : i + 2])
        findings += [f for f in detector.update(steps, block, None, lambda rank: critical, gaps=gap_block)]
    return findings


def test_lateness_inherited_from_the_previous_allreduce_is_not_a_straggler() -> None:
    """Rank 3 arrives 15 ms late every step (smallest span), but its gap from its previous
    AllReduce's end to its hand-over is no longer than the others': it finished that AllReduce
    late. Without gaps it is (wrongly) a straggler; with them no step counts for it."""
    rng = random.Random(7)
    rows = [straggler_stream(rng, 4, 3, 0.015, 0.001) for _ in range(60)]
    gaps = [[0.006 + rng.uniform(0, 0.002) for _ in range(4)] for _ in range(60)]
    assert [f.kind for f in feed_with_gaps(Detector(), rows, [[math.nan] * 4] * 60, 0.004)] == ["detected_straggler"]
    det = Detector()
    assert feed_with_gaps(det, rows, gaps, 0.004) == []
    assert det.last_evidence["last_counts"][3] <= 6  # only where rank 3's gap happened to be the longest
    assert det.last_evidence["inherited_steps"] >= 10


def test_a_rank_that_computes_longer_is_a_straggler_with_the_smaller_of_the_two_delays() -> None:
    rng = random.Random(8)
    rows = [straggler_stream(rng, 4, 1, 0.020, 0.001) for _ in range(60)]
    gaps = []
    for _ in range(60):
        gap = [0.006 + rng.uniform(0, 0.001) for _ in range(4)]
        gap[1] += 0.012  # computes 12 ms longer; the remaining 8 ms of its lateness are inherited
        gaps.append(gap)
    found = feed_with_gaps(Detector(), rows, gaps, 0.004)
    assert [(f.kind, sorted(f.ranks)) for f in found] == [("detected_straggler", [1])]
    assert found[0].ranks[1] == pytest.approx(0.012, abs=0.0015)
    assert found[0].evidence["inherited_steps"] == 0
    gaps_seen = found[0].evidence["median_gaps_s"]
    assert gaps_seen[1] == pytest.approx(0.0185, abs=0.001) and max(gaps_seen[:1] + gaps_seen[2:]) < 0.0075


def test_steps_with_an_unknown_gap_count_by_their_spans_alone() -> None:
    rng = random.Random(9)
    rows = [straggler_stream(rng, 4, 2, 0.015, 0.001) for _ in range(40)]
    gaps = [[0.006, 0.006, 0.006, math.nan]] * 40  # one rank's gap unknown in every step
    assert [f.kind for f in feed_with_gaps(Detector(), rows, gaps, 0.004)] == ["detected_straggler"]
    with pytest.raises(ValueError, match="gaps must have the shape"):
        Detector().update([0], np.ones((1, 4)), None, lambda rank: 0.0, gaps=np.ones((1, 3)))


def test_hysteresis_does_not_flap_around_the_threshold() -> None:
    """A straggler last in ~60% of the steps (between clear_fraction and fraction) changes nothing."""
    rng = random.Random(4)
    det = Detector()
    rows = [straggler_stream(rng, 4, 3, 2 * T, 0.001) for _ in range(40)]
    rows += [straggler_stream(rng, 4, 3 if rng.random() < 0.6 else None, 2 * T, 0.001) for _ in range(400)]
    kinds = [f.kind for _, f in feed(det, rows, 0, 2, critical=0.005)]
    assert kinds == ["detected_straggler"]
    assert det.straggler == 3


def test_degraded_rank_detected_and_cleared() -> None:
    det = Detector(Settings.of(window=8))
    findings = []
    for step in range(0, 60, 2):
        l_est = np.ones(4)
        if 10 <= step < 40:
            l_est[2] = 2.0 + 0.1 * math.sin(step)
        for f in det.update([step, step + 1], np.full((2, 4), 0.01), l_est, lambda r: math.inf):
            findings.append((step, f))
    assert [(f.kind, sorted(f.ranks)) for _, f in findings] == [("detected_degraded", [2]), ("cleared", [2])]
    assert findings[0][1].ranks[2] == pytest.approx(2.0, abs=0.15)
    assert 10 < findings[0][0] <= 10 + 8 + 4 and 40 < findings[1][0] <= 40 + 8 + 4


def test_degraded_window_counts_steps_when_links_are_measured_on_probe_steps_only() -> None:
    """One l estimate every 4th step (probes): the window of 8 steps holds 2 estimates, not 4."""
    det = Detector(Settings.of(window=8))
    found_at = None
    for step in range(0, 60, 2):
        l_est = np.full(4, np.nan)  # exchanges without a probe carry no estimate
        if step % 4 == 0:
            l_est = np.ones(4)
            if step >= 20:
                l_est[1] = 2.0
        for f in det.update([step, step + 1], np.full((2, 4), 0.01), l_est, lambda r: math.inf, 4):
            if f.kind == "detected_degraded" and found_at is None:
                found_at = step
    # 2 estimates fill the window: at 24 it holds only slow ones (probes 20, 24), at 28 that is confirmed
    assert found_at == 28 and det.degraded == {1: 2.0}


def test_the_groups_own_allreduce_is_modelled_as_a_ring_and_does_not_feed_the_fit() -> None:
    model = OnlineModel(8, CostModel.Config(alpha=30e-6, beta=1 / 5e9))
    for nbytes in (1 << 16, 1 << 24):
        assert model.predict("allreduce", nbytes) == model.predict("ring", nbytes)
        assert model.predict("allreduce", nbytes, straggler=3, delay=0.01) == model.predict(
            "ring", nbytes, straggler=3, delay=0.01
        )
    model.add("allreduce", 1 << 20, 0.5)
    assert len(model.samples) == 0
    assert model.critical_delay(7, 1 << 24, "allreduce", 0.05) == model.critical_delay(7, 1 << 24, "ring", 0.05)


def test_detector_config_is_validated() -> None:
    with pytest.raises(ValueError, match="hysteresis"):
        Settings.of(late_fraction=0.5, clear_fraction=0.6)
    with pytest.raises(ValueError, match="window"):
        Settings.of(window=1)
    with pytest.raises(ValueError, match="clear_degraded_threshold"):
        Settings.of(degraded_threshold=1.5, clear_degraded_threshold=1.6)


# -- model ------------------------------------------------------------------------------------------
def test_online_fit_recovers_alpha_and_beta() -> None:
    truth = OnlineModel(8, CostModel.Config(alpha=30e-6, beta=1 / 5e9))
    model = OnlineModel(8, CostModel.Config(alpha=1e-3, beta=1e-6))
    for nbytes in (1 << 16, 1 << 20, 1 << 24):
        model.add("ring", nbytes, truth.predict("ring", nbytes))
    info = model.refit()
    assert info["fitted"] and model.config.alpha == pytest.approx(30e-6, rel=1e-3)
    assert 1 / model.config.beta == pytest.approx(5e9, rel=1e-3)
    # StragglAR hides its pre-phase in a long enough delay; its critical delay lies below the pre-phase
    big = 1 << 26
    assert model.predict("stragglar", big, straggler=7, delay=1.0) < model.predict("ring", big, straggler=7, delay=1.0)
    critical = model.critical_delay(7, big, "ring", 0.05)
    assert 0 < critical < 1.0
    at = model.predict("stragglar", big, straggler=7, delay=critical)
    assert at == pytest.approx(0.95 * model.predict("ring", big), rel=0.05)


def test_the_first_sample_replaces_the_priors_bandwidth() -> None:
    """A prior of 10 Gbit/s on a 1 Gbit/s cluster: the first probe already fits beta (alpha held
    at the prior), so the first decisions are not made ten times too optimistic; alpha comes with
    the third sample of a second size."""
    truth = OnlineModel(8, CostModel.Config(alpha=50e-6, beta=1 / 1.25e8))
    model = OnlineModel(8, CostModel.Config(alpha=50e-6, beta=1 / 1.25e9))
    big = 27 << 20
    assert model.predict("ring", big) == pytest.approx(truth.predict("ring", big) / 10, rel=0.05)
    assert not model.refit()["fitted"]  # no sample: the prior as is
    model.add("ring", big, truth.predict("ring", big))
    info = model.refit()
    assert info["fitted"] and info["params"] == "beta (1 sample: alpha held at the prior)"
    assert 1 / model.config.beta == pytest.approx(1.25e8, rel=1e-3)
    # (within 5 %: the critical path is traced with the prior's weights, docs/detection.md)
    assert model.predict("stragglar", big, straggler=7, delay=0.5) == pytest.approx(
        truth.predict("stragglar", big, straggler=7, delay=0.5), rel=0.05
    )
    model.add("ring", big, truth.predict("ring", big))
    assert model.refit()["params"] == "beta (2 samples: alpha held at the prior)"
    model.add("ring", 1 << 20, truth.predict("ring", 1 << 20))
    assert model.refit()["params"] == "alpha, beta"


def test_samples_of_a_degraded_cluster_fit_the_healthy_nic() -> None:
    """Ring runs measured while rank 3's NIC ran at 1/2: with ``slowest=2`` the fit finds the healthy
    bandwidth again; fitted as if healthy they read as a NIC of half the speed."""
    truth = OnlineModel(8, CostModel.Config(alpha=30e-6, beta=1 / 5e9))
    slow = {3: 2.0}
    sizes = (1 << 16, 1 << 20, 1 << 24)
    measured = [(nbytes, truth.predict("ring", nbytes, slowdowns=slow)) for nbytes in sizes]
    aware = OnlineModel(8, CostModel.Config(alpha=1e-3, beta=1e-6))
    naive = OnlineModel(8, CostModel.Config(alpha=1e-3, beta=1e-6))
    for nbytes, seconds in measured:
        aware.add("ring", nbytes, seconds, slowest=2.0)
        naive.add("ring", nbytes, seconds)
    aware.refit(), naive.refit()
    assert 1 / aware.config.beta == pytest.approx(5e9, rel=1e-2)
    assert 1 / naive.config.beta == pytest.approx(2.5e9, rel=1e-2)
    # so the degraded cluster's own predictions come out right, not doubly slowed
    big = sizes[-1]
    assert aware.predict("ring", big, slowdowns=slow) == pytest.approx(measured[-1][1], rel=1e-2)
    assert naive.predict("ring", big, slowdowns=slow) > 1.5 * measured[-1][1]
    with pytest.raises(ValueError, match="slowest"):
        aware.add("ring", 1 << 20, 0.01, slowest=0.5)
    # one bucket size, healthy and degraded samples: still beta alone, the healthy bandwidth
    one_size = OnlineModel(8, CostModel.Config(alpha=30e-6, beta=1e-6))
    for slowest in (1.0, 2.0, 1.0, 2.0):
        seconds = truth.predict("ring", big, slowdowns=slow if slowest > 1 else None)
        one_size.add("ring", big, seconds, slowest=slowest)
    assert one_size.refit()["params"].startswith("beta (one bucket size")
    assert 1 / one_size.config.beta == pytest.approx(5e9, rel=1e-2)


# -- controller -------------------------------------------------------------------------------------
def run_controller(
    n: int, sizes: list[int], late: int | None, delay: float, steps: int = 60, slow=None, hosts=None, **cfg
):
    low_threshold = cfg.pop("low_threshold", None)
    config = Settings.of(warmup_steps=4, min_gain=0.0, **cfg)
    if low_threshold is not None:  # below what Config.detection accepts: white-box, with its clear threshold
        config.detection.degraded_threshold = low_threshold
    controller = Controller(n, 0, config)
    fix_the_model(controller)
    decisions = []
    for start in range(0, steps, 2):
        stats = window(n, range(start, start + 2), late, delay, sizes, slow)
        stats.hosts = hosts or list(range(n))
        decision = controller.observe(stats, start + 4)
        if decision is not None:
            controller.apply(decision)
            decisions.append(decision)
    return controller, decisions


def test_controller_switches_to_stragglar_with_the_straggler_last() -> None:
    controller, _ = run_controller(8, [8 << 20, 1024], late=3, delay=0.05, verify_steps=1000)
    assert controller.plan.algorithm == "stragglar" and controller.plan.straggler == 3
    assert controller.plan.buckets == ("stragglar", "allreduce")  # the 1 KiB bucket keeps the baseline
    assert controller.plan.rank_map(8) == [0, 1, 2, 4, 5, 6, 7, 3]
    kinds = [e["kind"] for e in controller.events]
    assert kinds[:2] == ["detected_straggler", "switch"]
    switch = controller.events[1]
    assert (
        switch["algorithm"] == "stragglar"
        and switch["evidence"]["predicted_after_s"] < switch["evidence"]["predicted_before_s"]
    )


@pytest.mark.parametrize("cause", ["compute", "previous_allreduce"])
def test_the_controller_tells_compute_from_inherited_lateness_with_each_ranks_own_clock(cause: str) -> None:
    """Rank 3 arrives 30 ms late every step. Computing longer (its gap from its previous AllReduce's
    end is 30 ms longer) it is a straggler; having finished that AllReduce 30 ms late it is not.
    Clocks differ by 1000 s per rank (no offsets are needed), and the exchanges carry one step
    each, so every gap spans two exchanges."""
    n, late = 4, 3
    rng = random.Random(11)
    controller = Controller(n, 0, Settings.of(warmup_steps=4, min_gain=0.0, verify_steps=1000))
    fix_the_model(controller)
    clocks = np.arange(n) * 1000.0
    for step in range(60):
        stats = window(n, range(step, step + 1), late, 0.03, [8 << 20])
        previous_end = np.full(n, 0.1 * step)
        if cause == "previous_allreduce":
            previous_end[late] += 0.03
        arrival = previous_end + 0.05 + np.array([rng.uniform(0, 0.0005) for _ in range(n)])
        if cause == "compute":
            arrival[late] += 0.03
        stats.arrival_wall = (arrival + clocks)[None, :]
        finish = np.full(n, 0.1 * (step + 1)) + (0.03 * (np.arange(n) == late) if cause == "previous_allreduce" else 0)
        stats.finish_wall = (finish + clocks)[None, :]
        decision = controller.observe(stats, step + 4)
        if decision is not None:
            controller.apply(decision)
    kinds = [e["kind"] for e in controller.events]
    if cause == "compute":
        assert controller.detector.straggler == late and kinds[:2] == ["detected_straggler", "switch"]
    else:
        assert controller.detector.straggler is None and "detected_straggler" not in kinds, kinds
        # counted only where rank 3's gap happened to be the longest: about a quarter of the steps
        evidence = controller.detector.last_evidence
        assert evidence["inherited_steps"] >= 8 and evidence["last_counts"][late] <= 8, evidence


def slow_gpu_window(
    step: int, n: int, late: int, handed: list[float], sizes: list[int], rng: random.Random
) -> WindowStats:
    """One step (one exchange) of a straggler whose backward is slow throughout: it hands bucket b
    over ``handed[b]`` s after the punctual ranks, which hand every bucket over at once, up to
    50 ms apart (a busy CPU). The group's own all_reduce runs the buckets side by side; each
    finishes ``1.75 x bytes / 1 GB/s`` after the last hand-over."""
    start = 0.5 * step
    first = np.array([rng.uniform(0, 0.05) for _ in range(n)])
    first[late] = handed[0]
    hooks = np.tile(first[:, None], (1, len(sizes)))
    hooks[late] = handed
    finish = hooks.max(axis=0) + 1.75 * np.array(sizes) / 1e9
    spans = finish[None, :] - hooks
    extent = finish.max() - hooks.min(axis=1)
    idle = np.zeros(n)  # the straggler's runs do not overlap: idle between them
    idle[late] = extent[late] - spans[late].sum()
    buckets = np.pad(spans, ((0, 0), (0, 32 - len(sizes))), constant_values=np.nan)
    clocks = np.arange(n) * 1000.0  # each rank's own wall clock
    return WindowStats(
        steps=[step],
        totals=extent[None, :],
        bucket_spans=buckets[None, :, :],
        bucket_bytes=sizes,
        algorithms=[["allreduce"] * len(sizes)],
        link_rates=ring_rates(n, 1e9, {}),
        speeds=np.full(n, np.nan),
        arrival_wall=(start + first + clocks)[None, :],
        finish_wall=(start + finish.max() + clocks + np.zeros(n))[None, :],
        idle=idle[None, :],
    )


@pytest.mark.parametrize("idle_known", [True, False])
def test_a_slow_gpu_is_found_by_its_idle_time_and_gets_stragglar_for_its_late_buckets(idle_known: bool) -> None:
    """Rank 7's backward is slow throughout: 5 ms late with its first (small) bucket, within the
    punctual ranks' 50 ms of noise, but 150 and 300 ms late with the large ones. What it spends
    computing between its buckets is idle time: with it the detector finds rank 7, and the plan
    gives StragglAR to the large buckets, which the queue reaches before rank 7 hands them over.
    Without it rank 7 looks punctual (its AllReduce time counts its own computing)."""
    n, late, sizes = 8, 7, [1 << 20, 8 << 20, 16 << 20]
    rng = random.Random(5)
    controller = Controller(n, 0, Settings.of(warmup_steps=4, min_gain=0.0, verify_steps=1000))
    fix_the_model(controller)
    for step in range(60):
        stats = slow_gpu_window(step, n, late, [0.005, 0.150, 0.300], sizes, rng)
        if not idle_known:
            stats.idle = None
        decision = controller.observe(stats, step + 4)
        if decision is not None:
            controller.apply(decision)
    if idle_known:
        assert controller.detector.straggler == late
        assert controller.plan.algorithm == "stragglar" and controller.plan.buckets[1:] == ("stragglar", "stragglar")
    else:
        assert controller.detector.straggler is None and controller.plan.algorithm == "allreduce"


def test_only_the_first_bucket_hides_the_delay() -> None:
    """Two large buckets, both measured with the straggler's delay: StragglAR for the first only.
    stragglerkit's runs are queued, so the second starts after the first ended: no delay is left."""
    controller, _ = run_controller(8, [8 << 20, 8 << 20], late=3, delay=0.05, verify_steps=1000)
    assert controller.plan.buckets == ("stragglar", "allreduce")


@pytest.mark.parametrize("n", [3, 5, 7])
def test_controller_never_picks_stragglar_for_odd_world_sizes(n: int) -> None:
    controller, _ = run_controller(n, [8 << 20], late=1, delay=0.05)
    assert controller.plan.algorithm == "allreduce"
    assert all(e["evidence"]["to"]["buckets"] == [] for e in controller.events if e["kind"] == "switch")


def test_controller_keeps_the_baseline_for_tiny_buckets() -> None:
    controller, _ = run_controller(8, [4096, 1024], late=2, delay=0.05)
    assert controller.plan == Plan("allreduce")


def test_controller_fits_samples_with_the_confirmed_slowest_nic() -> None:
    config = Settings.of(warmup_steps=0, settle_steps=0, verify_steps=1000)
    controller = Controller(8, 0, config)
    step = 0
    while not controller.detector.degraded and step < 60:  # until rank 5 (at 1/2) is confirmed
        controller.observe(window(8, range(step, step + 2), None, 0.0, [16 << 20], slow={5: 2.0}), step + 4)
        step += 2
    assert controller.detector.degraded == {5: pytest.approx(2.0)}
    controller.observe(window(8, range(step, step + 2), None, 0.0, [16 << 20], slow={5: 2.0}), step + 4)
    assert [sample[3] for sample in controller.model.samples][-2:] == [pytest.approx(2.0)] * 2
    assert controller.model.fit_info["params"].startswith("beta (one bucket size")


def test_samples_taken_before_a_degraded_nic_was_confirmed_are_rescaled_when_it_is() -> None:
    """Rank 5's NIC drops to 1/2 at step 20; the probes that saw it slow before the detector
    confirmed it were added as healthy samples, and are re-tagged with l = 2 on confirmation;
    the samples from before step 20 stay healthy."""
    config = Settings.of(warmup_steps=0, settle_steps=0, verify_steps=1000)
    controller = Controller(8, 0, config)
    step, found = 0, []
    while not controller.detector.degraded and step < 80:
        slow = {5: 2.0} if step >= 20 else None
        decision = controller.observe(window(8, range(step, step + 2), None, 0.0, [16 << 20], slow=slow), step + 4)
        if decision is not None:
            found += [e for e in decision.events if e["kind"] == "detected_degraded"]
        step += 2
    assert controller.detector.degraded == {5: pytest.approx(2.0)}
    assert found[0]["evidence"]["rescaled_samples"] == step - 20  # one per step since the fault
    tags = {sample[4]: sample[3] for sample in controller.model.samples}
    assert {s: slowdown for s, slowdown in tags.items() if s < 20} == {s: 1.0 for s in range(20)}
    assert {s: slowdown for s, slowdown in tags.items() if s >= 20} == {s: pytest.approx(2.0) for s in range(20, step)}


def test_model_refits_only_when_its_samples_changed() -> None:
    """The controller refits every exchange; without new samples the fit and the cached
    predictions (simulations) stay, so a quiet exchange costs no simulation."""
    model = OnlineModel(4, CostModel.Config(alpha=1e-5, beta=1e-9))
    for nbytes, seconds in ((1 << 20, 0.011), (4 << 20, 0.041), (8 << 20, 0.081)):
        model.add("ring", nbytes, seconds)
    info = model.refit()
    assert info["fitted"] and info["samples"] == 3
    model.predict("ring", 2 << 20)
    predictor = model.predictor
    cached = dict(predictor._predictions)
    assert cached and model.refit() is info and model.predictor is predictor and predictor._predictions == cached
    model.add("ring", 2 << 20, 0.021)
    assert model.refit()["samples"] == 4 and model.predictor is not predictor and not model.predictor._predictions
    assert model.rescale({-1}, 2.0) == 4 and model.refit()["samples"] == 4  # re-tagged: fitted again
    assert model.fit_info is not info


def test_model_rescale_retags_only_the_named_steps_upwards() -> None:
    model = OnlineModel(4, CostModel.Config(alpha=1e-5, beta=1e-9))
    for step in range(4):
        model.add("ring", 1 << 20, 0.01, 1.0 if step < 3 else 3.0, step)
    assert model.rescale({1, 2, 3}, 2.0) == 2  # step 3 was already tagged higher
    assert [s[3] for s in model.samples] == [1.0, 2.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="slowest"):
        model.rescale({0}, 0.5)


def test_controller_chooses_optcc_for_a_degraded_rank() -> None:
    controller, _ = run_controller(8, [16 << 20], late=None, delay=0.0, slow={5: 2.0}, verify_steps=1000)
    assert controller.plan.algorithm == "optcc" and dict(controller.plan.slowdowns) == {5: pytest.approx(2.0)}
    assert controller.plan.rank_map(8) == [0, 1, 2, 3, 4, 6, 7, 5]
    assert [e["kind"] for e in controller.events][:2] == ["detected_degraded", "switch"]


def test_controller_chooses_the_balanced_ring_for_a_nic_near_full_rate() -> None:
    """l = 8/7 (found with a detector threshold of 1.1; the default 1.5 leaves such a NIC alone):
    the model predicts the balanced ring faster than OptCC's 9-segment pipeline on 32 MiB."""
    controller, _ = run_controller(
        8, [32 << 20], None, 0.0, slow={5: 8 / 7}, verify_steps=1000, low_threshold=1.1, clear_degraded_threshold=1.05
    )
    assert controller.plan.algorithm == "balanced_ring", controller.events
    assert dict(controller.plan.slowdowns) == {5: pytest.approx(8 / 7, abs=1e-3)}
    assert controller.plan.rank_map(8) == [0, 1, 2, 3, 4, 6, 7, 5] and controller.plan.runs_nic_plan
    switch = next(e for e in controller.events if e["kind"] == "switch")
    assert switch["evidence"]["predicted_after_s"] < switch["evidence"]["predicted_before_s"]
    model = controller.model
    optcc_time = model.predict("optcc", 32 << 20, slowdowns={5: 8 / 7})
    assert model.predict("balanced_ring", 32 << 20, slowdowns={5: 8 / 7}) < optcc_time


def run_under_optcc(controller: Controller, steps: range, slow: dict[int, float] | None) -> list[tuple[int, Decision]]:
    """Exchanges while the controller's plan runs (OptCC at first): a step is a probe when the
    interval in force (``controller.probe_every``, shipped by rank 0 with each decision) divides
    it, as in the DDP hook; only probe exchanges carry link figures (OptCC's runs are not
    measured). ``slow``: the links as they are now. Returns the decisions (step, decision)."""
    decisions = []
    for start in range(steps.start, steps.stop, 2):
        stats = window(8, range(start, start + 2), None, 0.0, [16 << 20], slow=slow)
        every = controller.probe_every
        probes = [s for s in stats.steps if controller.plan.runs_nic_plan and every and s % every == 0]
        stats.algorithms = [["ring" if s in probes else controller.plan.algorithm_for(0)] for s in stats.steps]
        if not probes and controller.plan.runs_nic_plan:
            stats.link_rates = np.full((8, 8), np.nan)
        decision = controller.observe(stats, start + 4)
        if decision is not None:
            controller.apply(decision)
            decisions.append((start, decision))
    return decisions


def test_a_nic_that_recovers_under_optcc_is_cleared_and_the_baseline_returns() -> None:
    """OptCC runs for rank 5 (l = 2), then its NIC recovers. Exchanges without a probe carry no
    link figures and change nothing; the first probe that replaces OptCC on the largest bucket
    (every plan_probe_every-th step) reads rank 5 healthy, the probes come every probe_every
    steps until the detector clears rank 5, and the plan returns to the group's own all_reduce."""
    controller, _ = run_controller(8, [16 << 20], late=None, delay=0.0, slow={5: 2.0}, verify_steps=1000)
    config = controller.settings
    assert controller.plan.algorithm == "optcc" and controller.detector.degraded == {5: pytest.approx(2.0)}
    assert controller.probe_every == config.plan_probe_every  # shipped with the OptCC plan
    decisions = run_under_optcc(controller, range(60, 400), slow=None)  # recovered from step 60 on
    kinds = [e["kind"] for e in controller.events]
    assert "cleared" in kinds and controller.detector.degraded == {}, kinds
    assert controller.plan == Plan("allreduce")
    cleared_at = next(step for step, d in decisions if d.plan == Plan("allreduce"))
    first_probe = (60 // config.plan_probe_every + 1) * config.plan_probe_every
    # the first probe reads it healthy and starts the short interval; the window still held an
    # l = 2 reading, so one more probe lowers the median and one confirms
    assert first_probe <= cleared_at <= first_probe + 3 * config.detection.probe_every, (cleared_at, kinds)
    checking = [
        e
        for e in controller.events
        if e["kind"] == "probing" and e["evidence"]["every"] == config.detection.probe_every
    ]
    assert checking and "rank 5 at l = 1" in checking[0]["evidence"]["reason"], controller.events


def test_a_nic_that_degrades_further_under_optcc_gets_a_new_plan() -> None:
    """OptCC runs for rank 5 at l = 2; its NIC drops to 1/4. The first probe that reads l = 4
    starts the short interval, and once every estimate in the detector's window reads it (two
    probes) the plan is rebuilt for l = 4; with the readings as planned again, the long interval
    returns."""
    controller, _ = run_controller(8, [16 << 20], late=None, delay=0.0, slow={5: 2.0}, verify_steps=1000)
    config = controller.settings
    decisions = run_under_optcc(controller, range(60, 300), slow={5: 4.0})
    switches = [(step, d.plan) for step, d in decisions if any(e["kind"] == "switch" for e in d.events)]
    assert len(switches) == 1, decisions
    step, plan = switches[0]
    assert plan.algorithm == "optcc" and dict(plan.slowdowns) == {5: pytest.approx(4.0)}
    first_probe = (60 // config.plan_probe_every + 1) * config.plan_probe_every
    assert first_probe < step <= first_probe + 2 * config.detection.probe_every, (step, controller.events)
    assert controller.plan == plan and controller.probe_every == config.plan_probe_every
    assert controller.detector.degraded == {5: pytest.approx(4.0)}


def test_a_rebuild_that_did_not_pay_keeps_the_plan_it_replaced() -> None:
    """As above, but the rebuilt plan's verification measures no gain (the synthetic spans do not
    change): it is rolled back to the plan for l = 2, which then stays (the rebuild is blocked for
    cooldown_steps), rather than falling back to the baseline."""
    controller, _ = run_controller(8, [16 << 20], late=None, delay=0.0, slow={5: 2.0}, verify_steps=1000)
    first = controller.plan
    controller.verifier.cancel()  # the first switch counts as verified
    controller.settings.detection.verify_steps = 4
    cooldown = controller.settings.detection.cooldown_steps
    decisions = run_under_optcc(controller, range(60, 60 + cooldown), slow={5: 4.0})
    assert all(d.plan.runs_nic_plan for _, d in decisions), decisions  # never the baseline
    kinds = [e["kind"] for e in controller.events]
    assert kinds.count("switch") == 2 and kinds.count("rollback") == 1, kinds
    rollback = next(e for e in controller.events if e["kind"] == "rollback")
    assert rollback["evidence"]["rejected"]["slowdowns"] == {"5": pytest.approx(4.0, rel=0.01)}, rollback
    assert controller.plan == first and dict(first.slowdowns) == {5: pytest.approx(2.0)}


def test_one_off_reading_under_optcc_changes_nothing() -> None:
    """One probe under OptCC reads rank 5 healthy (noise), the next reads it at l = 2 again: the
    short interval ends at once, the plan stays, nothing is cleared."""
    controller, _ = run_controller(8, [16 << 20], late=None, delay=0.0, slow={5: 2.0}, verify_steps=1000)
    config = controller.settings
    plan = controller.plan
    first_probe = (60 // config.plan_probe_every + 1) * config.plan_probe_every
    run_under_optcc(controller, range(60, first_probe), slow={5: 2.0})
    run_under_optcc(controller, range(first_probe, first_probe + 2), slow=None)  # the odd reading
    assert controller.probe_every == config.detection.probe_every and controller.plan == plan
    run_under_optcc(controller, range(first_probe + 2, first_probe + 200), slow={5: 2.0})
    assert controller.plan == plan and controller.detector.degraded == {5: pytest.approx(2.0)}
    assert controller.probe_every == config.plan_probe_every
    reasons = [e["evidence"]["reason"] for e in controller.events if e["kind"] == "probing"]
    assert any("as planned" in r for r in reasons), reasons
    assert not any(e["kind"] in ("cleared", "switch") for e in controller.events[2:]), controller.events


def test_ranks_sharing_a_server_get_its_slowdown() -> None:
    controller, _ = run_controller(8, [16 << 20], None, 0.0, slow={5: 2.0}, hosts=[0, 0, 1, 1, 2, 2, 3, 3])
    assert sorted(controller.detector.degraded) == [4, 5]
    # one server for every rank (one machine, loopback): no server figure to apply
    controller, _ = run_controller(8, [16 << 20], None, 0.0, slow={5: 2.0}, hosts=[0] * 8)
    assert sorted(controller.detector.degraded) == [5]


def test_controller_rolls_back_a_switch_that_did_not_pay() -> None:
    """The straggler stays late but the measured time does not improve: the switch is undone."""
    controller, _ = run_controller(8, [8 << 20], late=3, delay=0.05, steps=120, verify_steps=4)
    kinds = [e["kind"] for e in controller.events]
    assert kinds[:3] == ["detected_straggler", "switch", "rollback"]
    rollback = controller.events[2]
    assert (
        rollback["algorithm"] == "allreduce"
        and rollback["evidence"]["measured_after_s"] >= rollback["evidence"]["measured_before_s"]
    )
    assert controller.plan == Plan("allreduce")  # blocked for cooldown_steps: no re-switch
    assert kinds.count("switch") == 1


def run_switch(
    change: Callable[[WindowStats, bool], None], verify_steps: int = 4, detector_window: int = 16
) -> tuple[Controller, int | None]:
    """A straggler at rank 3 is switched to StragglAR; ``change(stats, after)`` shapes each
    exchange's figures (``after``: the exchange is from the switch on). Returns the controller and
    the step of the switch."""
    config = Settings.of(warmup_steps=4, min_gain=0.0, verify_steps=verify_steps, window=detector_window)
    controller = Controller(8, 0, config)
    fix_the_model(controller)
    switched: int | None = None
    for start in range(0, 80, 2):
        stats = window(8, range(start, start + 2), 3, 0.05, [8 << 20])
        change(stats, switched is not None and start >= switched)
        decision = controller.observe(stats, start + 4)
        if decision is not None:
            controller.apply(decision)
            if switched is None and any(e["kind"] == "switch" for e in decision.events):
                switched = decision.step
    return controller, switched


def test_a_switch_that_pays_is_kept_with_its_measurement_in_a_verified_event() -> None:
    def halve_after(stats: WindowStats, after: bool) -> None:
        if after:
            stats.totals = stats.totals / 2  # the new plan halves the AllReduce

    controller, switched = run_switch(halve_after)
    kinds = [e["kind"] for e in controller.events]
    assert kinds == ["detected_straggler", "switch", "verified"], kinds
    verified = controller.events[2]
    assert verified["algorithm"] == "stragglar" and verified["evidence"]["kept"]["straggler"] == 3
    evidence = verified["evidence"]
    assert evidence["measured_after_s"] == pytest.approx(evidence["measured_before_s"] / 2, rel=0.05)
    assert evidence["switched_at_step"] == switched and evidence["measured_after_steps"] >= 4
    assert controller.plan.algorithm == "stragglar"


def run_period_switch(
    allreduce_factor: float,
    period_factor: float,
    with_ends: bool = True,
    alternate: float = 0.0,
    verify_steps: int = 4,
    detector_window: int = 16,
) -> Controller:
    """:func:`run_switch` with wall-clock figures: from the switch on the AllReduce part takes
    ``allreduce_factor`` and the step period ``period_factor`` of what they took before. With
    ``alternate`` the periods alternate between ``0.5 (1 - alternate)`` and ``0.5 (1 + alternate)``
    s (two kinds of step taking turns, as the train bench's copies do)."""
    end = 0.0

    def scale_after(stats: WindowStats, after: bool) -> None:
        nonlocal end
        stats.tails = np.array([0.1 * (allreduce_factor if after else 1.0)] * 2)
        ends = []
        for step in stats.steps:
            kind = 1 - alternate if step % 2 == 0 else 1 + alternate
            end += 0.5 * kind * (period_factor if after else 1.0)
            ends.append(end)
        stats.ends = np.array(ends) if with_ends else None

    return run_switch(scale_after, verify_steps, detector_window)[0]


def test_a_switch_is_judged_by_the_step_period_not_the_allreduce_alone() -> None:
    """The AllReduce part halves, but the whole step gets 10 % slower (its CPU work slows the
    ranks' backward pass): the user's step did not gain, so the switch is rolled back."""
    controller = run_period_switch(allreduce_factor=0.5, period_factor=1.1)
    kinds = [e["kind"] for e in controller.events]
    assert kinds[:3] == ["detected_straggler", "switch", "rollback"], kinds
    evidence = controller.events[2]["evidence"]
    assert evidence["measure"] == "step period"
    assert evidence["measured_before_s"] == pytest.approx(0.5) and evidence["measured_after_s"] == pytest.approx(0.55)
    assert evidence["allreduce_before_s"] == pytest.approx(0.1) and evidence["allreduce_after_s"] == pytest.approx(0.05)
    assert controller.events[1]["evidence"]["measure"] == "step period"
    assert controller.plan == Plan("allreduce")


def test_a_switch_that_shortens_the_step_period_is_kept() -> None:
    controller = run_period_switch(allreduce_factor=0.5, period_factor=0.8)
    kinds = [e["kind"] for e in controller.events]
    assert kinds == ["detected_straggler", "switch", "verified"], kinds
    evidence = controller.events[2]["evidence"]
    assert evidence["measure"] == "step period" and evidence["measured_after_s"] == pytest.approx(0.4)
    assert controller.plan.algorithm == "stragglar"


@pytest.mark.parametrize("factor", [0.95, 1.05])
def test_steps_of_two_kinds_taking_turns_are_judged_by_their_pairs(factor: float) -> None:
    """Short and long steps alternate (0.25 s, 0.75 s): the median of an odd number of single
    periods would be one kind or the other by the window's parity; pairs of steps give 0.5 s
    before and 0.5·factor after."""
    controller = run_period_switch(1.0, factor, alternate=0.5, verify_steps=5, detector_window=15)  # 17 periods before
    kinds = [e["kind"] for e in controller.events]
    assert kinds[:3] == ["detected_straggler", "switch", "verified" if factor < 1 else "rollback"], kinds
    evidence = controller.events[2]["evidence"]
    assert evidence["measure"] == "step period"
    assert evidence["measured_before_s"] == pytest.approx(0.5)
    assert evidence["measured_after_s"] == pytest.approx(0.5 * factor)


def test_without_wall_clock_ends_the_allreduce_part_is_judged() -> None:
    controller = run_period_switch(allreduce_factor=0.5, period_factor=1.1, with_ends=False)
    kinds = [e["kind"] for e in controller.events]
    assert kinds == ["detected_straggler", "switch", "verified"], kinds
    evidence = controller.events[2]["evidence"]
    assert evidence["measure"] == "allreduce part" and evidence["measured_after_s"] == pytest.approx(0.05)


def test_exchange_roundtrip_of_a_decision() -> None:
    exchange = StatsExchange(group=None, world_size=4, rank=0, buckets=8)  # type: ignore[arg-type]
    plan = Plan("ring", ("stragglar", "ring"), 2, ())
    decision = Decision(
        3, 40, plan, [{"kind": "detected_straggler", "evidence": {}}, {"kind": "switch", "evidence": {}}]
    )
    row = exchange.pack(38, [None, None], float("nan"), 7, decision)
    decoded = exchange.decision(torch.stack([row] * 4).numpy())
    assert decoded is not None and decoded.plan == plan and decoded.step == 40 and decoded.seq == 3
    assert [e["kind"] for e in decoded.events] == ["detected_straggler", "switch"]
    assert decoded.probe_every is None and decoded.exchange_every is None  # unchanged
    optcc = Plan("ring", ("optcc",), None, ((1, 2.5),))
    events = [{"kind": "probing", "evidence": {}}, {"kind": "exchange", "evidence": {}}]
    row = exchange.pack(38, [None] * 6, 1e9, 7, Decision(4, 42, optcc, events, 64, 6))
    assert row.numel() == exchange.size(6) > exchange.size(2) and exchange.steps_in(row.numel()) == 6
    decoded = exchange.decision(torch.stack([row] * 4).numpy())
    assert decoded is not None and decoded.plan == optcc and (decoded.probe_every, decoded.exchange_every) == (64, 6)
    assert [e["kind"] for e in decoded.events] == ["probing", "exchange"]
    with pytest.raises(ValueError, match="does not fit"):
        exchange.steps_in(exchange.size(2) + 1)


def drive(controller: Controller, start: int, stop: int, tail: float, slow=None) -> list[Decision]:
    """Exchanges from ``start`` to ``stop``, each of the steps since the previous one at the interval
    in force (``controller.exchange_every``, 2 or 6); each decision is applied at once."""
    decisions = []
    first = start
    while first < stop:
        k = controller.exchange_every
        steps = range(first, min(first + k, stop))
        stats = quiet_window(8, steps, tail, controller.probe_every, slow)
        decision = controller.observe(stats, steps.stop + k)
        if decision is not None:
            controller.apply(decision)
            decisions.append(decision)
        first = steps.stop
    return decisions


def like_the_hook(controller: Controller, stop: int, late: int | None = None, late_from: int = 0) -> list[Decision]:
    """Exchanges up to step ``stop`` scheduled as ``DDPState`` schedules them: each at the interval in
    force after the previous one, carrying the steps since it; the decision rank 0 takes on one
    exchange travels with the next and is adopted a step later (with its new interval)."""
    fix_the_model(controller)
    decisions: list[Decision] = []
    last, upcoming = 0, controller.exchange_every
    to_ship: Decision | None = None
    while upcoming <= stop:
        stats = quiet_window(8, range(last, upcoming), 0.1, controller.probe_every, None, late, late_from)
        last, upcoming = upcoming, upcoming + controller.exchange_every
        if to_ship is not None:  # adopted at the step after the exchange that carried it
            controller.apply(to_ship)
            decisions.append(to_ship)
            upcoming = last + controller.exchange_every
        to_ship = controller.observe(stats, upcoming + 1)
    return decisions


def test_exchanges_lengthen_once_all_is_quiet_and_shorten_on_a_suspect() -> None:
    controller = Controller(8, 0, Settings.of(warmup_steps=4, min_gain=0.0))
    decisions = like_the_hook(controller, 60)
    assert controller.exchange_every == 6 and controller.probe_every == 64
    quiet = next(d for d in decisions if d.exchange_every == 6)
    assert "the probes have backed off" in event_of(quiet, "exchange")["evidence"]["reason"]
    assert all(d.exchange_every == 2 for d in decisions if d.step < quiet.step)
    assert controller.plan == Plan("allreduce")


@pytest.mark.parametrize("appears", range(60, 66))
def test_a_straggler_that_appears_while_exchanges_are_quiet_is_acted_on_within_20_steps(appears: int) -> None:
    """Every phase of the 6-step quiet interval: rank 3 late from ``appears`` brings the 2-step
    exchanges back with a suspect's reason, and StragglAR is switched to by ``appears + 20`` (the
    issue's 'appearing at step 50, acted on by step 70')."""
    controller = Controller(8, 0, Settings.of(warmup_steps=4, min_gain=0.0, verify_steps=1000))
    decisions = like_the_hook(controller, appears + 30, late=3, late_from=appears)
    quiet = [d for d in decisions if d.exchange_every == 6]
    assert quiet and quiet[0].step < appears - 6
    busy = next(d for d in decisions if d.exchange_every == 2 and d.step > quiet[0].step)
    assert "rank 3 was last in" in event_of(busy, "exchange")["evidence"]["reason"]
    switch = next(d for d in decisions if d.plan.algorithm == "stragglar")
    assert switch.plan.straggler == 3 and switch.step <= appears + 20, (switch.step, appears)


@pytest.mark.parametrize("name", ["short_job", "default", "long_job"])
def test_quiet_exchanges_delay_acting_on_a_straggler_by_at_most_one_short_interval(name: str) -> None:
    """Each ready-made configuration, a straggler appearing at every phase of its quiet interval:
    the latest switch to StragglAR comes at most ``exchange_every`` steps after the latest one
    with exchanges at ``exchange_every`` throughout."""
    from stragglerkit import Config

    preset = Config.from_yaml(Path(__file__).resolve().parents[1] / "configs" / f"{name}.yaml")
    preset = preset.replace(detection={"warmup_steps": 4, "min_gain": 0.0, "verify_steps": 10_000})
    base = settings_for(preset)
    start = 4 * base.detection.window  # by then the exchanges are quiet

    def latest_switch(config: Settings) -> int:
        delays = []
        for appears in range(start, start + base.detection.quiet_exchange_every + 1):
            controller = Controller(8, 0, config)
            decisions = like_the_hook(controller, appears + 3 * base.detection.window, late=3, late_from=appears)
            quiet = config.detection.quiet_exchange_every
            if quiet:
                assert any(d.exchange_every == quiet and d.step < appears for d in decisions)
            delays.append(next(d.step for d in decisions if d.plan.algorithm == "stragglar") - appears)
        return max(delays)

    assert base.detection.quiet_exchange_every > base.detection.exchange_every
    always_short = latest_switch(settings_for(preset.replace(detection={"quiet_exchange_every": 0})))
    assert latest_switch(base) <= always_short + base.detection.exchange_every


def test_without_quiet_exchanges_the_interval_never_changes() -> None:
    controller = Controller(8, 0, Settings.of(warmup_steps=4, quiet_exchange_every=0))
    decisions = like_the_hook(controller, 80)
    assert controller.probe_every == 64 and controller.exchange_every == 2
    assert all(d.exchange_every == 2 for d in decisions)
    assert not [e for e in controller.events if e["kind"] == "exchange"]


def probings(decisions: list[Decision]) -> list[Decision]:
    """The decisions that changed the probe interval (others only change the exchange interval)."""
    return [d for d in decisions if any(e["kind"] == "probing" for e in d.events)]


def event_of(decision: Decision, kind: str) -> dict[str, Any]:
    (event,) = [e for e in decision.events if e["kind"] == kind]
    return event


def test_probes_back_off_once_links_prove_healthy_and_return_when_the_allreduce_slows() -> None:
    config = Settings.of(warmup_steps=4)
    controller = Controller(8, 0, config)
    decisions = drive(controller, 0, 34, tail=0.100)  # probes at 8, 16, 24, 32: four healthy estimates
    assert controller.probe_every == 64 and [d.probe_every for d in probings(decisions)] == [64]
    event = event_of(decisions[0], "probing")
    assert event["evidence"]["every"] == 64
    assert event["evidence"]["reference_allreduce_s"] == pytest.approx(0.100)
    assert "the last 4 probes found the links healthy" in event["evidence"]["reason"]
    assert controller.plan == Plan("allreduce")
    # noise within the alarm's factor does not bring the probes back
    assert probings(drive(controller, 34, 60, tail=0.125)) == [] and controller.probe_every == 64
    # a NIC degrades: every AllReduce takes longer; the probes return before the next quiet probe (64)
    decisions = drive(controller, 60, 64, tail=0.180)
    assert controller.probe_every == 8 and decisions[-1].probe_every == 8
    alarm = event_of(decisions[-1], "probing")
    assert re.search(r"the AllReduce took 0\.1[58] s \(median of 4 steps\)", alarm["evidence"]["reason"])
    # and the probes now find it
    drive(controller, 64, 100, tail=0.180, slow={5: 2.0})
    assert controller.detector.degraded == {5: pytest.approx(2.0)}


def test_a_probe_that_reads_a_slow_link_ends_the_back_off() -> None:
    controller = Controller(8, 0, Settings.of(warmup_steps=4))
    drive(controller, 0, 34, tail=0.1)
    assert controller.probe_every == 64
    decisions = drive(controller, 34, 66, tail=0.1, slow={2: 3.0})  # the quiet probe at step 64
    assert controller.probe_every == 8
    assert "a probe read l = 3" in event_of(decisions[-1], "probing")["evidence"]["reason"]


def test_a_quiet_probe_misread_is_checked_by_the_next_probe_and_the_back_off_resumes() -> None:
    """Backed off, one probe reads a healthy link as slow (a loaded host): the probes come back,
    the next one reads the links healthy, and they back off again at once (not after 4 probes)."""
    controller = Controller(8, 0, Settings.of(warmup_steps=4))
    drive(controller, 0, 34, tail=0.1)
    assert controller.probe_every == 64
    decisions = drive(controller, 34, 66, tail=0.1, slow={6: 1.6})  # the quiet probe at 64 misreads rank 6
    assert controller.probe_every == 8
    assert "the next probe checks it" in event_of(decisions[-1], "probing")["evidence"]["reason"]
    decisions = drive(controller, 66, 74, tail=0.1)  # the probe at 72 reads healthy links
    assert controller.probe_every == 64
    check = event_of(decisions[-1], "probing")
    assert "the check probe read the links healthy" in check["evidence"]["reason"]
    # a real fault reads slow twice: the probes stay busy and the detector gets its evidence
    drive(controller, 74, 130, tail=0.1)
    assert controller.probe_every == 64
    drive(controller, 130, 194, tail=0.1, slow={5: 2.0})  # quiet probe at 192 reads rank 5 slow
    assert controller.probe_every == 8
    drive(controller, 194, 250, tail=0.1, slow={5: 2.0})
    assert controller.detector.degraded == {5: pytest.approx(2.0)}


def test_one_noisy_probe_does_not_keep_the_probes_busy() -> None:
    """A loaded host can read a healthy link as slow once: the back-off judges the median."""
    controller = Controller(8, 0, Settings.of(warmup_steps=4))
    drive(controller, 0, 18, tail=0.1)  # probes at 8 and 16: healthy
    drive(controller, 18, 26, tail=0.1, slow={6: 2.6})  # probe at 24 reads rank 6 at 2.6
    assert controller.probe_every == 8
    decisions = drive(controller, 26, 34, tail=0.1)  # probe at 32: healthy; median of 1, 1, 2.6, 1
    assert controller.probe_every == 64
    assert event_of(decisions[-1], "probing")["evidence"]["largest_l"][2] == pytest.approx(2.6)


def test_probes_do_not_back_off_while_the_allreduce_is_slower_than_it_was() -> None:
    """A NIC at 1/2 from step 20 that the probes misread as healthy (as single probes on a loaded
    host do: l = 1.3-1.6): every AllReduce is 1.8x slower than before, so the probes keep going;
    a slowdown that lasts ``healthy_memory_steps`` becomes the new normal and they back off."""
    config = Settings.of(warmup_steps=4, healthy_memory_steps=64)
    controller = Controller(8, 0, config)
    drive(controller, 0, 20, tail=0.100)  # probes at 8 and 16 read healthy links
    assert probings(drive(controller, 20, 70, tail=0.180)) == [] and controller.probe_every == 8
    decisions = drive(controller, 70, 120, tail=0.180)
    assert controller.probe_every == 64 and [d.probe_every for d in probings(decisions)] == [64]
    assert decisions[0].step - 4 >= 20 + 64  # not before the healthy steps left the memory
    # without the earlier healthy steps the same readings back off as soon as 4 probes agree
    controller = Controller(8, 0, config)
    decisions = drive(controller, 0, 34, tail=0.180)
    assert controller.probe_every == 64 and [d.probe_every for d in probings(decisions)] == [64]


def test_probes_do_not_back_off_without_healthy_estimates() -> None:
    # a slow link in every probe: the detector confirms it; the probes stay at probe_every, and
    # the OptCC plan for it comes with its own interval
    config = Settings.of(warmup_steps=4, verify_steps=1000)
    controller = Controller(8, 0, config)
    decisions = drive(controller, 0, 80, tail=0.1, slow={5: 2.0})
    assert controller.plan.runs_nic_plan and controller.probes.probe_target == 8
    assert all(d.probe_every == (config.plan_probe_every if d.plan.runs_nic_plan else 8) for d in decisions)
    assert not [e for e in controller.events if e["kind"] == "probing"]
    # quiet_probe_every = 0: never back off (the exchanges do, once the window is full and the
    # links read healthy)
    controller = Controller(8, 0, Settings.of(warmup_steps=4, quiet_probe_every=0))
    decisions = drive(controller, 0, 80, tail=0.1)
    assert controller.probe_every == 8 and controller.exchange_every == 6
    assert [[e["kind"] for e in d.events] for d in decisions] == [["exchange"]]


def test_exchange_carries_spans_and_link_figures() -> None:
    """Four ranks' vectors as rank 0 unpacks them: totals, bucket spans, link rates with clock offsets."""
    n = 4
    exchange = StatsExchange(group=None, world_size=n, rank=0, buckets=3)  # type: ignore[arg-type]
    exchange.offsets = ClockOffsets((0, 0, 0, 1_000_000_000), (0, 0, 0, 0))  # rank 3's clock is 1 s behind
    nic = np.array([100e6, 50e6, 100e6, 100e6])  # rank 1's links at half speed
    ring = simulate_ring_links(np.minimum(nic[:, None], nic[None, :]), np.zeros(n), messages=40)
    rows = []
    for rank in range(n):
        arrivals = []
        for step in range(2):
            arrivals.append(
                StepArrival(
                    step=10 + step,
                    total_span=0.01 * (rank + 1),
                    bucket_spans=(0.004 * (rank + 1), 0.006 * (rank + 1)),
                    bucket_bytes=(1000, 2000),
                    algorithms=("ring", "ring"),
                    link_enter_wall=1000.0 + step - (1.0 if rank == 3 else 0.0),
                    arrival_wall=2000.0 - (0.98 if rank == 3 else 0.0),  # rank 3: 20 ms late, clock 1 s behind
                    # every rank done 100 ms after rank 3 arrived, rank 1 another 15 ms later
                    finish_wall=2000.12 + (0.015 if rank == 1 else 0.0) - (1.0 if rank == 3 else 0.0),
                    links=ring[rank],
                )
            )
        exchange.rank = rank
        rows.append(exchange.pack(10, arrivals, float("nan"), 7 + rank // 2, None))
    stats = exchange.stats(torch.stack(rows).numpy(), [1000, 2000], [["ring", "ring"]] * 2)
    assert stats.steps == [10, 11]
    assert stats.totals[0] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert stats.bucket_spans.shape == (2, n, 3) and stats.bucket_spans[1, 2, 1] == pytest.approx(0.018)
    assert np.isnan(stats.bucket_spans[:, :, 2]).all()
    assert slowdowns_from_links(stats.link_rates) == pytest.approx([1.0, 2.0, 1.0, 1.0])
    assert exchange.decision(torch.stack(rows).numpy()) is None
    assert stats.hosts == [7, 7, 8, 8]
    assert stats.lateness is not None and stats.lateness[1] == pytest.approx([0, 0, 0, 0.02], abs=1e-6)
    # from the last arrival (rank 3, 2000.02 on rank 0's clock) to the last finish (rank 1, 2000.135)
    assert stats.tails is not None and stats.tails == pytest.approx([0.115, 0.115], abs=1e-6)
    # the step's end: the last finish on rank 0's clock (what consecutive steps' periods are taken from)
    assert stats.ends is not None and stats.ends == pytest.approx([2000.135, 2000.135], abs=1e-6)


def test_events_are_returned_for_the_sinks_and_log_paths_per_rank(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    controller = Controller(8, 0, Settings())
    plan = Plan("ring", ("stragglar",), 3, ())
    adopted = controller.apply(Decision(1, 40, plan, [{"kind": "switch", "evidence": {"why": "test"}}]))
    adopted += controller.apply(Decision(2, 60, Plan("ring"), [{"kind": "rollback", "evidence": {}}]))
    assert adopted == controller.events
    assert [(e["step"], e["kind"], e["algorithm"]) for e in adopted] == [
        (40, "switch", "stragglar"),
        (60, "rollback", "ring"),
    ]
    assert log_path_for(str(log), 0) == str(log) and log_path_for(str(log), 1) is None
    assert log_path_for(str(tmp_path / "ev{rank}.jsonl"), 3) == str(tmp_path / "ev3.jsonl")


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="baseline"):
        Settings.of(baseline="stragglar")
    with pytest.raises(ValueError, match="probe_every"):
        Settings.of(probe_every=-1)
    assert Settings().baseline == "allreduce" and Settings.of(baseline="ring").baseline == "ring"
    with pytest.raises(ValueError, match="exchange_every"):
        Settings.of(exchange_every=0)
    with pytest.raises(ValueError, match=re.escape("quiet_probe_every (12) must be a multiple of probe_every (8)")):
        Settings.of(quiet_probe_every=12)
    with pytest.raises(ValueError, match="probe_alarm"):
        Settings.of(probe_alarm=1.0)
    assert Settings.of(probe_every=0).quiet_probe_every == 0  # no probes at all: nothing to back off
    assert Settings.of(probe_every=12).quiet_probe_every == 72  # the next multiple of 12 from 64 on
    with pytest.raises(ValueError, match="timeout"):
        Settings.of(timeout=0)

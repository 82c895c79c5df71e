"""The DDP comm hook on real 4-rank gloo groups over loopback (small model, injected sleeps).

The runs of one world size that end cleanly share one process group (:func:`launches`), one after
the other, each from a clean slate (tests/_dist.py, ``several``); a run where a rank dies or
stalls, and the run that resumes from a checkpoint in fresh processes, have groups of their own."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ddp_bodies
import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from _dist import run_group
from _launch import Case
from _launch import launches as launched

import stragglerkit
from stragglerkit.detect.settings import Settings

N = 4
FLOOR_S = 0.02
"""Injected lateness is 2x StragglAR's measured pre-phase time, but at least this (loopback jitter is ms)."""

FAST_DETECTOR = {"window": 6, "confirm": 1, "clear_fraction": 0.01, "clear_delay_ratio": 0.0, "degraded_threshold": 1e9}
"""A detector that acts on a short window and never believes a loopback link degraded (loopback has
no NICs: its ring probes time the ranks' CPU on 2 cores)."""


def _same_events(results: dict[int, Any]) -> list[tuple[int, str, str]]:
    seen = [[(e["step"], e["kind"], e["algorithm"]) for e in results[r]["events"]] for r in range(N)]
    assert all(s == seen[0] for s in seen), seen
    return seen[0]


SWITCHES_CONFIG = {
    "warmup_steps": 5,
    "min_gain": 0.0,
    "min_bucket_bytes": 1024,
    "cooldown_steps": 20,
    # the straggler, once detected, is never cleared: under the OptCC plan forced at step 150 a
    # loaded machine could otherwise clear it and bring the baseline back before the probe.
    # Loopback has no NICs: its ring probes time 4 ranks' CPU on 2 cores (l read anywhere from
    # 1 to 23), so no rank is ever believed degraded here; otherwise a belief far off the forced
    # plan's l = 2 rebuilds the plan before the probe this test looks for.
    "detector": FAST_DETECTOR,
}
"""test_hook_trains_like_plain_ddp_through_plan_switches's loop settings."""

PROBES_CONFIG = {
    "warmup_steps": 4,
    "probe_every": 2,
    "quiet_probe_every": 8,
    "quiet_after": 2,
    "detector": {"degraded_threshold": 50.0, "clear_degraded_threshold": 40.0},
}
"""test_probes_back_off_on_every_rank_at_the_same_step's loop settings."""

CHECKPOINT_CONFIG = {
    "warmup_steps": 5,
    "baseline": "ring",
    "probe_every": 0,
    "min_gain": 0.0,
    "min_bucket_bytes": 1024,
    "verify_steps": 10_000,
    "detector": FAST_DETECTOR,
}
"""test_checkpoint_mid_run_resumes_the_plan_in_fresh_processes's loop settings."""
CHECKPOINT_LATE_S = 0.03

STEPS = 60
"""Steps of the runs without a fault."""

CASES: dict[str, Case] = {
    # case: (world size, (its test, its parameters), its body in tests/ddp_bodies.py, its arguments)
    **{
        f"switches/{name}": (
            N,
            ("test_hook_trains_like_plain_ddp_through_plan_switches", name),
            ddp_bodies.hook_vs_plain,
            (200, 3, 15, 0.02, 150, SWITCHES_CONFIG, views),
        )
        for name, views in (("copied_gradients", False), ("gradient_as_bucket_view", True))
    },
    "probes": (
        N,
        ("test_probes_back_off_on_every_rank_at_the_same_step", ""),
        ddp_bodies.hook_vs_plain,
        (STEPS, 0, STEPS, 0.0, -1, PROBES_CONFIG),
    ),
    "exchanges": (
        3,
        ("test_exchanges_lengthen_on_every_rank_at_the_same_step_once_all_is_quiet", ""),
        ddp_bodies.hook_vs_plain,
        (STEPS, 0, STEPS, 0.0, -1, {"warmup_steps": 4, "probe_every": 0}),
    ),
    "straggler_moves": (
        N,
        ("test_straggler_detected_acted_on_and_remapped_when_it_moves", ""),
        ddp_bodies.straggler_run,
        (170, [(50, 3), (110, 1)], False, FLOOR_S, {"baseline": "ring", "detector": {"degraded_threshold": 1e9}}),
    ),
    "jitter": (
        N,
        ("test_jitter_spread_over_all_ranks_switches_nothing", ""),
        ddp_bodies.straggler_run,
        (1000, [], True, FLOOR_S, {}),
    ),
    "checkpoint": (  # the first run, which saves the checkpoint (its path is added)
        N,
        ("test_checkpoint_mid_run_resumes_the_plan_in_fresh_processes", ""),
        ddp_bodies.checkpoint_run,
        (None, CHECKPOINT_LATE_S, CHECKPOINT_CONFIG),
    ),
    "clock": (
        3,
        ("test_clock_offsets_are_measured_again_so_a_clock_that_jumps_is_followed", ""),
        ddp_bodies.clock_run,
        (20, 12, {"warmup_steps": 4, "clock_sync_every": 8}),
    ),
    "state_validation": (3, ("test_state_validates_its_arguments", ""), ddp_bodies.state_validation, ()),
}


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Where the checkpoint test's first run saves (and its second run loads)."""
    return str(tmp_path_factory.mktemp("checkpoint") / "checkpoint.pt")


@pytest.fixture(scope="module")
def launches(request: pytest.FixtureRequest, checkpoint_path: str) -> Callable[[str], dict[int, Any]]:
    """``launches(case)``: {rank: what the case's body returned}, from one process group per world
    size that runs the cases of the tests selected in this session (tests/_launch.py)."""
    size, test, body, args = CASES["checkpoint"]
    return launched(request, {**CASES, "checkpoint": (size, test, body, (checkpoint_path, *args))})


@pytest.mark.parametrize("views", [False, True], ids=["copied_gradients", "gradient_as_bucket_view"])
def test_hook_trains_like_plain_ddp_through_plan_switches(
    views: bool, request: pytest.FixtureRequest, launches: Callable[[str], dict[int, Any]]
) -> None:
    """200 steps, hook vs plain DDP on the same data; the hook switches early (small window, rank 3 late
    from step 15) and is forced onto OptCC at step 150: parameters agree at every step. Both with
    DDP's default (gradients copied into the buckets) and with the gradients as views of the buckets."""
    results = launches(f"switches/{request.node.callspec.id}")
    assert CASES[f"switches/{request.node.callspec.id}"][3][-1] is views
    for out in results.values():
        assert out["step"] == 200
        assert max(out["diffs"]) <= 1e-5 * max(out["scale"], 1.0), max(out["diffs"])
    # identical on all ranks, bit for bit, at every step
    assert all(results[r]["checksums"] == results[0]["checksums"] for r in range(N))
    assert all(np.array_equal(results[r]["hooked"], results[0]["hooked"]) for r in range(N))
    algorithms = results[0]["algorithms"]
    assert all(results[r]["algorithms"] == algorithms for r in range(N))
    assert algorithms[:5] == ["allreduce"] * 5 and algorithms[5] == "allreduce"
    events_rank0 = [(e["step"], e["kind"], e["algorithm"]) for e in results[0]["events"]]
    assert "stragglar" in algorithms[15:150] and "optcc" in algorithms[150:], (algorithms, events_rank0)
    # the baseline is the group's own all_reduce; every probe_every-th step after warm-up the
    # largest bucket runs stragglerkit's ring (a probe) -- until the plan moves it to StragglAR
    buckets = results[0]["bucket_algorithms"]
    assert all(results[r]["bucket_algorithms"] == buckets for r in range(N))
    every = Settings().detection.probe_every
    for step in range(5, 15):
        if algorithms[step] != "allreduce":
            break  # rank 3 is late from step 15, but window 6 with confirm 1 may act on noise before
        largest = max(nbytes for nbytes, _ in buckets[step - 1])
        ring = [nbytes for nbytes, algorithm in buckets[step] if algorithm == "ring"]
        assert ring == ([largest] if step % every == 0 else []), (step, buckets[step])
        assert {a for _, a in buckets[step]} <= {"allreduce", "ring"}
    events = _same_events(results)
    assert any(kind == "switch" and algorithm == "stragglar" and step < 60 for step, kind, algorithm in events), events
    # under the OptCC plan forced at step 150, after its settle and verification steps, every
    # plan_probe_every-th step the largest bucket runs a ring probe instead of OptCC (at 192), and
    # the probes then follow the interval in force (a probe that reads rank 1 off the plan's l = 2
    # brings them to every probe_every-th step)
    config = Settings()
    intervals = results[0]["probe_every"]
    lasted = next((s for s in range(150, 200) if not any(a in ("optcc", "ring") for _, a in buckets[s])), 200)
    probed = [s for s in range(150, lasted) if any(a == "ring" for _, a in buckets[s])]
    expected = [
        s for s in range(150 + config.settle_steps + config.detection.verify_steps, lasted) if s % intervals[s - 1] == 0
    ]
    assert lasted > 192 and probed == expected and probed[0] == 192, (lasted, probed, buckets[150:])
    for step in probed:
        largest = max(nbytes for nbytes, _ in buckets[step - 1])
        assert [n for n, a in buckets[step] if a == "ring"] == [largest], buckets[step]


def test_probes_back_off_on_every_rank_at_the_same_step(launches: Callable[[str], dict[int, Any]]) -> None:
    """No fault: the ring probes come every 2nd step after warm-up, every 8th once the last 2 probes
    read healthy links, and (on an alarm) every 2nd again; every rank probes the same steps, which
    are exactly those the interval in force names. (The degraded threshold is raised: 4 ranks on
    2 loaded cores can read a healthy loopback link as slow.)"""
    steps = STEPS
    results = launches("probes")
    buckets, every = results[0]["bucket_algorithms"], results[0]["probe_every"]
    assert all(results[r]["bucket_algorithms"] == buckets and results[r]["probe_every"] == every for r in range(N))
    assert every[:4] == [2] * 4 and 8 in every, every
    for step in range(4, steps):
        in_force = every[step - 1]  # adopted at the start of a step, recorded after it
        probed = any(algorithm == "ring" for _, algorithm in buckets[step])
        assert probed == (step % in_force == 0), (step, in_force, buckets[step])
    probing = [e for e in results[0]["events"] if e["kind"] == "probing"]
    assert probing and probing[0]["evidence"]["every"] == 8 and "healthy" in probing[0]["evidence"]["reason"]
    assert [e["evidence"]["every"] for e in probing] == [8, 2] * (len(probing) // 2) + [8] * (len(probing) % 2)
    for out in results.values():
        assert max(out["diffs"]) <= 1e-5 * max(out["scale"], 1.0)


def test_exchanges_lengthen_on_every_rank_at_the_same_step_once_all_is_quiet(
    launches: Callable[[str], dict[int, Any]],
) -> None:
    """No fault: the stats exchanges go from every 2nd step to every 6th once all has been quiet for
    a window (16 steps), on every rank at the same steps, and training matches plain DDP. 3 ranks
    and no probes: StragglAR does not apply to an odd group, so no rank is ever a straggler suspect
    (with 4 ranks on a loaded machine one can be, which rightly keeps the exchanges short), and
    no probe alarm brings doubt (docs/detection.md)."""
    n = 3
    results = launches("exchanges")
    exchanges, intervals = results[0]["exchanges"], results[0]["exchange_every"]
    assert all(results[r]["exchanges"] == exchanges and results[r]["exchange_every"] == intervals for r in range(n))
    assert exchanges[:3] == [2, 4, 6] and intervals[-1] == 6, (exchanges, intervals)
    for issued, following in itertools.pairwise(exchanges):
        assert following - issued == intervals[issued + 1], (issued, following, intervals)  # adopted at issued + 1
    quiet = [e for e in results[0]["events"] if e["kind"] == "exchange"]
    assert [e["evidence"]["every"] for e in quiet] == [6] and "all quiet for 16 steps" in quiet[0]["evidence"]["reason"]
    for out in results.values():
        assert max(out["diffs"]) <= 1e-5 * max(out["scale"], 1.0)


def test_straggler_detected_acted_on_and_remapped_when_it_moves(launches: Callable[[str], dict[int, Any]]) -> None:
    """Default Config but for the baseline and the NIC threshold: rank 3 late from step 50 (acted on
    by step 70), rank 1 from step 110. The baseline is stragglerkit's ring here: over loopback, with
    4 ranks on 2 cores and 150 KB buckets, StragglAR does not beat gloo's own all_reduce (the default
    baseline), so the controller rightly rolls such a switch back; the figures on real links are
    bench --mode train's. Loopback has no NICs: under load its ring probes can read a rank's CPU as
    a degraded link, so no link is believed degraded here."""
    results = launches("straggler_moves")
    events = _same_events(results)
    # nothing detected or switched before the straggler appears (the exchange interval may change)
    assert not [e for e in events if e[0] <= 50 and e[1] != "exchange"], events
    rank0 = results[0]["events"]
    detected = [e for e in rank0 if e["kind"] == "detected_straggler"]
    switches = [e for e in rank0 if e["kind"] == "switch"]
    assert detected[0]["step"] <= 70 and detected[0]["evidence"]["ranks"].keys() == {"3"}
    first = switches[0]
    assert first["step"] <= 70 and first["algorithm"] == "stragglar" and first["evidence"]["to"]["straggler"] == 3
    assert first["evidence"]["detector"]["fraction"] >= 0.75
    # the new straggler is confirmed either before the old one is cleared (one event, moved_from=3) or
    # just after it (cleared, then detected): both hysteresis windows end a few steps after the move
    moved = [e for e in detected if e["evidence"]["ranks"].keys() == {"1"}]
    assert moved and 110 < moved[0]["step"] <= 140
    assert moved[0]["evidence"].get("moved_from") == 3 or any(
        e["kind"] == "cleared" and e["evidence"].get("rank") == 3 and e["step"] <= moved[0]["step"] for e in rank0
    )
    remap = [e for e in switches if e["evidence"]["to"]["straggler"] == 1]
    assert remap and 110 < remap[0]["step"] <= 140
    # the straggler plays logical rank n-1 from the remap on, on every rank
    for r in range(N):
        algorithms = results[r]["algorithms"]
        assert algorithms[remap[0]["step"]] == ("stragglar", [0, 2, 3, 1])
    assert all(np.array_equal(results[r]["params"], results[0]["params"]) for r in range(N))
    # one machine, one clock: the ping-pong offsets are about zero (within half a round trip)
    offsets, rtts = results[0]["offsets"]
    assert offsets[0] == 0 and all(r > 0 for r in rtts[1:])
    assert all(abs(o) <= max(r, 200_000) for o, r in zip(offsets[1:], rtts[1:])), (offsets, rtts)


def test_jitter_spread_over_all_ranks_switches_nothing(launches: Callable[[str], dict[int, Any]]) -> None:
    """Every rank late by uniform(0, delay) every step, 1000 steps: no straggler, no switch."""
    results = launches("jitter")
    events = _same_events(results)
    assert not [e for e in events if e[1] in ("detected_straggler", "switch")], events
    # (a heavily loaded machine can starve one rank's transfers enough to read as a slow link: a
    # detected_degraded finding is possible on loopback; the latency-bound loopback model does not
    # predict OptCC to pay there, so nothing switches)
    assert set(a for a, _ in results[0]["algorithms"][10:]) == {"allreduce"}


def _fault_entry(rank: int, n: int, store_path: str, queue: Any, fault: str, step: int) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    store = dist.FileStore(store_path, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    try:
        cfg = {"warmup_steps": 3, "timeout": 2.0}
        queue.put((rank, ddp_bodies.fault_run(rank, n, fault, step, cfg)))
    except BaseException:
        queue.put((rank, traceback.format_exc()))
    queue.close()
    queue.join_thread()
    os._exit(0)  # do not wait for the broken group's threads


def _run_fault(fault: str, step: int) -> dict[int, str]:
    ctx = mp.get_context("spawn")
    queue: multiprocessing.Queue[Any] = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_fault_entry, args=(r, N, path, queue, fault, step), daemon=True) for r in range(N)]
        for p in procs:
            p.start()
        expected = N - 1 if fault == "dies" else N
        results = dict(queue.get(timeout=120) for _ in range(expected))
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    return results


@pytest.mark.parametrize("fault", ["dies", "stalls"])
@pytest.mark.parametrize("step", [8, 9], ids=["probe-step", "group-allreduce-step"])
def test_dead_or_stalled_rank_fails_the_step_naming_it(fault: str, step: int) -> None:
    """Rank 2 exits or stalls at ``step``: at step 8 (a probe) the largest bucket runs the executor's
    ring and the rest the group's own all_reduce; at step 9 every bucket runs the group's own.
    Every other rank fails within the timeout (2 s) plus the 2 s of reports, naming rank 2; what
    ``loss.backward()`` raises is the library's own PeerError with ``peer == 2`` and its message
    first (not torch's ``RuntimeError: Unable to cast ...``), or ``peer`` None where a live rank
    that was still blocked is named with it."""
    results = _run_fault(fault, step)
    for rank in (0, 1, 3):
        error = results[rank]
        assert error != "ok" and "stragglerkit all_reduce" in error, error
        assert f"rank 2 did not reach step {step}'s AllReduce" in error, error
        # a live rank still blocked in the collective when the 2 s of reports end is named too (on 2
        # loaded cores it happens): then no single peer is blamed, and rank 2 is among those named
        assert error.startswith(("PeerError peer=2: stragglerkit all_reduce (", "PeerError peer=None: ")), error
        assert "Unable to cast" not in error, error


def test_checkpoint_mid_run_resumes_the_plan_in_fresh_processes(
    launches: Callable[[str], dict[int, Any]], checkpoint_path: str
) -> None:
    """4 ranks, rank 3 late every step: once StragglAR has run 4 steps, rank 0 saves the model, the
    optimizer and the hook's state with ``torch.save``, and the run goes on 12 steps. Fresh
    processes then ``stragglerkit.init()``, load that checkpoint on every rank and train the same 12
    steps: the hook resumes at the saved step with the saved plan and events, runs StragglAR from
    its first step (no warm-up again), and the parameters match the uninterrupted run's within 1e-6
    and are identical on every rank. (No probes, and a verification too long to end in the test:
    what runs at each step is the plan's alone, so both runs run the same algorithms. Not bit for
    bit: the restored DDP's first step reduces its gradients in DDP's first-iteration buckets,
    one here, which rounds differently from the two buckets of the uninterrupted run.)"""
    first = launches("checkpoint")
    saved = first[0]["saved"]
    assert saved and all(first[r]["saved"]["saved_at"] == saved["saved_at"] for r in range(N)), saved
    assert Path(checkpoint_path).is_file()
    then = run_group(N, ddp_bodies.checkpoint_run, checkpoint_path, saved, CHECKPOINT_LATE_S, CHECKPOINT_CONFIG)
    at = saved["saved_at"]
    for r in range(N):
        restored = then[r]["restored"]
        assert restored["step"] == at and restored["plan"] == saved["plan"], (restored, saved)
        assert restored["events"] == saved["events"]
        assert then[r]["algorithms"][0] == "stragglar", then[r]["algorithms"]
        assert "stragglar" in then[r]["bucket_algorithms"][0], then[r]["bucket_algorithms"][0]
        assert then[r]["algorithms"] == first[r]["algorithms"][at:], (then[r]["algorithms"], first[r]["algorithms"])
        assert then[r]["step"] == first[r]["step"] == at + 12
        assert np.array_equal(then[r]["params"], then[0]["params"])
    gap = np.abs(then[0]["params"] - first[0]["params"]).max()
    assert gap <= 1e-6, gap


def test_clock_offsets_are_measured_again_so_a_clock_that_jumps_is_followed(
    launches: Callable[[str], dict[int, Any]],
) -> None:
    """Rank 2's clock runs 30 ms ahead, then jumps to 80 ms ahead at step 12: the start-up offset
    holds until the re-measurement at step 16 (clock_sync_every = 8), which every rank adopts."""
    results = launches("clock")
    for rank in range(3):
        offsets = np.array(results[rank]["offsets"]) / 1e6  # ms to add to each rank's clock for rank 0's
        # an offset is read to within half the fastest round trip; on a loaded machine that can be a few
        # ms, so the tolerance is 10 ms, still a fifth of the 50 ms jump that must be followed
        assert np.abs(offsets[:, 0]).max() == 0 and np.abs(offsets[:, 1]).max() < 10.0, offsets
        assert np.abs(offsets[:16, 2] + 30).max() < 10.0, offsets[:, 2]  # start-up, then the sync at 8
        assert np.abs(offsets[16:, 2] + 80).max() < 10.0, offsets[:, 2]  # re-measured at 16
        syncs = results[rank]["syncs"]
        assert [s["step"] for s in syncs] == [8, 16], syncs
        assert syncs[0]["largest_shift_ms"] < 10.0 and abs(syncs[1]["largest_shift_ms"] - 50) < 10.0, syncs


def test_exchange_gathers_every_rank_to_rank_0_and_broadcasts_its_decision() -> None:
    """A real gloo group of 5 ranks (odd), three exchanges in a row of 2, 6 and 2 steps: rank 0
    receives each rank's own figures in rank order, and every rank decodes rank 0's decision of
    that round, with the probe and exchange intervals it ships."""
    n, rounds = 5, 3
    results = run_group(n, ddp_bodies.exchange_rounds, rounds)
    root = results[0]["seen"]
    for r in range(rounds):
        steps = 2 + 4 * (r % 2)
        assert root[r]["totals"] == [[100.0 * k + 10 * r + i for k in range(n)] for i in range(steps)]
        assert root[r]["hosts"] == list(range(n))
        for rank in range(n):
            seq, step, plan, probe_every, exchange_every, kinds = results[rank]["seen"][r]["decision"]
            assert (seq, step, probe_every, kinds) == (r + 1, 2 * r + 4, 8 * (r + 1), ["switch", "exchange"])
            assert exchange_every == 2 + 4 * ((r + 1) % 2)
            assert plan.straggler == r % n and plan.buckets == ("stragglar", "allreduce")
    assert results[0]["rows_shape"][0] == n and all(results[k]["rows_shape"][0] == 1 for k in range(1, n))


def test_state_validates_its_arguments(launches: Callable[[str], dict[int, Any]]) -> None:
    if not dist.is_initialized():
        with pytest.raises(stragglerkit.NotInitializedError, match="init_process_group"):
            stragglerkit.DDPState(None)
    results = launches("state_validation")
    for out in results.values():
        assert "stragglerkit.init()" in out["before_init"] and out["before_init"].startswith("NotInitializedError")
        assert out["bad_config"].startswith("ConfigError") and "stragglerkit.Config" in out["bad_config"]
        assert out["after_close"] == "ok"
        assert out["unbound"].startswith("NotInitializedError") and "bind" in out["unbound"], out["unbound"]
        assert out["bound"] == "ok"

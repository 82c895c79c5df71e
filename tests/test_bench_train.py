"""The training bench (python -m profiling.lab.train): options, the summary's arithmetic, and small end-to-end runs.

The loopback run always happens (4 ranks, 40 steps, about 20 s); the emulated-cluster run needs
root and iproute2 and is skipped otherwise with EmulatedCluster.available()'s reason (it fails
instead under CI=true).
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest
from _require import needs, require_or_skip

from profiling.lab.copies import hidden_width, turns
from profiling.lab.train import main as train_main
from profiling.lab.train import run_train
from profiling.lab.train_config import TrainConfig, parse_jitter
from profiling.lab.train_report import compute_speedup, group_step_times, print_summary, summarize
from stragglerkit.cli import main
from stragglerkit.testbed import EmulatedCluster

FIELDS = {"detected_step", "switched_step", "algorithm", "speedup_steady", "max_param_diff", "switches"}

# ------------------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 1}, "world-size"),
        ({"steps": 0}, "--steps"),
        ({"straggler": 8}, "not a rank"),
        ({"delay": 0.01}, "needs --straggler"),
        ({"straggler": 1, "degrade": {2: 2.0}}, "either"),
        ({"degrade": {1: 2.0}, "mode": "loopback"}, "emulated cluster"),
        ({"degrade": {1: 2.0}, "mode": "torchrun"}, "emulated cluster"),
        ({"degrade": {9: 2.0}}, "not a rank"),
        ({"moves": [(30, 2)]}, "needs --straggler"),
        ({"straggler": 1, "delay": 0.01, "from_step": 20, "moves": [(10, 2)]}, "after --from-step"),
        ({"straggler": 1, "delay": 0.01, "moves": [(10, 1)]}, "already the straggler"),
        ({"straggler": 1, "delay": 0.01, "moves": [(500, 2)]}, "before --steps"),
        ({"from_step": 5}, "give --straggler"),
        ({"straggler": 1, "delay": 0.01, "from_step": 120}, "below --steps"),
        ({"world_size": 5, "straggler": 4}, "give --delay MS"),
        ({"jitter": -1.0}, "--jitter"),
        ({"model_bytes": 100}, "--model-size"),
        ({"hook_warmup": -1}, "--hook-warmup"),
        ({"degraded_threshold": 1.0}, "--degraded-threshold"),
        ({"degraded_threshold": float("nan")}, "--degraded-threshold"),
        ({"reshape_at": 50}, "give --degrade"),
        ({"degrade": {1: 2.0}, "from_step": 20, "reshape_at": 10}, "after --from-step"),
        ({"degrade": {1: 2.0}, "from_step": 20, "reshape_at": 500}, "before --steps"),
        ({"degrade": {1: 2.0}, "from_step": 20, "reshape_at": 50, "reshape_to": {9: 4.0}}, "rank 9"),
        ({"degrade": {1: 2.0}, "from_step": 20, "reshape_at": 50, "reshape_to": {1: 0.5}}, "finite number >= 1"),
        ({"degrade": {1: 2.0}, "from_step": 20, "reshape_to": {1: 4.0}}, "needs reshape_at"),
        ({"steps_per_block": 0}, "--steps-per-block"),
        ({"framework": "jax"}, "--framework must be one of ddp, horovod"),
        ({"framework": "horovod", "mode": "torchrun"}, "under torchrun use --framework ddp"),
    ],
)
def test_config_rejects_bad_combinations(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_config_round_trips_and_knows_the_late_rank() -> None:
    config = TrainConfig(straggler=3, delay=0.05, from_step=10, moves=[(40, 1), (80, 5)], jitter=0.002)
    assert TrainConfig.from_json(config.to_json()) == config
    reshaped = TrainConfig(degrade={3: 2.0}, from_step=10, reshape_at=60, reshape_to={3: 4.0}, mode="emulated")
    assert TrainConfig.from_json(reshaped.to_json()) == reshaped
    near_full_rate = TrainConfig(degrade={3: 8 / 7}, from_step=10, degraded_threshold=1.1, mode="emulated")
    assert TrainConfig.from_json(near_full_rate.to_json()) == near_full_rate
    assert [config.late_rank(s) for s in (0, 9, 10, 39, 40, 79, 80, 119)] == [None, None, 3, 3, 1, 1, 5, 5]
    assert config.scenario == "straggler"
    assert TrainConfig(jitter=0.01).scenario == "jitter"
    assert TrainConfig().scenario == "none"


def test_blocks_cover_every_step_and_start_where_the_links_change() -> None:
    assert TrainConfig(steps=25).blocks() == [range(0, 10), range(10, 20), range(20, 25)]
    assert TrainConfig(steps=3, steps_per_block=1).blocks() == [range(0, 1), range(1, 2), range(2, 3)]
    degraded = TrainConfig(steps=40, degrade={3: 2.0}, from_step=15, reshape_at=33, mode="emulated")
    assert degraded.blocks() == [
        range(0, 10),
        range(10, 15),
        range(15, 20),
        range(20, 30),
        range(30, 33),
        range(33, 40),
    ]
    # a straggler or its moves need no block of their own: the lateness is per step
    late = TrainConfig(steps=30, straggler=1, delay=0.01, from_step=15, moves=[(17, 2)])
    assert late.blocks() == [range(0, 10), range(10, 20), range(20, 30)]


def test_option_parsers() -> None:
    assert parse_jitter("20") == pytest.approx(0.02)
    assert parse_jitter("5ms") == pytest.approx(0.005)
    with pytest.raises(ValueError, match="--jitter"):
        parse_jitter("lots")
    for size in (2**20, 8 * 2**20, 32 * 2**20):
        width = hidden_width(size)
        numel = width * width + 274 * width + 16
        assert abs(4 * numel - size) / size < 0.02


def test_command_reports_bad_options_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert train_main(["--loopback", "--plot", "x.png"]) == 2
    assert "--plot: only with --sync selective" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the AllReduce bench's options are not the training's
        train_main(["--loopback", "--sizes", "1MiB"])
    assert "unrecognized arguments: --sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # no abbreviations: --degr is neither --degrade nor --degraded-threshold
        train_main(["--loopback", "--degr", "1:2"])
    assert "unrecognized arguments: --degr" in capsys.readouterr().err
    assert train_main(["--loopback", "--degrade", "1:2"]) == 2
    assert "emulated cluster" in capsys.readouterr().err
    assert train_main(["--loopback", "--move-straggler-at", "50", "1"]) == 2
    assert "needs --straggler" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["--jitter", "often"])
    assert "--jitter" in capsys.readouterr().err


def test_stragglerkit_bench_says_where_the_training_mode_went(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--mode", "train", "--loopback", "--steps", "10"])
    err = capsys.readouterr().err
    assert "--mode train left the installed package" in err and "python -m profiling.lab.train" in err, err


def test_cli_refuses_a_bad_send_buffer_before_starting_ranks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRAGGLERKIT_TCP_SEND_BUFFER", "lots")
    for run in (lambda: main(["bench", "--loopback"]), lambda: train_main(["--loopback"])):
        assert run() == 2
        err = capsys.readouterr().err
        assert "STRAGGLERKIT_TCP_SEND_BUFFER='lots'" in err and "cannot read 'lots' as a size" in err, err


# ------------------------------------------------------------------------------------- summary


def _record(steps: int, events: list[dict[str, Any]], plain: float, hooked: float) -> dict[str, Any]:
    return {
        "hidden": 392,
        "parameters": 261088,
        "gradient_bytes": 1044352,
        "buckets_bytes": [1044352],
        "delay_s": 0.03,
        "delay_calibration": None,
        "hook_config": {"warmup_steps": 10, "settle_steps": 2},
        "plain_s": [[plain, plain * 0.9]] * steps,
        "hooked_s": [[hooked, hooked * 0.9] if s >= 30 else [plain, plain] for s in range(steps)],
        "plain_backward_s": [[plain / 2, plain]] * steps,
        "hooked_backward_s": [[hooked / 2, hooked] if s >= 30 else [plain / 2, plain] for s in range(steps)],
        "param_diff": [0.0] * steps,
        "param_scale": 1.0,
        "checksums": {"plain": [1.0, 1.0], "hooked": [2.0, 2.0]},
        "loss": {"plain": [], "hooked": []},
        "algorithms": ["allreduce"] * 10 + ["ring"] * 20 + ["stragglar"] * (steps - 30),
        "rank_maps": [[0, 1]] * steps,
        "events": events,
        "final_plan": {},
    }


def test_summary_steady_state_starts_after_the_last_plan_change() -> None:
    config = TrainConfig(world_size=2, mode="loopback", steps=60, straggler=1, delay=0.03, from_step=5)
    events = [
        {"step": 30, "kind": "detected_straggler", "algorithm": "stragglar", "evidence": {"ranks": {"1": 0.03}}},
        {"step": 30, "kind": "switch", "algorithm": "stragglar", "evidence": {"to": {"straggler": 1}}},
    ]
    summary = summarize(config, _record(60, events, plain=0.2, hooked=0.1))
    assert summary["detected_step"] == 30 and summary["switched_step"] == 30
    assert summary["steady_steps"] == [32, 59]
    assert summary["speedup_steady"] == pytest.approx(2.0)
    assert summary["backward_speedup_steady"] == pytest.approx(2.0)
    assert summary["plain_backward_steady_ms"] == pytest.approx(100.0)
    assert summary["algorithm"] == "stragglar" and len(summary["switches"]) == 1
    assert summary["speedup_steady_total"] == pytest.approx(2.0)
    phases = summary["phases"]
    assert [p["steps"] for p in phases] == [[0, 4], [5, 9], [10, 29], [30, 31], [32, 59]]
    assert [p["steady"] for p in phases] == [False, False, False, False, True]
    assert phases[1]["fault"] == "rank 1 late" and phases[0]["fault"] == "-"


def test_the_control_compares_the_part_of_the_step_without_stragglerkit() -> None:
    """Steps of 1.0 s (plain) and 0.7 s (hooked) with backward passes of 0.6 and 0.3 s: the rest
    (0.4 s) is the same in both copies, so the control is 1 while the step is 1.43x faster. A
    hooked copy whose forward is 10 % slower for the whole run shows as a control of 1/1.1."""
    config = TrainConfig(world_size=2, mode="loopback", steps=40)
    record = _record(40, [], plain=0.2, hooked=0.2)
    record["plain_s"] = [[1.0, 1.0]] * 40
    record["plain_backward_s"] = [[0.6, 0.6]] * 40
    record["hooked_s"] = [[0.7, 0.7]] * 40
    record["hooked_backward_s"] = [[0.3, 0.3]] * 40
    summary = summarize(config, record)
    assert summary["speedup_steady"] == pytest.approx(1.0 / 0.7)
    assert summary["compute_speedup_steady"] == pytest.approx(1.0)
    record["hooked_s"] = [[0.74, 0.74]] * 40
    assert summarize(config, record)["compute_speedup_steady"] == pytest.approx(0.4 / 0.44)
    assert compute_speedup({"plain_s": record["plain_s"]}, list(range(40))) is None  # no backward times


def test_the_aa_control_is_the_plain_copy_over_its_identical_second_copy() -> None:
    """A control copy 5 % slower than plain for the whole run reads 1/1.05: the launch's noise,
    beside the plain/hooked speedup; without a control copy there is no control figure."""
    config = TrainConfig(world_size=2, mode="loopback", steps=40)
    record = _record(40, [], plain=0.2, hooked=0.1)
    without = summarize(config, record)
    assert without["control_speedup_steady"] is None
    record["control_s"] = [[0.21, 0.21 * 0.9]] * 40
    record["control_backward_s"] = [[0.1, 0.2]] * 40
    summary = summarize(config, record)
    assert summary["control_speedup_steady"] == pytest.approx(0.2 / 0.21)
    assert summary["control_speedup_steady_total"] == pytest.approx(0.2 / 0.21)
    assert summary["speedup_steady"] == without["speedup_steady"]  # the control changes no other figure
    assert summary["steps"]["control_s"] == [0.21] * 40


def test_copies_take_every_place_and_follow_every_other_copy_equally() -> None:
    """Over a cycle of blocks each copy runs first equally often and right after each other copy
    equally often: background work one copy leaves behind falls on the others alike."""
    cycle = turns(["plain", "control", "hooked"])
    assert len(cycle) == 6 and all(sorted(order) == ["control", "hooked", "plain"] for order in cycle)
    firsts = [order[0] for order in cycle]
    assert {name: firsts.count(name) for name in firsts} == {"plain": 2, "control": 2, "hooked": 2}
    follows = [pair for order in cycle for pair in itertools.pairwise(order)]
    assert len(set(follows)) == 6 and all(follows.count(pair) == 2 for pair in follows)
    assert turns(["plain", "hooked"]) == [["plain", "hooked"], ["hooked", "plain"]]


def test_total_time_speedup_counts_the_rare_slow_steps_the_median_leaves_out() -> None:
    """Every 8th steady step of the hooked run is 3x slower (a probe): the median ignores it, the
    total-time ratio does not."""
    config = TrainConfig(world_size=2, mode="loopback", steps=64, straggler=1, delay=0.03, from_step=5)
    events = [{"step": 30, "kind": "switch", "algorithm": "stragglar", "evidence": {"to": {"straggler": 1}}}]
    record = _record(64, events, plain=0.2, hooked=0.1)
    record["hooked_s"] = [[0.3, 0.3] if s >= 32 and s % 8 == 0 else ranks for s, ranks in enumerate(record["hooked_s"])]
    summary = summarize(config, record)
    assert summary["steady_steps"] == [32, 63] and summary["speedup_steady"] == pytest.approx(2.0)
    # 32 steady steps: 28 of 0.1 s and 4 of 0.3 s against 32 of 0.2 s
    assert summary["speedup_steady_total"] == pytest.approx(6.4 / 4.0)


def test_cpu_busy_share_is_the_busiest_hosts_over_the_steady_steps() -> None:
    config = TrainConfig(world_size=2, mode="loopback", steps=60)
    record = _record(60, [], plain=0.2, hooked=0.2)
    # rank 1's host: 90 of 100 ticks busy in every step (70 before the steady steps); rank 0's: 50
    record["plain_cpu"] = [[[50, 100], [90 if s >= 12 else 70, 100]] for s in range(60)]
    record["hooked_cpu"] = [[[60, 100], None] for _ in range(60)]  # rank 1 could not read its counters
    summary = summarize(config, record)
    assert summary["cpu_busy_steady"] == {"plain": pytest.approx(0.9), "hooked": pytest.approx(0.6)}
    out = io.StringIO()
    header = {"config": json.loads(config.to_json()), "mode": "loopback", "mode_reason": "test", "load_average": [1.0]}
    print_summary(summary, header, out)
    assert "CPUs busy during the steps (busiest host, all cores): plain 90 %, hooked 60 %" in out.getvalue()
    del record["plain_cpu"], record["hooked_cpu"]  # a record from before the counters
    assert summarize(config, record)["cpu_busy_steady"] == {"plain": None, "hooked": None}


def test_group_step_time_is_the_pace_of_the_last_rank_to_finish() -> None:
    """Free-running blocks: a rank that finishes every step 20 ms after the others adds those 20 ms
    once per block (at its first step), not once per step."""
    # block of 3 steps: rank 0 ends at 0.10, 0.20, 0.30; rank 1 at 0.12, 0.22, 0.32; then a new block
    ends = [[0.10, 0.12], [0.20, 0.22], [0.30, 0.32], [0.15, 0.11]]
    times = group_step_times(ends, [0, 3])
    assert times == pytest.approx([0.12, 0.10, 0.10, 0.15])
    assert sum(times[:3]) == pytest.approx(max(ends[2]))  # a block's steps add up to its time
    # lockstep: every step starts a block, so a step's time is the slowest rank's
    assert group_step_times(ends, [0, 1, 2, 3]) == pytest.approx([0.12, 0.22, 0.32, 0.15])
    config = TrainConfig(world_size=2, mode="loopback", steps=4, steps_per_block=3)
    record = _record(4, [], plain=0.2, hooked=0.2)
    record.update(plain_end_s=ends, hooked_end_s=ends, block_starts=[0, 3])
    assert summarize(config, record)["steps"]["plain_s"] == pytest.approx(times)


def test_summary_without_plan_change_measures_after_warm_up_and_fault() -> None:
    config = TrainConfig(world_size=2, mode="loopback", steps=60)
    summary = summarize(config, _record(60, [], plain=0.2, hooked=0.2))
    assert summary["detected_step"] is None and summary["switched_step"] is None
    assert summary["steady_steps"] == [12, 59]
    config = TrainConfig(world_size=2, mode="loopback", steps=60, jitter=0.01, from_step=20)
    assert summarize(config, _record(60, [], plain=0.2, hooked=0.2))["steady_steps"] == [22, 59]


# ------------------------------------------------------------------------------------- end to end


def test_loopback_train_end_to_end(tmp_path: Path) -> None:
    """4 ranks, rank 3 sleeps 30 ms before backward from step 2: detected, switched, same parameters."""
    out = io.StringIO()
    json_path = tmp_path / "train.json"
    config = TrainConfig(
        world_size=4,
        mode="loopback",
        bandwidth=None,
        steps=40,
        straggler=3,
        delay=0.03,
        from_step=2,
        model_bytes=2**20,
        timeout=180,
    )
    summary = run_train(config, argv=["--loopback"], json_path=str(json_path), out=out)
    assert summary is not None
    data = json.loads(json_path.read_text())
    assert FIELDS <= set(data)
    assert {"command", "machine", "date", "load_average", "config"} <= set(data["header"])
    assert data["header"]["command"] == "python -m profiling.lab.train --loopback"
    assert data["max_param_diff"] <= 1e-5 * max(data["param_scale"], 1.0)
    assert data["hooked_identical_on_all_ranks"] and data["plain_identical_on_all_ranks"]
    assert data["detected_step"] is not None and data["detected_step"] > 2
    assert data["detected"][0]["ranks"].keys() == {"3"}
    # the hook acts on what it detected: its first plan change is the switch to StragglAR
    switched = data["switched_step"]
    assert switched is not None and switched >= data["detected_step"], data["switches"]
    first = data["switches"][0]
    assert (first["kind"], first["algorithm"], first["step"]) == ("switch", "stragglar", switched), first
    ran = data["steps"]["hook_algorithm"]
    assert "stragglar" not in ran[:switched] and ran[switched] == "stragglar", ran
    assert len(data["steps"]["plain_s"]) == len(data["steps"]["control_s"]) == len(data["steps"]["hooked_s"]) == 40
    # the A/A control trained beside them: plain DDP twice, the same sums, so the same parameters
    assert data["header"]["config"]["copies"] == ["plain", "control", "hooked"]
    assert data["control_identical_on_all_ranks"]
    # the steady state starts settle_steps after the last plan change; its speedups are the ratios
    # of the medians of the step (and last arriver's backward) times the JSON lists
    settle = data["hook_config"]["settle_steps"]
    assert data["steady_steps"] == [data["switches"][-1]["step"] + settle, 39]
    steady = range(data["steady_steps"][0], 40)
    for key, series in (("speedup_steady", ""), ("backward_speedup_steady", "_backward")):
        plain = statistics.median(data["steps"][f"plain{series}_s"][s] for s in steady)
        hooked = statistics.median(data["steps"][f"hooked{series}_s"][s] for s in steady)
        assert data[key] == pytest.approx(plain / hooked), key
    control = statistics.median(data["steps"]["control_s"][s] for s in steady)
    assert data["control_speedup_steady"] == pytest.approx(statistics.median(
        data["steps"]["plain_s"][s] for s in steady) / control)
    assert all(t > 0 for t in data["steps"]["plain_s"] + data["steps"]["hooked_s"])
    # both copies' steps kept this host's CPUs partly busy (4 ranks on its cores)
    assert all(0 < share <= 1 for share in data["cpu_busy_steady"].values()), data["cpu_busy_steady"]
    # the straggler's sleep is inside its every step, and so inside the group's pace
    per_rank = data["steps"]["per_rank"]
    for name in ("plain_s", "hooked_s"):
        assert min(ranks[3] for ranks in per_rank[name][2:]) >= 0.03
        assert statistics.median(data["steps"][name][2:]) >= 0.03
        # free-running blocks of 10: the steps of a block add up to the block's time
        ends = data["steps"]["per_rank"][name.replace("_s", "_end_s")]
        assert sum(data["steps"][name][10:20]) == pytest.approx(max(ends[19]))
    table = out.getvalue()
    assert "steady state: steps" in table and "rank 3 late" in table and "A/A control: plain" in table


def _our_namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"sk-{os.getpid()}-")]


def test_emulated_train_reshapes_a_degraded_nic_mid_run_and_restores_it(tmp_path: Path) -> None:
    ok, reason = EmulatedCluster.available()
    if not ok:
        require_or_skip("the emulated cluster", reason)
    config = TrainConfig(
        world_size=4,
        bandwidth=25e6,  # the ring then takes about 60 ms (120 ms degraded): more than the CPU's share
        steps=36,
        degrade={2: 2.0},
        from_step=5,
        reshape_at=20,
        model_bytes=2**20,
        timeout=300,
    )
    json_path = tmp_path / "train.json"
    summary = run_train(config, json_path=str(json_path), out=io.StringIO())
    assert summary is not None
    data = json.loads(json_path.read_text())
    assert FIELDS <= set(data)
    links = data["header"]["cluster"]["degraded_links"]
    assert len(links) == 1 and len(links[0]) == 2  # rank 2's send and receive rates, verified
    assert data["max_param_diff"] <= 1e-5 * max(data["param_scale"], 1.0)
    assert data["hooked_identical_on_all_ranks"]
    # from step 5 rank 2's link runs at half the rate: plain DDP's ring is paced by it; from step
    # 20 at the full rate again
    plain = data["steps"]["plain_s"]
    before, degraded, after = plain[1:5], plain[8:19], plain[23:]
    assert min(degraded) > min(before) and statistics.median(after) < statistics.median(degraded), plain
    restored = data["header"]["cluster"]["recovered_links"]
    assert len(restored) == 1 and len(restored[0]) == 2
    late_phases = [phase for phase in data["phases"] if phase["steps"][0] >= 20]
    assert late_phases and all(phase["fault"] == "-" for phase in late_phases), data["phases"]
    assert _our_namespaces() == []


# ------------------------------------------------------------------------------------- Horovod

needs_horovod = needs(
    "Horovod",
    importlib.util.find_spec("horovod") is None,
    "bash scripts/install_horovod.sh (scripts/setup.sh runs it)",
)


def _loopback_train_with_rank_3_late(tmp_path: Path, framework: str) -> tuple[dict[str, Any], str]:
    """40 loopback training steps of ``framework`` on 4 ranks, rank 3 late by 50 ms from step 2: the
    JSON and the printed output, after what every framework must show (the same parameters as the
    plain framework, identical on every rank; rank 3 detected, its buckets switched to StragglAR)."""
    json_path, out = tmp_path / "train.json", io.StringIO()
    config = TrainConfig(
        world_size=4,
        mode="loopback",
        bandwidth=None,
        framework=framework,
        steps=40,
        straggler=3,
        delay=0.05,
        from_step=2,
        hook_warmup=5,
        degraded_threshold=1e9,  # loopback has no NICs to judge
        model_bytes=2 * 2**20,
        timeout=240,
    )
    summary = run_train(config, argv=["--framework", framework], json_path=str(json_path), out=out)
    assert summary is not None
    data = json.loads(json_path.read_text())
    assert FIELDS <= set(data)
    assert data["header"]["config"]["framework"] == framework
    assert data["max_param_diff"] <= 1e-5 * max(data["param_scale"], 1.0)
    assert data["hooked_identical_on_all_ranks"] and data["plain_identical_on_all_ranks"]
    assert data["detected_step"] is not None and data["detected"][0]["ranks"].keys() == {"3"}
    assert data["switches"] and data["switches"][0]["algorithm"] == "stragglar", data["switches"]
    assert len(data["steps"]["plain_s"]) == len(data["steps"]["control_s"]) == len(data["steps"]["hooked_s"]) == 40
    # the A/A control trained beside them: plain DDP twice, the same sums, so the same parameters
    assert data["header"]["config"]["copies"] == ["plain", "control", "hooked"]
    assert data["control_identical_on_all_ranks"]
    return data, out.getvalue()


@needs_horovod
def test_horovod_loopback_train_switches_with_horovods_parameters(tmp_path: Path) -> None:
    """--framework horovod over loopback: the ranks meet at Horovod's rendezvous server as under
    horovodrun; straggler_aware finds the late rank and trains the parameters that
    hvd.DistributedOptimizer trains, identical on every rank."""
    data, out = _loopback_train_with_rank_3_late(tmp_path, "horovod")
    # the backward of a Horovod step includes the optimizer's synchronize(): the late rank's sleep is outside it
    per_rank = data["steps"]["per_rank"]
    assert all(min(ranks[3] for ranks in per_rank[name][2:]) >= 0.05 for name in ("plain_s", "hooked_s"))
    assert "plain: hvd.DistributedOptimizer" in out


@needs_horovod
def test_horovod_train_on_the_emulated_cluster_meets_across_hosts(tmp_path: Path) -> None:
    """Each rank a Horovod process in its own namespace, the rendezvous server on the switch: both
    Horovod's Gloo and the group straggler_aware makes from Horovod's ranks meet across the hosts."""
    ok, reason = EmulatedCluster.available()
    if not ok:
        require_or_skip("the emulated cluster", reason)
    config = TrainConfig(
        world_size=3,
        bandwidth=50e6,
        framework="horovod",
        steps=12,
        straggler=1,
        delay=0.05,
        from_step=2,
        model_bytes=2**20,
        timeout=240,
    )
    json_path = tmp_path / "train.json"
    summary = run_train(config, json_path=str(json_path), out=io.StringIO())
    assert summary is not None
    data = json.loads(json_path.read_text())
    assert data["header"]["mode"] == "emulated" and len(data["header"]["cluster"]["addresses"]) == 3
    assert data["max_param_diff"] <= 1e-5 * max(data["param_scale"], 1.0)
    assert data["hooked_identical_on_all_ranks"] and data["plain_identical_on_all_ranks"]
    # a 1 MiB ring over 50 MB/s links takes more than 20 ms a step: the traffic crossed the shaped NICs
    assert statistics.median(data["steps"]["plain_s"][:2]) > 0.02, data["steps"]["plain_s"]
    assert _our_namespaces() == []


def test_progress_lines_say_what_each_verdict_measured() -> None:
    from profiling.lab.copies import describe_event

    verified = {
        "step": 75,
        "kind": "verified",
        "algorithm": "optcc",
        "evidence": {
            "switched_at_step": 61,
            "measure": "step period",
            "measured_before_s": 0.6527,
            "measured_after_s": 0.6201,
            "allreduce_before_s": 0.2527,
            "allreduce_after_s": 0.2201,
        },
    }
    expected = (
        "verified: after the switch at step 61 the step period was 620.1 ms against 652.7 ms before "
        "(allreduce part 220.1 ms against 252.7 ms): kept"
    )
    assert describe_event(verified) == expected
    # without wall clocks the AllReduce part is what was judged
    judged_on_allreduce = dict(
        verified,
        evidence={
            "switched_at_step": 61,
            "measure": "allreduce part",
            "measured_before_s": 0.25,
            "measured_after_s": 0.22,
        },
    )
    assert describe_event(judged_on_allreduce) == (
        "verified: after the switch at step 61 the allreduce part was 220.0 ms against 250.0 ms before: kept"
    )
    rollback = dict(verified, kind="rollback", algorithm="allreduce")
    assert describe_event(rollback).endswith("rolled back, now allreduce")
    probing = {"step": 45, "kind": "probing", "algorithm": "allreduce", "evidence": {"every": 64, "reason": "healthy"}}
    assert describe_event(probing) == "probing every 64 steps: healthy"
    # other ranks see the decision without rank 0's figures
    assert describe_event(dict(verified, evidence={"decided_by": 0})) == "verified, now optcc"


# ------------------------------------------------------------------------------------- megatron-core

needs_megatron = needs(
    "megatron-core",
    importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None,
    "pip install megatron-core==0.16.1 (scripts/setup.sh installs it)",
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"framework": "megatron", "degraded_threshold": 1.1}, "at least 1.2"),
        ({"framework": "megatron", "batch": -1}, "--batch"),
        ({"framework": "megatron", "world_size": 1}, "world-size"),
    ],
)
def test_megatron_config_rejects_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_megatron_config_defaults_to_one_sequence_per_step_and_round_trips() -> None:
    config = TrainConfig(framework="megatron", mode="loopback", straggler=3, delay=0.05, from_step=2)
    assert config.batch == 1 and TrainConfig().batch == 16  # 0 = the framework's default, resolved at once
    assert TrainConfig(framework="megatron", batch=2).batch == 2
    assert TrainConfig.from_json(config.to_json()) == config
    assert TrainConfig(framework="megatron", mode="torchrun").framework == "megatron"


def test_gpt_hidden_size_matches_the_gradient_size() -> None:
    from profiling.lab.train_megatron import HEAD_SIZE, gpt_hidden_size, gpt_parameters

    assert gpt_hidden_size(32 * 2**20) == 576 and gpt_parameters(576) == 8_587_008
    for size in (8 * 2**20, 32 * 2**20, 128 * 2**20):
        hidden = gpt_hidden_size(size)
        assert hidden % HEAD_SIZE == 0
        assert abs(4 * gpt_parameters(hidden) - size) / size < 0.05, (size, hidden)
    assert gpt_hidden_size(64 * 1024) == HEAD_SIZE  # the smallest model: the embeddings dominate


@needs_megatron
def test_megatron_loopback_train_switches_with_megatron_cores_parameters(tmp_path: Path) -> None:
    """--framework megatron over loopback: the GPT copy with stragglerkit.megatron.install finds
    the late rank, switches to StragglAR and trains the parameters that megatron-core's own DDP
    trains, identical on every rank."""
    from profiling.lab.train_megatron import gpt_hidden_size, gpt_parameters

    data, out = _loopback_train_with_rank_3_late(tmp_path, "megatron")
    assert data["model"]["layers"].startswith("GPT 2 layers")
    assert data["model"]["parameters"] == gpt_parameters(gpt_hidden_size(2 * 2**20))  # megatron-core's GPTModel
    # the lateness is slept between forward and backward: the late rank's step holds it, its backward does not
    per_rank = data["steps"]["per_rank"]
    for name in ("plain", "hooked"):
        assert all(ranks[3] >= 0.05 for ranks in per_rank[f"{name}_s"][2:])
        assert min(ranks[3] for ranks in per_rank[f"{name}_backward_s"][2:]) < 0.05
    losses = data["steps"]["loss_rank0"]["plain"]
    assert statistics.mean(losses[-10:]) < statistics.mean(losses[:5])  # it learns the text
    assert "plain: megatron-core's DistributedDataParallel" in out


@needs_megatron
def test_megatron_train_on_the_emulated_cluster_meets_across_hosts(tmp_path: Path) -> None:
    """Each rank in its own namespace: megatron-core's groups, the one stragglerkit.megatron sets
    up for the data-parallel group and the default group that times ``--delay auto`` meet across
    the shaped NICs (four hosts: StragglAR, whose pre-phase sets the delay, needs an even count)."""
    ok, reason = EmulatedCluster.available()
    if not ok:
        require_or_skip("the emulated cluster", reason)
    config = TrainConfig(
        world_size=4,
        bandwidth=50e6,
        framework="megatron",
        steps=12,
        straggler=1,
        delay=None,
        from_step=2,
        model_bytes=2**20,
        timeout=240,
    )
    json_path = tmp_path / "train.json"
    summary = run_train(config, json_path=str(json_path), out=io.StringIO())
    assert summary is not None
    data = json.loads(json_path.read_text())
    assert data["header"]["mode"] == "emulated" and len(data["header"]["cluster"]["addresses"]) == 4
    assert data["delay_s"] > 0 and data["delay_calibration"]["scale"] == 2.0
    assert data["max_param_diff"] <= 1e-5 * max(data["param_scale"], 1.0)
    assert data["hooked_identical_on_all_ranks"] and data["plain_identical_on_all_ranks"]
    # a 1.3 MB ring over 50 MB/s links takes more than 20 ms a step: the traffic crossed the shaped NICs
    assert statistics.median(data["steps"]["plain_s"][:2]) > 0.02, data["steps"]["plain_s"]
    assert _our_namespaces() == []

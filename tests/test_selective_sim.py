"""The selective-reduce paper's experiment (stragglerkit/sim/selective.py) and its command line.

Small worlds and short runs (a few seconds in all): determinism, the baselines' group sizes, BAG's
bandwidth bound on every launched group, the metrics' definitions, the direction of the paper's
headline ratios, and clear errors for bad parameters.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stragglerkit.cli import main
from stragglerkit.errors import ConfigError
from stragglerkit.selective import Sync, ring_time
from stragglerkit.sim.selective import (
    METHODS,
    WORKLOADS,
    SimSetting,
    _Trace,
    run_method,
    run_table,
    run_trial,
    summarise,
)


def small(**changes: object) -> SimSetting:
    fields: dict[str, object] = {"world_size": 20, "duration": 20.0}
    fields.update(changes)
    return SimSetting(**fields)  # type: ignore[arg-type]


def test_a_seed_gives_the_same_figures_and_another_seed_others() -> None:
    first = run_trial(small(), trial=0)
    again = run_trial(small(), trial=0)
    assert first == again
    other = run_trial(small(seed=1), trial=0)
    assert other["partial"] != first["partial"]


def test_the_trace_is_shared_by_the_methods_and_fixed_by_seed_n_and_trial() -> None:
    a, b = _Trace(small(), 3), _Trace(small(), 3)
    assert a.bandwidth == b.bandwidth
    # Drawn in blocks: asking for a late iteration first does not change the early ones.
    late = a.compute(5, 200)
    assert [a.compute(w, 0) for w in range(20)] == [b.compute(w, 0) for w in range(20)]
    assert b.compute(5, 200) == late
    assert _Trace(small(), 4).bandwidth != a.bandwidth


def test_bandwidths_follow_the_paper_round_20u_3_gbit() -> None:
    trace = _Trace(small(world_size=200), 0)
    gbit = trace.gbit
    assert gbit.min() >= 1.0 and gbit.max() <= 20.0
    assert all(abs(g * 1000 - round(g * 1000)) < 1e-6 for g in gbit)
    assert trace.bandwidth[0] == pytest.approx(gbit[0] * 1e9 / 8)


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_compute_times_are_positive_and_scale_with_compute_scale(workload: str) -> None:
    base, scaled = _Trace(small(workload=workload), 0), _Trace(small(workload=workload, compute_scale=3.0), 0)
    times = [base.compute(w, i) for w in range(20) for i in range(50)]
    assert min(times) > 0
    assert 0.2 < sum(times) / len(times) < 1.0  # both stand-ins average about half a second
    assert scaled.compute(7, 11) == pytest.approx(3.0 * base.compute(7, 11))


def test_all_reduce_syncs_everyone_and_partial_reduce_exactly_p() -> None:
    setting = small()
    result = run_trial(setting, 0)
    assert set(result["allreduce"].sync_scales) == {20}
    assert set(result["partial"].sync_scales) == {setting.p} == {6}
    assert min(result["selective"].sync_scales) >= setting.p
    assert all(m.wasted_wait == 0.0 for name, m in result.items() if name != "selective")


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("n", [20, 40])
def test_no_launched_group_holds_a_worker_below_bags_threshold(workload: str, n: int) -> None:
    # BAG: once a group has p workers, only workers >= (1 - eta) x the p-th fastest join it.
    setting = small(world_size=n, workload=workload, duration=30.0)
    trace = _Trace(setting, 0)
    launched: list[Sync] = []
    run_method("selective", setting, 0, trace, launched)
    assert launched
    for sync in launched:
        rates = sorted((trace.bandwidth[w] for w in sync.workers), reverse=True)
        assert len(rates) >= setting.p
        assert rates[-1] >= (1 - setting.eta) * rates[setting.p - 1] * (1 - 1e-12), sync


def test_metrics_are_what_their_definitions_say() -> None:
    setting = small()
    trace = _Trace(setting, 0)
    for method in METHODS:
        launched: list[Sync] = []
        m = run_method(method, setting, 0, trace, launched)
        # Total sync counts the synchronisations that finished; scale and time average over them.
        assert m.total_sync == len(m.sync_scales) > 0
        assert m.avg_sync_scale == pytest.approx(sum(m.sync_scales) / m.total_sync)
        finished = [s for s in launched if s.time + ring_time(s.workers, trace.bandwidth, 500e6, 1e-3) <= 20.0]
        assert len(finished) == m.total_sync
        times = [ring_time(s.workers, trace.bandwidth, 500e6, 1e-3) for s in finished]
        assert m.avg_sync_time == pytest.approx(sum(times) / len(times))
        # Each worker reports one ready per finished iteration; every launched worker was ready first.
        assert m.total_iterations >= sum(len(s.workers) for s in launched)
        assert m.ready_wait >= 0 and m.wasted_wait >= 0


def test_the_headline_ratios_point_the_paper_s_way_at_small_n() -> None:
    # Paper: selective reduce's syncs are shorter and larger, and workers iterate more.
    for workload in WORKLOADS:
        trials = [run_trial(small(world_size=40, workload=workload, duration=50.0), t) for t in range(3)]
        ratios = summarise(trials)["ratios"]
        assert ratios["avg_sync_time"]["median"] > 1.2, workload
        assert ratios["avg_sync_scale"]["median"] > 1.0, workload
        assert ratios["total_iterations"]["median"] > 1.0, workload


def test_the_table_summarises_min_median_max_per_n() -> None:
    rows = run_table([10, 20], 3, small(), progress_out=None)
    assert [row["world_size"] for row in rows] == [10, 20]
    assert [row["p"] for row in rows] == [3, 6]
    spread = rows[1]["methods"]["partial"]["avg_sync_scale"]
    assert spread == {"min": 6, "median": 6, "max": 6}
    ratio = rows[0]["ratios"]["avg_sync_time"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"]


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"p_fraction": 1.5}, "p_fraction"),
        ({"eta": 1.0}, "eta must be in [0, 1)"),
        ({"eta": -0.1}, "eta must be in [0, 1)"),
        ({"world_size": 1}, "world_size"),
        ({"workload": "vgg"}, "unknown workload"),
        ({"dt": 0.0}, "dt"),
        ({"duration": -1.0}, "duration"),
        ({"progress": "guess"}, "progress"),
    ],
)
def test_bad_parameters_are_refused_with_a_clear_error(changes: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        small(**changes)


def test_an_unknown_method_or_trial_count_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown method"):
        run_method("gossip", small())
    with pytest.raises(ConfigError, match="trials"):
        run_table([10], 0, small(), progress_out=None)


def test_the_command_writes_the_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sel.json"
    code = main(
        ["simulate", "--selective", "--world-sizes", "10", "--trials", "2", "--duration", "10",
         "--workloads", "resnet50", "--json", str(out)]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "selective : partial" in text and "paper: sync time 1.89-2.55x" in text
    record = json.loads(out.read_text())
    row = record["workloads"]["resnet50"]["rows"][0]
    assert row["world_size"] == 10 and row["trials"] == 2
    assert set(row["methods"]) == set(METHODS)
    assert not math.isnan(row["methods"]["allreduce"]["avg_sync_time"]["median"])


def test_the_command_refuses_p_above_n(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--selective", "--world-sizes", "10", "--p-fraction", "2", "--trials", "1"]) == 2
    assert "p_fraction" in capsys.readouterr().err


def test_the_command_refuses_options_of_the_algorithm_simulation(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--selective", "--world-sizes", "10", "--degrade", "3:2", "--trials", "1"]) == 2
    assert "--degrade do(es) not apply with --selective" in capsys.readouterr().err


def test_selective_without_waiting_or_tolerance_is_partial_reduce() -> None:
    # eta = 0: BAG's groups stop at p; theta huge: BPAWR never waits. Each ready report then
    # launches the queue the moment it holds p workers, exactly as partial reduce does.
    setting = small(eta=0.0, theta=1e12)
    result = run_trial(setting, 0, methods=("selective", "partial"))
    assert result["selective"] == result["partial"]
    assert result["selective"].wasted_wait == 0.0


def test_bandwidth_sets_the_fastest_nic_and_slows_every_sync(tmp_path: Path) -> None:
    """``--bandwidth`` is the fastest NIC's rate (the testbed's scale): ten times less bandwidth,
    about ten times longer all-reduce syncs on the same draws (alpha 0)."""
    syncs = {}
    for rate in ("20Gbit", "2Gbit"):
        out = tmp_path / f"{rate}.json"
        argv = ["simulate", "--selective", "--world-sizes", "10", "--trials", "1", "--duration", "20"]
        argv += ["--workloads", "resnet50", "--alpha", "0s", "--size", "50MB", "--bandwidth", rate, "--json", str(out)]
        assert main(argv) == 0
        entry = json.loads(out.read_text())["workloads"]["resnet50"]
        assert entry["setting"]["max_gbit"] == pytest.approx(float(rate.removesuffix("Gbit")))
        syncs[rate] = entry["rows"][0]["methods"]["allreduce"]["avg_sync_time"]["median"]
    assert syncs["2Gbit"] == pytest.approx(10 * syncs["20Gbit"], rel=1e-2)  # rates rounded to 1 Mbit/s

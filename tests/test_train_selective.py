"""``python -m profiling.lab.train --sync selective``: the options, the figures' arithmetic, and a
short real run of all three methods over loopback (the emulated cluster run with shaped NICs is
the benchmark's, profiling/bench_train_selective.sh)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from profiling.lab.train import main
from profiling.lab.train_selective import SelectiveTrainConfig, draw_rates, summarise


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sync", "selective", "--straggler", "1", "--delay", "10"], "--delay, --straggler: not read by --sync"),
        (["--duration", "5"], "--duration: only with --sync selective"),
        (["--sync", "selective", "--world-size", "1"], "2 or more ranks"),
        (["--sync", "selective", "--duration", "0"], "--duration must be a positive"),
    ],
)
def test_bad_options_give_one_clear_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--loopback", *argv]) == 2
    assert message in capsys.readouterr().err


def test_rates_follow_the_paper_scaled_and_p_is_three_tenths() -> None:
    config = SelectiveTrainConfig(world_size=40, bandwidth=125e6, mode="loopback")
    rates = draw_rates(config)
    assert sorted(rates) == list(range(40))
    assert all(0.05 * 125e6 <= r <= 125e6 for r in rates.values())
    assert draw_rates(config) == rates  # a function of the seed
    assert config.p == 12
    assert SelectiveTrainConfig(world_size=3, mode="loopback").p == 2  # at least a pair


def _rank(iterations: int, sync_s: list[tuple[int, float]], losses: list[tuple[float, float]]) -> dict[str, Any]:
    return {
        "iterations": iterations,
        "losses": losses,
        "waits": [0.1, 0.3],
        "sync_s": sync_s,
        "test_loss": 0.5,
        "records": [],
        "parameters": 10,
    }


def test_the_figures_take_each_sync_s_longest_member_and_only_finished_syncs() -> None:
    config = SelectiveTrainConfig(world_size=3, mode="loopback", duration=2.0, methods=["partial"])
    ranks = [
        _rank(4, [(0, 0.2), (1, 0.5)], [(0.1, 4.0), (1.5, 2.0)]),
        _rank(3, [(0, 0.3)], [(0.2, 6.0)]),
        _rank(5, [(1, 0.4)], []),
    ]
    ranks[0]["records"] = [
        {"id": 0, "members": [0, 1], "weights": [0.5, 0.5], "done_s": 0.5},
        {"id": 1, "members": [0, 2], "weights": [0.5, 0.5], "done_s": 1.2},
        {"id": 2, "members": [1, 2], "weights": [0.5, 0.5], "done_s": None},  # the run ended first
    ]
    figures = summarise(config, {"partial": ranks})["methods"]["partial"]
    assert figures["avg_sync_time_s"] == pytest.approx((0.3 + 0.5) / 2)
    assert figures["avg_sync_scale"] == 2 and figures["total_sync"] == 2
    assert figures["total_iterations"] == 12
    assert figures["mean_wait_s"] == pytest.approx(0.2)
    assert figures["loss_vs_time"] == [{"t_s": 0.5, "loss": 5.0}, {"t_s": 1.5, "loss": 2.0}]


def test_three_methods_train_over_loopback(tmp_path: Path) -> None:
    out = tmp_path / "selective.json"
    argv = ["--sync", "selective", "--loopback", "--world-size", "3"]
    argv += ["--duration", "3", "--model-size", "64KiB", "--json", str(out), "--plot", str(tmp_path / "loss.png")]
    assert main(argv) == 0
    summary = json.loads(out.read_text())
    methods = summary["methods"]
    assert list(methods) == ["selective", "partial", "allreduce"]
    for name, figures in methods.items():
        assert figures["total_sync"] >= 1 and figures["total_iterations"] >= 3, (name, figures)
        assert figures["loss_vs_time"] and figures["test_loss"] > 0
    assert methods["allreduce"]["avg_sync_scale"] == 3
    assert 2 <= methods["partial"]["avg_sync_scale"] <= 3
    # training learns: the last second's loss is below the first's in every method
    for figures in methods.values():
        curve = figures["loss_vs_time"]
        assert curve[-1]["loss"] < curve[0]["loss"], curve
    assert (tmp_path / "loss.png").stat().st_size > 0

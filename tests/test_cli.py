"""The command line: stragglerkit schedule / simulate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stragglerkit.cli import main
from stragglerkit.schedules import Schedule, check
from stragglerkit.schedules.optcc import optcc_plan


def test_schedule_prints_rounds_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "ring", "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "ring: world_size=4 chunks=4 rounds=6" in out
    assert "checked: correct AllReduce" in out
    assert "reduce_scatter round 0 : 0->1 c3+  1->2 c0+  2->3 c1+  3->0 c2+" in out
    assert "allgather round 3      : 0->1 c0=" in out


def test_schedule_summary_json_is_one_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "rhd", "--world-size", "8", "--summary-json"]) == 0
    out = capsys.readouterr().out.strip()
    summary = json.loads(out)
    assert set(summary) == {
        "algorithm",
        "world_size",
        "rounds",
        "checked",
        "proof",
        "generation_seconds",
        "proof_seconds",
    }
    assert summary["rounds"] == 6 and summary["checked"] is True and summary["world_size"] == 8
    assert summary["proof"] == "full"


@pytest.mark.parametrize(("algorithm", "rounds"), [("ring", 2046), ("stragglar", 1032)])
def test_schedule_summary_at_1024_ranks_is_a_pattern_proof(
    algorithm: str, rounds: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schedule", algorithm, "--world-size", "1024", "--straggler", "3", "--summary-json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["proof"] == "pattern" and summary["checked"] is True and summary["rounds"] == rounds


def test_schedule_summary_of_optcc_above_64_ranks_is_the_window_proof(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["schedule", "optcc", "--world-size", "200", "--degrade", "3:2.0", "--segments", "8", "--summary-json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["proof"] == "windows" and summary["checked"] is True
    assert summary["windows"] == optcc_plan(200, {3: 2.0}, 8).num_windows
    two_degraded = ["schedule", "optcc", "-n", "6", "--degrade", "2:2.0", "--degrade", "4:1.5", "--summary-json"]
    assert main(two_degraded) == 0  # several degraded ranks: the full checker at small p
    assert json.loads(capsys.readouterr().out)["proof"] == "full"


def test_schedule_summary_of_the_balanced_ring_above_64_ranks_is_the_slice_proof(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from stragglerkit.schedules.balanced_ring import balanced_shares, default_slices

    assert main(["schedule", "balanced_ring", "--world-size", "1024", "--degrade", "3:1.14", "--summary-json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["proof"] == "pattern" and summary["checked"] is True and summary["rounds"] == 0
    assert summary["slices"] == default_slices(balanced_shares([1.14 if r == 3 else 1.0 for r in range(1024)])) > 1
    assert main(["schedule", "balanced_ring", "-n", "8", "--degrade", "3:1.14", "--summary-json"]) == 0
    assert json.loads(capsys.readouterr().out)["proof"] == "full"  # small p: the full checker


def test_schedule_json_file_round_trips(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.json"
    assert main(["schedule", "direct", "-n", "6", "--straggler", "2", "--json", str(path)]) == 0
    sched = Schedule.from_json(path.read_text())
    check(sched)
    assert sched.params["straggler"] == 2


def test_schedule_not_applicable_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "stragglar", "--world-size", "5"]) == 2
    err = capsys.readouterr().err
    assert "stragglar does not apply" in err and "ring, rhd, direct" in err


def test_bad_arguments_exit_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["schedule", "ring", "--world-size", "4", "--degrade", "3-2"])
    assert "--degrade takes RANK:L" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--size", "1GX"])
    assert "unknown size unit 'GX'" in capsys.readouterr().err
    assert main(["schedule", "ring", "--world-size", "4", "--straggler", "9"]) == 2
    assert "--straggler 9 is not a rank of 0..3" in capsys.readouterr().err


def test_console_script_help_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stragglerkit.cli", "schedule", "--help"], capture_output=True, text=True, check=True
    )
    assert "round by round" in result.stdout


def test_simulate_json_rows_match_paper(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--algorithms", "ring,stragglar", "--world-sizes", "8", "--size", "1GiB"]
    assert main([*argv, "--alpha", "3us", "--bandwidth", "450GB/s", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["algorithm"] for row in rows} == {"ring", "stragglar"}
    for row in rows:
        assert set(row) >= {"algorithm", "world_size", "size_bytes", "delay_s", "time_s", "time_from_first_arrival_s"}
        assert row["time_from_first_arrival_s"] == pytest.approx(row["time_s"] + row["delay_s"], rel=1e-9)
    by_name = {row["algorithm"]: row["time_s"] for row in rows}
    assert by_name["ring"] / by_name["stragglar"] == pytest.approx(1.36, rel=0.02)


def test_simulate_table_and_plot(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    plot = tmp_path / "p.png"
    argv = ["simulate", "--algorithms", "ring,rhd,direct", "--world-sizes", "4,5", "--size", "64MiB", "--delay", "1ms"]
    assert main([*argv, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "vs ring" in out and "1.000x" in out and "1.000 ms" in out
    assert plot.stat().st_size > 1000


def test_simulate_bad_delay(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--delay", "soon"])
    assert "--delay: cannot read 'soon'" in capsys.readouterr().err


def test_simulate_degraded_rows_carry_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--algorithms", "ring,optcc", "--world-sizes", "8", "--size", "64MiB", "--alpha", "0"]
    assert main([*argv, "--bandwidth", "1GB/s", "--degrade", "3:2", "--segments", "16", "--json", "-"]) == 0
    rows = {row["algorithm"]: row for row in json.loads(capsys.readouterr().out)}
    bound = rows["optcc"]["lower_bound_s"]
    assert bound == pytest.approx(2 * 64 * 2**20 / 1e9)  # Theorem 1 at l = 2: max(2l(p-1)/(l(p-1)+1), l)·S/B = l·S/B
    assert bound <= rows["optcc"]["time_s"] <= 1.1 * bound
    # ring under the fault: 2(p-1)/p · l · S/B = 1.75·2·S/B, i.e. 1.6x OptCC at k = 16
    assert rows["ring"]["time_s"] == pytest.approx(1.75 * 2 * 64 * 2**20 / 1e9, rel=0.01)
    assert rows["ring"]["time_s"] > 1.5 * rows["optcc"]["time_s"]
    assert rows["optcc"]["delay_s"] == 0.0


def test_simulate_servers_use_nvlink_and_degrade_the_whole_server(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--algorithms", "ring,optcc", "--world-sizes", "16", "--size", "64MiB", "--alpha", "0"]
    argv += ["--bandwidth", "1GB/s", "--degrade", "4:2", "--segments", "16", "--gpus-per-server", "4", "--json", "-"]
    assert main(argv) == 0
    rows = {row["algorithm"]: row for row in json.loads(capsys.readouterr().out)}
    size_time = 64 * 2**20 / 1e9
    bound = rows["optcc"]["lower_bound_s"]
    assert bound == pytest.approx(2.0 * size_time / 4)  # Theorem 3 at l = 2: l n / g
    # App. E.4 at k = 16: l n/g (k + 5.5)/k; every GPU's NVLink also carries 2n/g
    assert bound <= rows["optcc"]["time_s"] <= bound * (16 + 5.5) / 16
    # one ring over all 16 GPUs; rank 7 -> 8 leaves the degraded server 1 (ranks 4..7) through a slow NIC
    assert rows["ring"]["time_s"] == pytest.approx(2 * 15 / 16 * 2.0 * size_time, rel=0.01)
    assert main(["simulate", "--world-sizes", "6", "--gpus-per-server", "4", "--degrade", "1:2"]) != 0
    assert "--gpus-per-server 4 must divide the world size 6" in capsys.readouterr().err


def test_schedule_optcc_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "optcc", "-n", "6", "--degrade", "2:1.5", "--segments", "4", "--summary-json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["checked"] is True and summary["algorithm"] == "optcc"


@pytest.mark.parametrize(("slowdown", "size"), [("2.0", "32MiB"), ("1.142857", "32MiB"), ("2.0", "7MiB")])
def test_schedule_shows_the_plan_all_reduce_runs(
    tmp_path, slowdown: str, size: str, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """Without --segments the CLI's OptCC plan is the runtime's for that bucket size: the same
    segments, fills and chunk sizes (planner/policy.py optcc_situation), byte for byte."""
    from stragglerkit.planner.policy import optcc_situation
    from stragglerkit.schedules.registry import Situation, generate
    from stragglerkit.units import parse_size

    path = tmp_path / "plan.json"
    arguments = ["schedule", "optcc", "-n", "8", "--degrade", f"3:{slowdown}", "--size", size, "--json", str(path)]
    assert main(arguments) == 0
    shown = Schedule.from_json(path.read_text())
    runs = generate("optcc", optcc_situation(Situation(world_size=8, slowdowns={3: float(slowdown)}), parse_size(size)))
    assert shown.to_json() == runs.to_json()

"""The command line: stragglerkit schedule / simulate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stragglerkit.cli import main
from stragglerkit.schedules import Schedule, check


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
    assert set(summary) == {"algorithm", "world_size", "rounds", "checked", "generation_seconds"}
    assert summary["rounds"] == 6 and summary["checked"] is True and summary["world_size"] == 8


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

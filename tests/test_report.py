"""``stragglerkit report``: its readers, the run model, the figures, the page and the command line.

Inputs are written the way their producers write them (tests/report_bodies.py); the Nsight
Systems exports are built from the documented export schema, because Nsight Systems cannot be
installed where these tests run.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from report_bodies import (
    bench_allreduce_json,
    bench_train_json,
    example_run,
    step_ranges,
    write_chrome_trace,
    write_event_logs,
    write_nsys_export,
)

from stragglerkit.cli import main
from stragglerkit.report.events import read_event_log
from stragglerkit.report.inputs import load
from stragglerkit.report.nsys import read_nsys_export
from stragglerkit.report.plots import figures
from stragglerkit.report.ranges import InputError
from stragglerkit.report.run_data import last_ranks, lost_to_stragglers, savings
from stragglerkit.report.torch_trace import read_torch_trace


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    write_event_logs(folder, world_size=8, steps=120, straggler=7, delay=0.03, fault_step=20)
    return folder


# --------------------------------------------------------------------------- event logs


def test_a_complete_run_reads_into_steps_decisions_and_nic_rates(run_dir: Path) -> None:
    loaded = load([str(run_dir)])
    assert loaded.problems == [] and loaded.left_out == []
    run = loaded.run
    assert run is not None
    assert run.kind == "event log" and run.world_size == 8 and run.run_id == "5f1c0a9e2b7d4c31"
    assert run.ranks_seen == list(range(8))
    assert [r.step for r in run.steps] == list(range(120))
    assert [d["kind"] for d in run.decisions] == ["detected_straggler", "switch", "verified"]
    assert len(run.nic) == 24 and all(len(s.rates_Bps) == 8 for s in run.nic)
    # rank 7 is last at every step from the fault on
    assert {rank for step, rank in last_ranks(run) if step >= 20} == {7}
    windows, _ = example_run(world_size=8, steps=120, straggler=7, delay=0.03, fault_step=20)
    expected = sum(max(row) for w in windows for row in w["lateness_s"])
    assert lost_to_stragglers(run) == pytest.approx(expected)
    [switch] = savings(run)
    assert switch.kind == "switch" and switch.step == 40 and switch.algorithm == "stragglar"
    assert switch.before_steps == (20, 39), "from the detection's window to the switch"
    assert switch.allreduce_before_s == pytest.approx(0.048 * 1.035, rel=0.05)
    assert switch.allreduce_after_s == pytest.approx(0.029 * 1.035, rel=0.05)
    assert switch.saved_s is not None and switch.saved_s > 0
    assert run.steps[50].step_time_s == pytest.approx(0.12 + max(run.steps[50].lateness_s or [0]) + 0.03, rel=0.2)


def test_a_truncated_last_line_is_named_and_the_rest_is_read(tmp_path: Path) -> None:
    [path] = write_event_logs(tmp_path, world_size=4, per_rank=False, steps=40, fault_step=5)
    text = path.read_text()
    lines = text.splitlines()
    path.write_text(text + lines[3][: len(lines[3]) // 2])  # killed while writing the next window
    [log] = read_event_log(path)
    [problem] = log.problems
    assert f"{path}:{len(lines) + 1}:" in problem and "cut off" in problem
    assert len(log.windows) == 8 and len(log.decisions) == 3


def test_a_corrupt_line_inside_is_named_and_skipped(tmp_path: Path) -> None:
    [path] = write_event_logs(tmp_path, world_size=4, per_rank=False, steps=40, fault_step=5)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:30] + "\x00garbage"
    lines[4] = json.dumps({"kind": "window", "steps": [1, 2], "lateness_s": [[0.0]]})  # lists that do not fit
    path.write_text("\n".join(lines) + "\n")
    [log] = read_event_log(path)
    assert len(log.problems) == 2
    assert log.problems[0].startswith(f"{path}:3: not a JSON object")
    assert log.problems[1].startswith(f"{path}:5: ") and "lateness_s" in log.problems[1]
    assert len(log.windows) == 6


def test_a_missing_rank_is_named(run_dir: Path, tmp_path: Path) -> None:
    for path in run_dir.iterdir():
        if path.name != "events.rank3.jsonl":
            shutil.copy(path, tmp_path / path.name)
    loaded = load([str(tmp_path)])
    assert loaded.run is not None and len(loaded.run.steps) == 120
    [problem] = loaded.problems
    assert "rank 3 of 8" in problem and "events.rank3.jsonl" in problem
    (tmp_path / "events.rank0.jsonl").unlink()
    loaded = load([str(tmp_path)])
    assert loaded.run is not None and loaded.run.steps == []
    assert any("ranks 0, 3 of 8" in p for p in loaded.problems)
    assert any("rank 0's event log is missing" in p for p in loaded.problems)
    assert [d["kind"] for d in loaded.run.decisions] == ["detected_straggler", "switch", "verified"]


def test_one_rank_writing_alone_is_not_a_missing_rank(tmp_path: Path) -> None:
    write_event_logs(tmp_path, world_size=4, per_rank=False, steps=30)
    loaded = load([str(tmp_path)])
    assert loaded.problems == [] and loaded.run is not None and loaded.run.ranks_seen == [0]


def test_logs_of_two_runs_are_never_mixed(run_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_event_logs(other, world_size=8, run_id="aaaabbbbccccdddd", steps=60, straggler=None)
    loaded = load([str(other / "events.rank0.jsonl"), str(run_dir)])
    run = loaded.run
    assert run is not None and run.run_id == "aaaabbbbccccdddd" and len(run.steps) == 60
    assert len(loaded.left_out) == 8
    assert all("run 5f1c0a9e2b7d4c31, not aaaabbbbccccdddd" in line for line in loaded.left_out)
    assert f"{run_dir / 'events.rank0.jsonl'}:" in loaded.left_out[0]


def test_a_reused_path_holds_two_runs_and_the_newest_is_shown(tmp_path: Path) -> None:
    first = write_event_logs(tmp_path / "a", world_size=4, per_rank=False, steps=20, run_id="1111111111111111")
    second = write_event_logs(tmp_path / "b", world_size=4, per_rank=False, steps=35, run_id="2222222222222222")
    path = tmp_path / "events.jsonl"
    path.write_text(first[0].read_text() + second[0].read_text())
    sections = read_event_log(path)
    assert [s.run_id for s in sections] == ["1111111111111111", "2222222222222222"]
    assert sections[1].first_line == len(first[0].read_text().splitlines()) + 1
    loaded = load([str(path)])
    assert loaded.run is not None and loaded.run.run_id == "2222222222222222" and len(loaded.run.steps) == 35
    assert len(loaded.left_out) == 1 and "(from line" not in loaded.left_out[0].split(":")[0]


# --------------------------------------------------------------------------- traces


def test_traces_are_aligned_on_the_allreduce_ends(tmp_path: Path) -> None:
    """Rank 1's clock runs 5 s ahead; rank 1 arrives 30 ms late every step."""
    for rank, offset in ((0, 0.0), (1, 5.0)):
        ranges = step_ranges(rank, steps=10, late_rank=1, delay=0.03, algorithm="stragglar")
        write_chrome_trace(tmp_path / f"trace.rank{rank}.json", rank, 2, ranges, offset_s=offset)
    loaded = load([str(tmp_path)])
    assert loaded.problems == []
    run = loaded.run
    assert run is not None and run.kind == "torch.profiler" and run.world_size == 2
    assert [r.step for r in run.steps] == list(range(10))
    for record in run.steps:
        assert record.lateness_s == pytest.approx([0.0, 0.03], abs=1e-6)
        assert record.allreduce_s == pytest.approx(0.02, abs=1e-5)
        assert record.algorithm == "stragglar"
    assert any("rank 1: +5000.000 ms" in note for note in run.notes)


def test_a_trace_names_its_rank_or_is_refused(tmp_path: Path) -> None:
    ranges = step_ranges(0, steps=2, late_rank=1, delay=0.01)
    named = write_chrome_trace(tmp_path / "worker_rank3.json", None, 4, ranges)
    assert read_torch_trace(named).rank == 3
    anonymous = write_chrome_trace(tmp_path / "trace.json", None, 4, ranges)
    with pytest.raises(InputError, match=r"trace\.json: cannot tell which rank.*rename it"):
        read_torch_trace(anonymous)


def test_traces_of_different_world_sizes_are_not_mixed(tmp_path: Path) -> None:
    for rank in (0, 1):
        write_chrome_trace(tmp_path / f"a.rank{rank}.json", rank, 2, step_ranges(rank, 4, 1, 0.01))
    for rank in (0, 1, 2, 3):
        write_chrome_trace(tmp_path / f"b.rank{rank}.json", rank, 4, step_ranges(rank, 6, 3, 0.01))
    loaded = load([str(tmp_path / "b.rank0.json"), str(tmp_path)])
    assert loaded.run is not None and loaded.run.world_size == 4 and len(loaded.run.steps) == 6
    left = "\n".join(loaded.left_out)
    assert "a.rank0.json: world size 2, not 4" in left and "a.rank1.json: world size 2, not 4" in left
    assert "b.rank0.json: a second trace of rank 0" in left  # given twice: once by name, once in the folder


def test_an_nsys_export_gives_ranges_and_collective_kernels(tmp_path: Path) -> None:
    for rank, offset in ((0, 100.0), (1, 250.0)):
        ranges = [(n, s + offset, e + offset) for n, s, e in step_ranges(rank, 8, 1, 0.02)]
        kernels = [("ncclDevKernel_AllReduce_Sum_f32_RING_LL", s + 0.001, e) for n, s, e in ranges if "all_reduce" in n]
        write_nsys_export(tmp_path / f"report.rank{rank}.sqlite", ranges, kernels, text_inline=rank == 1)
    ranks0 = read_nsys_export(tmp_path / "report.rank0.sqlite")
    assert ranks0.rank == 0 and len(ranks0.ranges) == 16 and len(ranks0.kernels) == 8
    assert all(r.name.startswith("stragglerkit/") for r in ranks0.ranges), "other ranges are not kept"
    loaded = load([str(tmp_path)])
    run = loaded.run
    assert loaded.problems == [] and run is not None and run.kind == "nsys"
    assert len(run.steps) == 8 and all(r.lateness_s == pytest.approx([0.0, 0.02], abs=1e-6) for r in run.steps)
    assert set(run.kernels) == {0, 1} and run.kernels[0][0] == 8


def test_an_nsys_export_of_another_schema_is_refused_by_name(tmp_path: Path) -> None:
    good = write_nsys_export(tmp_path / "report.rank0.sqlite", step_ranges(0, 3, 1, 0.01))
    bad = write_nsys_export(tmp_path / "report.rank1.sqlite", step_ranges(1, 3, 1, 0.01), schema="2.7.1")
    loaded = load([str(good), str(bad)])
    [problem] = [p for p in loaded.problems if "schema" in p]
    assert problem.startswith(f"{bad}: Nsight Systems export schema 2.7.1") and "reads schema 3.x" in problem
    assert loaded.run is not None and len(loaded.run.steps) == 3


def test_an_nsys_export_of_several_processes_is_refused(tmp_path: Path) -> None:
    path = write_nsys_export(tmp_path / "report.rank0.sqlite", step_ranges(0, 3, 1, 0.01), pids=(11, 12))
    with pytest.raises(InputError, match=r"2 processes; export one report per rank"):
        read_nsys_export(path)


# --------------------------------------------------------------------------- bench JSON


def test_bench_json_of_both_modes(tmp_path: Path) -> None:
    loaded = load([str(bench_allreduce_json(tmp_path / "allreduce.json"))])
    run = loaded.run
    assert run is not None and run.kind == "bench (allreduce)" and len(run.steps) == 10
    assert [c.algorithm for c in run.comparisons] == ["gloo", "stragglar"]
    assert {rank for _, rank in last_ranks(run)} == {3}
    loaded = load([str(bench_train_json(tmp_path / "train.json"))])
    run = loaded.run
    assert run is not None and run.kind == "bench (train)" and len(run.steps) == 40
    assert {rank for _, rank in last_ranks(run)} == {3}, "the rank that waits least arrived last"
    assert run.bench_saving is not None and run.bench_saving["saved_s"] == pytest.approx(0.04 * 20, rel=0.3)
    assert [d["kind"] for d in run.decisions] == ["detected_straggler", "switch"]


# --------------------------------------------------------------------------- the page and the command


def _images(page: str) -> list[str]:
    return re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)


def test_the_command_writes_a_self_contained_page_and_pngs(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / "report.html"
    assert main(["report", str(run_dir), "-o", str(out), "--title", "rank 7 late"]) == 0
    printed = capsys.readouterr().out
    assert "run: event log of 8; ranks 0, 1, 2, 3, 4, 5, 6, 7; 120 steps; 3 decisions" in printed
    assert f"wrote {out}" in printed
    page = out.read_text()
    assert "<title>rank 7 late</title>" in page
    assert "Detected a persistent straggler on rank 7 at step 35" in page
    assert "switched to stragglar at step 40, verified stragglar at step 55" in page
    assert "time lost to stragglers" in page
    assert len(_images(page)) == 5
    pngs = sorted(p.name for p in out.parent.glob("*.png"))
    assert pngs == sorted(f"{f}.png" for f in ("report_allreduce", "report_lateness_cdf", "report_last_rank",
                                                 "report_nic_rates", "report_predicted"))  # fmt: skip
    assert not re.search(r"(src|href)=\"(?!data:)", page), "no external resources"
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_a_run_without_fault_says_so_and_omits_what_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [path] = write_event_logs(tmp_path / "run", world_size=4, per_rank=False, steps=30, straggler=None)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        if line["kind"] == "window":
            line["nic_rate_Bps"] = [None] * 4
            line["predicted_s"] = [None] * len(line["steps"])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "report.html"
    assert main(["report", str(path), "-o", str(out), "--png-dir", str(tmp_path / "png")]) == 0
    page = out.read_text()
    assert "No straggler or degraded NIC was detected; 30 steps." in page
    assert "NIC rate per rank: omitted — no NIC rates: no probe ran." in page
    assert "omitted — no predictions" in page
    assert len(_images(page)) == 3 and len(list((tmp_path / "png").glob("*.png"))) == 3
    assert "figure report_nic_rates: omitted (no NIC rates: no probe ran)" in capsys.readouterr().out


def test_problems_go_to_stderr_and_the_page(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (0, 1, 2):
        shutil.copy(run_dir / f"events.rank{rank}.jsonl", tmp_path)
    log = tmp_path / "events.rank0.jsonl"
    log.write_text(log.read_text() + '{"kind": "window", "steps": [120, 1')
    bad = write_nsys_export(tmp_path / "report.rank0.sqlite", step_ranges(0, 3, 1, 0.01), schema="4.0.0")
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path), str(bad), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    page = out.read_text()
    lines = len(log.read_text().splitlines())
    for needle in (f"{log}:{lines}: the last line is cut off", "ranks 3, 4, 5, 6, 7 of 8", f"{bad}: Nsight Systems"):
        assert needle in err
        assert needle in page.replace("&#x27;", "'")
    assert "<h2>Problems</h2>" in page


def test_nothing_readable_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\n")
    bad = write_nsys_export(tmp_path / "report.rank0.sqlite", [], schema="2.0")
    assert main(["report", str(odd), str(bad), str(tmp_path / "absent"), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"{odd}: not a known input: expected an event log" in err
    assert f"{bad}: Nsight Systems export schema 2.0" in err
    assert f"{tmp_path / 'absent'}: no such file or folder" in err
    assert "nothing could be read; no report written" in err
    assert not (tmp_path / "r.html").exists()


def test_every_figure_draws_for_each_kind_of_input(tmp_path: Path) -> None:
    train = load([str(bench_train_json(tmp_path / "train.json"))]).run
    assert train is not None
    drawn = {f.name: f for f in figures(train)}
    assert drawn["report_allreduce"].png and drawn["report_lateness_cdf"].png and drawn["report_last_rank"].png
    assert drawn["report_nic_rates"].reason == "no NIC rates in a bench (train) input"
    bench = load([str(bench_allreduce_json(tmp_path / "allreduce.json"))]).run
    assert bench is not None
    drawn = {f.name: f for f in figures(bench)}
    assert drawn["report_predicted"].png and drawn["report_allreduce"].png
    assert all(f.png is None or f.png.startswith(b"\x89PNG") for f in drawn.values())


def test_event_logs_and_profiles_of_one_run_combine(tmp_path: Path) -> None:
    write_event_logs(tmp_path, world_size=2, steps=30, fault_step=5)
    for rank in (0, 1):
        ranges = step_ranges(rank, 6, 1, 0.02)
        kernels = [("ncclKernel_AllReduce_RING_LL_Sum_float", s, e) for n, s, e in ranges if "all_reduce" in n]
        write_nsys_export(tmp_path / f"report.rank{rank}.sqlite", ranges, kernels)
    write_chrome_trace(tmp_path / "trace.rank0.json", 0, 4, step_ranges(0, 3, 1, 0.01))
    loaded = load([str(tmp_path)])
    run = loaded.run
    assert run is not None and run.kind == "event log" and len(run.steps) == 30, "the log's windows, not the traces'"
    assert set(run.kernels) == {0, 1} and run.kernels[1][0] == 6
    assert [line.split(": ", 1)[1] for line in loaded.left_out] == [
        "world size 4, not 2; left out of the run of " + str(tmp_path / "events.rank0.jsonl") + " (5f1c0a9e2b7d4c31)"
    ]


def test_a_log_without_a_header_is_read_as_rank_0_s(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"algorithm": "stragglar", "evidence": {"why": "test"}, "kind": "switch", "step": 40}\n'
        '{"algorithm": "ring", "evidence": {}, "kind": "rollback", "step": 60}\n'
    )
    loaded = load([str(path)])
    assert loaded.run is not None and [d["kind"] for d in loaded.run.decisions] == ["switch", "rollback"]
    [problem] = loaded.problems
    assert problem.startswith(f"{path}: no run header on the first line")


def test_a_large_world_names_the_ranks_that_stand_out(tmp_path: Path) -> None:
    write_event_logs(tmp_path, world_size=24, per_rank=False, steps=40, straggler=17, fault_step=0)
    run = load([str(tmp_path)]).run
    assert run is not None
    drawn = {f.name: f for f in figures(run)}
    assert "The 5 ranks with the largest median delay in colour" in drawn["report_lateness_cdf"].caption
    assert "The 5 ranks with the lowest median rate in colour" in drawn["report_nic_rates"].caption
    assert all(f.png for f in drawn.values())


def test_a_training_bench_joins_the_logs_of_its_hooked_copy(tmp_path: Path) -> None:
    write_event_logs(tmp_path / "run", world_size=4, steps=40, fault_step=5)
    bench = bench_train_json(tmp_path / "run" / "train.json", world_size=4, steps=40)
    data = json.loads(bench.read_text())
    data["header"]["config"]["event_log"] = str(tmp_path / "run")  # what --event-log DIR records
    bench.write_text(json.dumps(data))
    loaded = load([str(tmp_path / "run")])
    run = loaded.run
    assert loaded.left_out == [] and run is not None and run.kind == "event log" and run.ranks_seen == [0, 1, 2, 3]
    assert [r.baseline_step_s for r in run.steps] == data["steps"]["plain_s"]
    assert run.bench_saving is not None and run.bench_saving["speedup"] == data["speedup_steady"]
    data["header"]["config"]["event_log"] = str(tmp_path / "elsewhere")
    bench.write_text(json.dumps(data))
    loaded = load([str(tmp_path / "run")])
    assert loaded.run is not None and loaded.run.bench_saving is None
    [left] = loaded.left_out
    assert left.startswith(f"{bench}: a bench JSON is a run of its own")


def test_a_json_cut_short_in_a_folder_is_named(tmp_path: Path) -> None:
    write_event_logs(tmp_path, world_size=2, per_rank=False, steps=10)
    trace = write_chrome_trace(tmp_path / "trace.rank0.json", 0, 2, step_ranges(0, 2, 1, 0.01))
    text = json.dumps(json.loads(trace.read_text()), indent=1)
    trace.write_text(text[: len(text) // 2])
    (tmp_path / "train-config.json").write_text('{"world_size": 2}')
    loaded = load([str(tmp_path)])
    assert loaded.run is not None and loaded.run.kind == "event log"
    assert [p.split(" (")[0] for p in loaded.problems] == [f"{trace}: JSON that does not parse"]
    assert loaded.left_out == [f"{tmp_path / 'train-config.json'}: not an input of the report; passed over"]


def test_a_bucket_that_did_not_run_names_no_algorithm(tmp_path: Path) -> None:
    [path] = write_event_logs(tmp_path, world_size=2, per_rank=False, steps=10, straggler=None)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[1]["algorithms"] = [["allreduce", ""], ["", "ring"], ["", ""], ["allreduce", "allreduce"], ["ring", ""]]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = load([str(path)]).run
    assert run is not None
    assert [r.algorithm for r in run.steps[:5]] == ["allreduce", "ring", None, "allreduce", "ring"]


def test_the_degraded_threshold_line_reads_new_and_old_headers() -> None:
    from stragglerkit.report.plots import degraded_threshold

    assert degraded_threshold({"detection": {"degraded_threshold": 1.5}}) == 1.5  # Config.detection
    assert degraded_threshold({"detector": {"degraded_threshold": 1.3}}) == 1.3  # a 0.2.0 log
    assert degraded_threshold({"detection": {}}) is None and degraded_threshold({}) is None

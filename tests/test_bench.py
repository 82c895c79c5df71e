"""stragglerkit bench: option parsing, exact inputs, round ordering, and small end-to-end runs.

The loopback runs always happen; the emulated-cluster run needs root and iproute2 and is skipped
otherwise with EmulatedCluster.available()'s reason (it fails instead under CI=true).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from _require import require_or_skip

from stragglerkit.bench import BenchConfig, parse_algorithms, parse_degrade, parse_delay_option, parse_sizes, run
from stragglerkit.bench.cpu_load import CpuTimes, busy_share, run_queue_wait_ns, softirq_share
from stragglerkit.bench.launch import LaunchResult, detect_mode, jobs_for
from stragglerkit.bench.results import print_table, rows_from_cases
from stragglerkit.bench.worker import exact_inputs
from stragglerkit.cli import main
from stragglerkit.planner.ordering import in_round_order
from stragglerkit.schedules import check
from stragglerkit.schedules.registry import Situation, generate
from stragglerkit.testbed import EmulatedCluster

ROW_FIELDS = {
    "algorithm",
    "world_size",
    "size_bytes",
    "dtype",
    "scenario",
    "time_s",
    "time_from_straggler_s",
    "time_from_first_arrival_s",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
    "predicted_s",
    "cpu_busy",
    "cpu_softirq",
    "run_queue_wait_s",
}


# ------------------------------------------------------------------------------------- options


def test_parse_sizes_range_list_and_single() -> None:
    assert parse_sizes("1MiB..8MiB") == [2**20, 2**21, 2**22, 2**23]
    assert parse_sizes("1MiB..3MiB") == [2**20, 2**21]
    assert parse_sizes("32MiB") == [32 * 2**20]
    assert parse_sizes("1KiB,1000") == [1024, 1000]


@pytest.mark.parametrize("text", ["8MiB..1MiB", "", "0", "abc", "1..4TiB"])
def test_parse_sizes_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError):
        parse_sizes(text)


def test_parse_other_options() -> None:
    assert parse_algorithms("gloo,ring,auto") == ["gloo", "ring", "auto"]
    with pytest.raises(ValueError, match="unknown algorithm"):
        parse_algorithms("gloo,bogus")
    assert parse_degrade("3:2") == (3, 2.0)
    assert parse_degrade("3:8/7") == (3, pytest.approx(8 / 7))
    with pytest.raises(ValueError, match=">= 1"):
        parse_degrade("3:0.5")
    assert parse_delay_option("auto") is None
    assert parse_delay_option("50") == pytest.approx(0.05)
    assert parse_delay_option("2ms") == pytest.approx(0.002)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 1}, "world-size"),
        ({"straggler": 8}, "not a rank"),
        ({"delay": 0.01}, "needs --straggler"),
        ({"degrade": {9: 2.0}}, "not a rank"),
        ({"degrade": {1: 2.0}, "mode": "loopback"}, "emulated cluster"),
        ({"tcp_send_buffer": 2**20, "mode": "loopback"}, "--tcp-send-buffer .* needs the emulated cluster"),
        ({"tcp_send_buffer": 1024}, "at least 8KiB"),
        ({"tcp_congestion_control": "cubic", "mode": "loopback"}, "--tcp-congestion-control .* needs the emulated"),
        ({"tcp_slow_start_after_idle": False, "mode": "loopback"}, "--tcp-slow-start-after-idle .* needs the emulated"),
        ({"fair_queueing": True, "mode": "torchrun"}, "--fair-queueing .* needs the emulated"),
        ({"world_size": 5, "straggler": 4}, "even world size"),
        ({"straggler": 1, "degrade": {2: 2.0}}, "either"),
        ({"dtype": "int8"}, "not supported"),
        ({"iters": 0}, "iters"),
    ],
)
def test_config_rejects_bad_combinations(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BenchConfig(**kwargs)  # type: ignore[arg-type]


def test_cli_reports_bad_options_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--loopback", "--delay", "5", "--sizes", "1KiB"]) == 2
    assert "needs --straggler" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--sizes", "lots"])
    assert "--sizes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--algorithms", "gloo,fastest"])
    assert "unknown algorithm" in capsys.readouterr().err


def test_mode_detection() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}
    assert detect_mode(False, env)[0] == "torchrun"
    assert detect_mode(True, {})[0] == "loopback"
    degraded = BenchConfig(degrade={1: 2.0}, mode="emulated")
    assert [job.scenario for job in jobs_for(degraded)] == ["degraded", "none"]


# ------------------------------------------------------------------------------------- pieces


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32])
@pytest.mark.parametrize("world_size", [2, 7, 64])
def test_exact_inputs_sum_exactly(dtype: torch.dtype, world_size: int) -> None:
    numel = 1001
    total = torch.zeros(numel, dtype=torch.float64)
    for rank in range(world_size):
        own, expected = exact_inputs(numel, rank, world_size, dtype)
        total += own.double()
    assert torch.equal(total.to(dtype), expected)
    assert torch.equal(total, expected.double())  # no rounding anywhere


@pytest.mark.parametrize("n", [4, 6, 8, 16])
def test_in_round_order_adds_only_round_dependencies(n: int) -> None:
    for name in ("stragglar", "direct"):
        schedule = generate(name, Situation(world_size=n, straggler=n - 1))
        ordered = in_round_order(schedule)
        check(ordered)
        phase = schedule.round_phase
        for rank_ops, new_ops in zip(schedule.ops, ordered.ops, strict=True):
            rounds = [op.round for op in rank_ops if op.is_comm and op.phase == phase]
            for index, (old, new) in enumerate(zip(rank_ops, new_ops, strict=True)):
                assert set(old.depends) <= set(new.depends)
                if not (old.is_comm and old.phase == phase) or old.round == rounds[0]:
                    assert new.depends == old.depends
                    continue
                earlier = [i for i in new.depends if rank_ops[i].is_comm and rank_ops[i].phase == phase]
                assert earlier, f"{name} rank op {index}: round {old.round} does not wait for the previous round"
                assert all(rank_ops[i].round != old.round for i in set(new.depends) - set(old.depends))


# ------------------------------------------------------------------------------------- end to end


def _check_rows(rows: list[dict[str, object]], scenario: str, algorithms: set[str]) -> None:
    assert {r["algorithm"] for r in rows if r["scenario"] == scenario} == algorithms
    for row in rows:
        assert ROW_FIELDS <= set(row)
        assert row["wrong"] == 0
        assert isinstance(row["time_s"], float) and row["time_s"] > 0
        assert row["iterations"] == 2


def test_loopback_bench_end_to_end(tmp_path: Path) -> None:
    out = io.StringIO()
    json_path = tmp_path / "bench.json"
    config = BenchConfig(
        world_size=4,
        bandwidth=None,
        sizes=[2**20],
        iters=2,
        warmup=1,
        algorithms=["gloo", "ring", "stragglar", "optcc"],
        straggler=3,
        delay=0.05,
        mode="loopback",
        timeout=120,
    )
    rows = run(config, argv=["--loopback"], json_path=str(json_path), out=out)
    assert rows is not None
    _check_rows(rows, "straggler", {"gloo", "ring", "stragglar"})  # optcc does not apply: skipped
    for row in rows:
        assert row["time_from_straggler_s"] is not None
        # the straggler enters 50 ms after it leaves the barrier. The barrier releases the ranks a few ms
        # apart on a loaded machine (2 ms apart seen on two cores), so only half the delay is asserted.
        assert row["time_from_first_arrival_s"] >= row["time_from_straggler_s"] + 0.025
        assert row["predicted_s"] is None  # no bandwidth known over loopback
        # soft interrupts are part of the busy time; the share is counted in clock ticks (10 ms), so a
        # row whose two iterations took a few ms may read 0 busy ticks: the rows together may not
        assert 0 <= row["cpu_busy"] <= 1 and 0 <= row["cpu_softirq"] <= row["cpu_busy"]
        assert row["run_queue_wait_s"] is not None and row["run_queue_wait_s"] >= 0
    assert any(row["cpu_busy"] > 0 for row in rows), [row["cpu_busy"] for row in rows]  # 4 ranks worked
    data = json.loads(json_path.read_text())
    assert {"command", "machine", "date", "load_average", "cluster"} <= set(data["header"])
    assert len(data["rows"]) == 3
    table = out.getvalue()
    assert "persistent straggler: rank 3" in table and "stragglar" in table and "cpu%" in table


def _our_namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(f"sk-{os.getpid()}-")]


def test_emulated_bench_end_to_end(tmp_path: Path) -> None:
    ok, reason = EmulatedCluster.available()
    if not ok:
        require_or_skip("the emulated cluster", reason)
    out = io.StringIO()
    base = {"world_size": 4, "bandwidth": 125e6, "sizes": [2**20], "iters": 2, "warmup": 1, "mode": "emulated"}
    rows = run(BenchConfig(**base, algorithms=["gloo", "ring"]), out=out)  # type: ignore[arg-type]
    assert rows is not None
    _check_rows(rows, "none", {"gloo", "ring"})
    assert all(r["predicted_s"] is not None and r["predicted_s"] > 0 for r in rows)
    json_path = tmp_path / "straggler.json"
    config = BenchConfig(**base, algorithms=["gloo", "stragglar"], straggler=3)  # type: ignore[arg-type]
    rows = run(config, json_path=str(json_path), out=out)
    assert rows is not None
    _check_rows(rows, "straggler", {"gloo", "stragglar"})
    calibration = rows[0]["calibration"]
    assert isinstance(calibration, dict) and calibration["delay_s"] > 0
    header = json.loads(json_path.read_text())["header"]
    assert header["mode"] == "emulated" and header["cluster"]["shaping"] is not None
    assert _our_namespaces() == []


def test_the_main_jobs_degraded_command_runs(tmp_path: Path) -> None:
    """The demo's OptCC line through the CLI (``--degrade`` once collided with a train-only option)."""
    ok, reason = EmulatedCluster.available()
    if not ok:
        require_or_skip("the emulated cluster", reason)
    json_path = tmp_path / "degraded.json"
    argv = ["bench", "--world-size", "4", "--bandwidth", "1Gbit", "--sizes", "1MiB", "--iters", "2"]
    argv += ["--warmup", "1", "--algorithms", "gloo,optcc", "--degrade", "3:2", "--no-fault-free-baseline"]
    assert main([*argv, "--json", str(json_path)]) == 0
    rows = json.loads(json_path.read_text())["rows"]
    assert {(row["algorithm"], row["scenario"]) for row in rows} == {("gloo", "degraded"), ("optcc", "degraded")}
    assert all(row["wrong"] == 0 for row in rows)
    assert _our_namespaces() == []


def test_optcc_segments_aim_at_half_mebibyte_messages() -> None:
    from stragglerkit.planner.policy import optcc_segments

    assert optcc_segments(32 * 2**20, 8) == 9  # 32 MiB / (7 * 512 KiB)
    assert optcc_segments(2**30, 8) == 64  # capped
    assert optcc_segments(1000, 8) == 1
    assert optcc_segments(2**30, 8, most=16) == 16
    # at least 3 segments (one doubles the pipeline's fill) while messages stay >= 128 KiB
    assert optcc_segments(7 * 2**20, 8) == 3 and optcc_segments(3 * 2**20, 8) == 3
    assert optcc_segments(1356960, 8) == 1  # 3 segments would cut 65 KiB messages
    assert optcc_segments(7 * 2**20, 3) == 7  # 512 KiB messages already give more


def test_optcc_segments_for_another_message_size() -> None:
    from stragglerkit.planner.policy import OPTCC_MESSAGE_BYTES, optcc_segments

    assert OPTCC_MESSAGE_BYTES == 512 * 1024
    assert optcc_segments(32 * 2**20, 8, message_bytes=128 * 1024) == 36
    assert optcc_segments(32 * 2**20, 8, message_bytes=131072) == 36


def test_cpu_counters_from_proc_stat(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 40 800 10 3 12 0 0 0\ncpu0 50 2 20 400 5 1 6 0 0 0\n")
    before = CpuTimes.read(str(stat))
    assert before == CpuTimes(busy=160, softirq=12, total=970)
    stat.write_text("cpu  190 5 80 830 10 3 32 0 0 0\n")
    after = CpuTimes.read(str(stat))
    assert after is not None and before is not None
    used = after - before  # 150 ticks busy (20 of them soft interrupts), 30 idle
    assert busy_share(used) == pytest.approx(150 / 180) and softirq_share(used) == pytest.approx(20 / 180)
    assert busy_share(None) is None and busy_share(CpuTimes(0, 0, 0)) is None  # no tick elapsed
    assert CpuTimes.read(str(tmp_path / "missing")) is None
    stat.write_text("intr 1 2 3\n")
    assert CpuTimes.read(str(stat)) is None


def test_run_queue_wait_sums_the_threads_schedstat(tmp_path: Path) -> None:
    for thread, fields in (("100", "5000 700 3"), ("101", "9000 300 8"), ("102", "garbled")):
        (tmp_path / thread).mkdir()
        (tmp_path / thread / "schedstat").write_text(fields + "\n")
    (tmp_path / "103").mkdir()  # a thread that ended between the listing and the read
    assert run_queue_wait_ns(str(tmp_path)) == 1000
    assert run_queue_wait_ns(str(tmp_path / "missing")) is None
    assert run_queue_wait_ns() is not None  # this process, on Linux


def test_table_flags_rows_where_the_cpus_were_busy() -> None:
    def case(algorithm: str, busy: int) -> dict[str, object]:
        return {
            "scenario": "none",
            "algorithm": algorithm,
            "ran": algorithm,
            "size_bytes": 1 << 20,
            "count": 1 << 18,
            "dtype": "float32",
            "world_size": 4,
            "straggler": None,
            "slowdowns": {},
            "delay_s": 0.0,
            "calibration": None,
            "arrival": [[0.0] * 4],
            "finish": [[0.01] * 4],
            "wrong": 0,
            "timeline": None,
            # the second host was the busier one
            "cpu": [[busy // 2, 0, 100], [busy, 5, 100], None, [10, 0, 100]],
            # [iteration][rank] ns waiting for a core; rank 2 could not read it
            "waited_ns": [[2_000_000, 4_000_000, None, 0]],
        }

    config = BenchConfig(world_size=4, bandwidth=None, sizes=[1 << 20], algorithms=["gloo", "ring"], mode="loopback")
    launched = LaunchResult("loopback", "test", cases=[case("gloo", 60), case("ring", 95)])
    rows = rows_from_cases(config, launched)
    assert [r["cpu_busy"] for r in rows] == pytest.approx([0.60, 0.95])
    assert rows[1]["cpu_softirq"] == pytest.approx(0.05)
    assert rows[0]["run_queue_wait_s"] == pytest.approx(0.002)  # mean of 2, 4 and 0 ms
    out = io.StringIO()
    header = {"config": {"world_size": 4}, "mode": "loopback", "mode_reason": "test"}
    print_table(rows, header, out)
    notes = [line for line in out.getvalue().splitlines() if line.startswith("# note")]
    assert len(notes) == 1 and "ring 1MiB" in notes[0] and "gloo" not in notes[0], notes


def test_results_record_the_source_they_ran() -> None:
    """The header names the commit of the checkout and whether its package sources differ from it,
    and the table prints it, so a committed result can be traced to the code that made it."""
    import shutil

    import stragglerkit
    from stragglerkit.bench.results import source_revision

    source = source_revision()
    assert source["version"] == stragglerkit.__version__
    root = Path(stragglerkit.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if shutil.which("git") is None or head.returncode != 0:
        assert source["commit"] is None and source["modified"] is None
        return
    assert source["commit"] == head.stdout.strip()
    assert isinstance(source["modified"], bool)
    out = io.StringIO()
    print_table([], {"config": {"world_size": 2}, "mode": "loopback", "mode_reason": "test", "source": source}, out)
    assert f"# source: stragglerkit {source['version']} at {source['commit'][:12]}" in out.getvalue()

"""The profiler ranges: a no-op while nobody looks, and the names of docs/profiling.md where an NVTX
tool looks, from one process and from a real 4-rank run; and profiling/nsys_capture.sh.

An NVTX tool is real here: tests/nvtx_recorder.c, built with the C compiler, is loaded by NVTX
itself through NVTX_INJECTION64_PATH, as Nsight Systems' own library is, and records every range
the ``nvtx`` package emits. Nsight Systems itself cannot be installed where the tests run: the
capture script's tests run it without nsys on PATH, and with a stand-in ``nsys`` that records its
arguments.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import profiler_bodies as body
import pytest
import torch
from _dist import run_group
from _require import require_or_skip

from stragglerkit.planner.lowering import lower
from stragglerkit.planner.remap import RankMap
from stragglerkit.runtime.executor import PlanRanges, _range_callback, phase_range_name
from stragglerkit.schedules.ring import ring
from stragglerkit.telemetry import nvtx

ROOT = Path(__file__).resolve().parent.parent
RECORDER = Path(__file__).resolve().parent / "nvtx_recorder.c"
CAPTURE = ROOT / "profiling" / "nsys_capture.sh"


def _require_nvtx() -> None:
    if importlib.util.find_spec("nvtx") is None:
        require_or_skip("the nvtx package", "pip install nvtx (scripts/setup.sh does)")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in nvtx.PROFILER_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    nvtx.configure(None)
    yield monkeypatch
    monkeypatch.undo()
    nvtx.configure(None)


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/nvtx_recorder.c as a shared library (an NVTX tool)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        require_or_skip("a C compiler (cc or gcc)", "it builds the NVTX recorder: apt-get install gcc")
    _require_nvtx()
    library = tmp_path_factory.mktemp("nvtx") / "libnvtx_recorder.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(RECORDER), "-lpthread"], check=True)
    return library


def read_records(prefix: Path) -> dict[int, list[list[str]]]:
    """pid -> the recorder's lines ([thread, what, ...]) of each process that wrote under ``prefix``."""
    records = {}
    for path in prefix.parent.glob(prefix.name + ".*"):
        lines = path.read_text().splitlines()
        records[int(path.suffix[1:])] = [line.split("\t") for line in lines]
    return records


def nesting(lines: list[list[str]]) -> list[tuple[str, list[str]]]:
    """Each pushed range with the ranges open around it (its thread's stack); asserts that every
    thread pops what it pushed and that started ranges end."""
    stacks: dict[str, list[str]] = defaultdict(list)
    started: dict[str, str] = {}
    seen = []
    for thread, what, *rest in lines:
        if what == "push":
            assert rest[0] == nvtx.DOMAIN, rest
            seen.append((rest[1], list(stacks[thread])))
            stacks[thread].append(rest[1])
        elif what == "pop":
            assert stacks[thread], f"thread {thread} pops more ranges than it pushed"
            stacks[thread].pop()
        elif what == "start":
            started[rest[0]] = rest[1]
            seen.append((rest[1], []))
        elif what == "end":
            assert started.pop(rest[0], None) is not None, f"range {rest[0]} ends without a start"
    assert not any(stacks.values()), f"ranges left open: {dict(stacks)}"
    assert not started, f"started ranges that never ended: {started}"
    return seen


# -- nobody looking -------------------------------------------------------------------------------
def test_no_profiler_means_no_op(clean_env: pytest.MonkeyPatch) -> None:
    assert nvtx.refresh() is False and nvtx.backend() == "none"
    assert not nvtx.torch_profiling() and not nvtx.active()
    assert nvtx.range("a") is nvtx.range("b", 3), "disabled ranges share one null context"
    with nvtx.range(nvtx.ALL_REDUCE, "ring"):
        nvtx.push("y")
        nvtx.pop()
    nvtx.mark(nvtx.STEP, 0)
    assert nvtx.start(nvtx.SEND, 1) is None
    nvtx.end(None)
    assert nvtx.thread_state() is None


def test_profiler_without_backend_is_a_no_op(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("NSYS_PROFILING_SESSION_ID", "1")
    clean_env.setitem(sys.modules, "nvtx", None)  # the package is absent
    nvtx.refresh()
    if torch.cuda.is_available():
        pytest.skip("a CUDA device provides torch.cuda.nvtx")
    assert not nvtx.enabled()
    with nvtx.range("x"):
        pass


def test_forcing_off_wins(clean_env: pytest.MonkeyPatch) -> None:
    _require_nvtx()
    clean_env.setenv("NSYS_PROFILING_SESSION_ID", "42")
    assert nvtx.refresh() is True and nvtx.backend() == "nvtx"
    assert nvtx.configure(False) is False
    assert nvtx.refresh() is False  # stays forced off
    assert nvtx.configure(None) is True  # follows the profiler again


def test_the_nvtx_setting_reaches_the_configuration() -> None:
    from stragglerkit.config import Config

    assert Config().report.nvtx is None  # follow the profiler
    assert Config.from_env({"STRAGGLERKIT_NVTX": "0"}).report.nvtx is False
    assert Config.from_env({"STRAGGLERKIT_NVTX": "on"}).report.nvtx is True
    assert Config.from_env({"STRAGGLERKIT_NVTX": "auto"}).report.nvtx is None


# -- the names ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("algorithm", "label", "name"),
    [
        ("stragglar", "reduce_scatter round 0", "stragglerkit/stragglar/pre-phase"),
        ("stragglar", "reduce_scatter round 2", "stragglerkit/stragglar/pre-phase"),
        ("stragglar", "matching round 3", "stragglerkit/stragglar/round 3"),
        ("optcc", "reduce_scatter", "stragglerkit/optcc/stage 1"),
        ("optcc", "upload", "stragglerkit/optcc/stage 2"),
        ("optcc", "download", "stragglerkit/optcc/stage 3"),
        ("optcc", "allgather", "stragglerkit/optcc/stage 4"),
        ("optcc", "fill_up", "stragglerkit/optcc/fill_up"),
        ("ring", "reduce_scatter round 1", "stragglerkit/ring/reduce_scatter round 1"),
        ("rhd", "fold_in round 0", "stragglerkit/rhd/fold_in round 0"),
    ],
)
def test_plan_labels_map_to_the_naming_scheme(algorithm: str, label: str, name: str) -> None:
    assert phase_range_name(algorithm, label) == name


def test_executor_gets_a_range_callback_only_when_someone_looks(clean_env: pytest.MonkeyPatch) -> None:
    (plan,) = lower(ring(3), 300, 4, ranks=[0])
    rank_map = RankMap.from_sequence(None, 3)
    nvtx.refresh()
    assert _range_callback(plan, rank_map) is None  # the executor gets None: no callback, no cost
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert isinstance(_range_callback(plan, rank_map), PlanRanges)
    if importlib.util.find_spec("nvtx") is not None:  # report.nvtx=true with the package: NVTX on
        assert nvtx.configure(True) is True
        assert isinstance(_range_callback(plan, rank_map), PlanRanges)


# -- an NVTX tool looking -------------------------------------------------------------------------
UNIT_SCRIPT = textwrap.dedent(
    """
    from stragglerkit.telemetry import nvtx
    from stragglerkit.runtime.executor import PlanRanges
    from stragglerkit.planner.lowering import lower
    from stragglerkit.planner.remap import RankMap
    from stragglerkit.schedules.stragglar import stragglar

    assert nvtx.configure(True) and nvtx.backend() == "nvtx"
    nvtx.mark(nvtx.STEP, 7)
    with nvtx.range(nvtx.ALL_REDUCE, "stragglar"):
        (plan,) = lower(stragglar(4), 4096, 4, straggler=3, ranks=[0])
        ranges = PlanRanges(plan, RankMap.from_sequence([1, 0, 2, 3], 4))
        pre = [i for i, label in enumerate(plan.labels) if label.startswith("reduce_scatter")]
        matching = plan.labels.index("matching round 0")
        sends = [op for op in range(plan.ops.shape[0]) if int(plan.ops[op, 0]) == 0]
        ranges(pre[0], True)
        ranges(-sends[0] - 2, True)  # message posted
        ranges(pre[0], False)
        ranges(pre[1], True)  # the pre-phase goes on: one range
        ranges(-1, True)
        ranges(-1, False)
        ranges(pre[1], False)
        ranges(matching, True)
        ranges(-sends[0] - 2, False)  # message completed, in another phase
        ranges(-sends[1] - 2, True)  # left open by a failure
        ranges(-1, True)
        ranges.close()
    """
)


def test_ranges_reach_an_nvtx_tool(recorder: Path, tmp_path: Path) -> None:
    prefix = tmp_path / "records"
    env = {**os.environ, "NVTX_INJECTION64_PATH": str(recorder), "NVTX_RECORDER_OUTPUT": str(prefix)}
    subprocess.run([sys.executable, "-c", UNIT_SCRIPT], env=env, check=True, cwd=ROOT, timeout=120)
    ((_, lines),) = read_records(prefix).items()
    seen = nesting(lines)
    names = [name for name, _ in seen]
    assert names == [
        "stragglerkit/step 7",
        "stragglerkit/all_reduce stragglar",
        "stragglerkit/stragglar/pre-phase",
        "stragglerkit/send 0",  # logical 1 is group rank 0
        "stragglerkit/reduction",
        "stragglerkit/stragglar/round 0",
        names[6],
        "stragglerkit/reduction",
    ], names
    assert names[6] in ("stragglerkit/send 0", "stragglerkit/send 2", "stragglerkit/send 3"), names
    inside = dict(seen)
    assert inside["stragglerkit/stragglar/pre-phase"] == ["stragglerkit/all_reduce stragglar"]
    assert inside["stragglerkit/reduction"][-1] == "stragglerkit/stragglar/round 0"


def test_a_real_run_reports_its_ranges_to_an_nvtx_tool(
    recorder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 ranks, DDP hook, report.nvtx=true, no torch profiler: StragglAR adopted at step 5."""
    prefix = tmp_path / "records"
    monkeypatch.setenv("NVTX_INJECTION64_PATH", str(recorder))  # the spawned ranks inherit these
    monkeypatch.setenv("NVTX_RECORDER_OUTPUT", str(prefix))
    n, straggler = 4, 3
    results = run_group(n, body.profiled_steps, "stragglar", str(tmp_path), True, timeout=300.0)
    records = read_records(prefix)
    for rank in range(n):
        lines = records[results[rank]["pid"]]
        seen = nesting(lines)
        names = [name for name, _ in seen]
        for step in range(body.STEPS):
            assert names.count(f"stragglerkit/step {step}") == 1, (rank, step)
        for name in ("exchange", "wait", "decision switch", "probe", "all_reduce process_group", "reduction"):
            assert f"stragglerkit/{name}" in names, (rank, name, sorted(set(names)))
        assert ("stragglerkit/stragglar/pre-phase" in names) == (rank != straggler), rank
        rounds = [(name, around) for name, around in seen if name.startswith("stragglerkit/stragglar/round ")]
        assert rounds and all(around[-1] == "stragglerkit/all_reduce stragglar" for _, around in rounds), rounds
        peers = {
            int(name.split()[-1]) for name in names if name.startswith(("stragglerkit/send ", "stragglerkit/recv "))
        }
        assert peers and rank not in peers and peers <= set(range(n)), (rank, peers)


def test_a_failed_call_closes_its_ranges(recorder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 2 passes a bucket of another size: the call fails on every rank, and every range it
    opened is closed (NVTX on by the tool's variable alone). Rank 2 always posts its first send
    before a header shows the mismatch; another rank may hear rank 2's abort note before its own
    call starts, and then posts nothing."""
    prefix = tmp_path / "records"
    monkeypatch.setenv("NVTX_INJECTION64_PATH", str(recorder))
    monkeypatch.setenv("NVTX_RECORDER_OUTPUT", str(prefix))
    results = run_group(3, body.failed_call, timeout=300.0)
    records = read_records(prefix)
    for rank, out in results.items():
        assert out["error"].startswith("PeerError"), (rank, out["error"])
        names = [name for name, _ in nesting(records[out["pid"]])]  # balanced, every start ended
        assert names.count("stragglerkit/all_reduce ring") == 2, (rank, names)  # the warm call, the failed one
        failed = names[len(names) - 1 - names[::-1].index("stragglerkit/all_reduce ring") :]
        posted = any(name.startswith("stragglerkit/send ") for name in failed)  # posted, then ended
        if rank == 2:
            assert posted, (rank, failed)
        elif not posted:
            assert failed == ["stragglerkit/all_reduce ring"], (rank, failed)
            assert "aborted because rank" in out["error"], (rank, out["error"])


# -- profiling/nsys_capture.sh --------------------------------------------------------------------
def _bash() -> str:
    bash = shutil.which("bash")
    if bash is None:
        require_or_skip("bash", "it runs profiling/nsys_capture.sh")
    return bash


def _system_path() -> str:
    path = os.pathsep.join(p for p in ("/usr/bin", "/bin") if os.path.isdir(p))
    if shutil.which("nsys", path=path):
        pytest.skip("nsys is installed in the system's PATH")
    return path


def test_capture_without_nsys_exits_2_and_says_so(tmp_path: Path) -> None:
    env = {"PATH": _system_path(), "OUT": str(tmp_path / "out"), "RANK": "0"}
    done = subprocess.run([_bash(), str(CAPTURE), "true"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "nsys (NVIDIA Nsight Systems) is not installed or not on PATH" in done.stderr
    assert "Nothing was captured" in done.stderr
    assert not (tmp_path / "out").exists()


FAKE_NSYS = """#!/bin/bash
# stands in for nsys: records its arguments, writes the files it was asked for
printf '%s\\x1f' "$@" >> "$NSYS_ARGS"; echo >> "$NSYS_ARGS"
out=""; prev=""
for a in "$@"; do [ "$prev" = "--output" ] && out=$a; prev=$a; done
case "$1" in
  profile)
    : > "$out.nsys-rep"; shift
    while [ "${1:0:2}" = "--" ]; do [ "$1" = "--output" ] && shift; shift; done
    "$@" ;;
  export) : > "$out" ;;
esac
"""


def _capture(
    tmp_path: Path, env: dict[str, str], *command: str
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "nsys").write_text(FAKE_NSYS)
    (fake / "nsys").chmod(0o755)
    calls = tmp_path / "nsys-args"
    full = {"PATH": f"{fake}{os.pathsep}{_system_path()}", "NSYS_ARGS": str(calls), "OUT": str(tmp_path / "out"), **env}
    done = subprocess.run([_bash(), str(CAPTURE), *command], env=full, capture_output=True, text=True, timeout=60)
    lines = calls.read_text().splitlines() if calls.exists() else []
    return done, [line.split("\x1f")[:-1] for line in lines]


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"RANK": "3", "LOCAL_RANK": "1"}, "rank3"),  # torchrun
        ({"OMPI_COMM_WORLD_RANK": "2"}, "rank2"),  # horovodrun over Open MPI
        ({"HOROVOD_RANK": "5"}, "rank5"),  # horovodrun with Gloo
        ({}, "run"),  # one process tree (the bench starting its own ranks)
    ],
)
def test_capture_names_each_rank_and_exports_sqlite(tmp_path: Path, env: dict[str, str], name: str) -> None:
    done, calls = _capture(tmp_path, env, "sh", "-c", 'echo "nvtx=$STRAGGLERKIT_NVTX"; exit 3')
    assert done.returncode == 3, done  # the command's status
    assert "nvtx=1" in done.stdout
    profile, export = calls
    report = str(tmp_path / "out" / name)
    assert profile[0] == "profile" and "--trace=nvtx,cuda,osrt" in profile
    assert ["--output", report] == profile[profile.index("--output") : profile.index("--output") + 2]
    assert "--capture-range=nvtx" in profile and "--capture-range-end=none" in profile
    assert "--nvtx-capture=stragglerkit/step 0@stragglerkit" in profile
    assert profile[-3:] == ["sh", "-c", 'echo "nvtx=$STRAGGLERKIT_NVTX"; exit 3']
    assert export[:3] == ["export", "--type", "sqlite"] and export[-1] == f"{report}.nsys-rep"
    assert (tmp_path / "out" / f"{name}.sqlite").exists()


def test_capture_from_a_step_or_the_whole_run(tmp_path: Path) -> None:
    _, calls = _capture(tmp_path, {"RANK": "0", "FROM_STEP": "12"}, "true")
    assert "--nvtx-capture=stragglerkit/step 12@stragglerkit" in calls[0]
    _, calls = _capture(tmp_path, {"RANK": "0", "FROM_STEP": "none"}, "true")
    assert not [a for a in calls[-2] if a.startswith("--capture-range")]


@pytest.mark.parametrize(
    ("env", "command", "says"),
    [
        ({"FROM_STEP": "first"}, ["true"], "FROM_STEP must be a step number or 'none'"),
        ({"RANK": "r1"}, ["true"], "not a rank number"),
        ({}, [], "usage:"),
    ],
)
def test_capture_refuses_bad_settings(tmp_path: Path, env: dict[str, str], command: list[str], says: str) -> None:
    done, calls = _capture(tmp_path, env, *command)
    assert done.returncode == 64 and says in done.stderr, done
    assert calls == []

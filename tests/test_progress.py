"""Progress output: a bar on a terminal, plain lines elsewhere; ``python -m profiling.lab.train --event-log``.

The bench runs on 2 loopback ranks with stderr piped (as in CI): its progress must be plain
lines, one per status, without a carriage return, and the event-log folder must hold every
rank's log of the hooked copy.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from profiling.lab.train_config import TrainConfig
from stragglerkit.bench.progress import Progress, is_terminal

ROOT = Path(__file__).resolve().parents[1]


def test_without_a_terminal_every_status_is_a_plain_line() -> None:
    stream = io.StringIO()
    progress = Progress(10, "train", stream=stream)
    assert not progress.drawing and not is_terminal(stream)
    progress.note("2 ranks, a small MLP")
    progress.advance(5)  # no status: nothing to print
    progress.advance(5, "step 10/10: plain 4.0 ms, hooked 3.0 ms")
    progress.close()
    assert stream.getvalue() == "train: 2 ranks, a small MLP\ntrain: step 10/10: plain 4.0 ms, hooked 3.0 ms\n"
    quiet = io.StringIO()
    silent = Progress(3, "train", stream=quiet, enabled=False)
    silent.note("x")
    silent.advance(3, "y")
    assert quiet.getvalue() == ""
    bare = io.StringIO()
    Progress(1, "", stream=bare).advance(1, "step    0  loss 6.2")
    assert bare.getvalue() == "step    0  loss 6.2\n"


def test_on_a_terminal_a_bar_is_drawn_and_notes_stay_above_it() -> None:
    main, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    try:
        with os.fdopen(side, "w", closefd=False) as stream:
            progress = Progress(4, "train", stream=stream)
            assert progress.drawing
            progress.advance(2, "plain 4.0 ms, hooked 3.0 ms")
            progress.note("step 2: switch to stragglar")
            progress.advance(2)
            progress.close()
            stream.flush()
        written = b""
        while True:
            os.set_blocking(main, False)
            try:
                chunk = os.read(main, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            written += chunk
    finally:
        os.close(main)
        os.close(side)
    text = written.decode(errors="replace")
    assert "\r" in text and "4/4" in text and "hooked 3.0 ms" in text
    assert "train: step 2: switch to stragglar" in text


def test_bench_train_prints_plain_lines_and_writes_every_rank_s_event_log(tmp_path: Path) -> None:
    logs = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "profiling.lab.train",
        "--loopback",
        "-n",
        "2",
        "--steps",
        "6",
        "--steps-per-block",
        "3",
        "--model-size",
        "64KiB",
        "--hook-warmup",
        "2",
        "--event-log",
        str(logs),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert "\r" not in done.stderr
    assert [line for line in lines if line.startswith("train: step 6/6: plain ")], done.stderr
    assert [line for line in lines if line.startswith("train: 2 ranks, ")], done.stderr
    headers = [json.loads((logs / f"events.rank{r}.jsonl").read_text().splitlines()[0]) for r in range(2)]
    assert [h["rank"] for h in headers] == [0, 1] and {h["framework"] for h in headers} == {"ddp"}
    assert headers[0]["run_id"] == headers[1]["run_id"] and headers[0]["config"]["detection"]["warmup_steps"] == 2
    windows = [json.loads(line) for line in (logs / "events.rank0.jsonl").read_text().splitlines()[1:]]
    assert windows and all(w["kind"] == "window" for w in windows), windows


def test_event_log_folder_is_checked() -> None:
    assert TrainConfig(world_size=2, mode="loopback", event_log="/tmp/x").event_log == "/tmp/x"
    with pytest.raises(ValueError, match="--event-log"):
        TrainConfig(world_size=2, mode="loopback", event_log="")

"""Weights & Biases logging: a real 2-rank loop on loopback logs into rank 0's offline W&B run.

The run's ``.wandb`` file is read back with wandb's own protobuf records (``wandb.proto``): the
history rows must hold stragglerkit's per-step keys, one step of ours per row of the user's own
``wandb.log`` calls, whose ``_step`` stays the user's; with ``report.wandb: false`` nothing of
stragglerkit's appears.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import struct
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _dist import run_group
from _require import needs

from stragglerkit.config import Config, ReportConfig
from stragglerkit.errors import ConfigError
from stragglerkit.telemetry.wandb import PREFIX, STEP_METRIC, log_figures, rows, wandb_logger

try:
    import wandb
except ImportError:  # skipped where missing, failed under CI=true: the mark below
    wandb = None
pytestmark = needs("wandb", wandb is None, "pip install wandb (scripts/setup.sh does)")

STEPS = 16
FORCED_AT = 4
LATE_S = 0.03


def _train(rank: int, loop: Any, run: Any) -> list[dict[str, Any]]:
    from stragglerkit.detect.controller import Decision, Plan

    buckets = [torch.ones(16 * 1024), torch.ones(4 * 1024)]
    for step in range(STEPS):
        if step == FORCED_AT:  # every rank: a ring plan, whose runs measure every link, and its event
            switch = {"kind": "switch", "evidence": {"why": "forced by the test"}}
            loop.adopt(Decision(10_000, step, Plan("allreduce", ("ring", "ring")), [switch]))
        if rank == 1 and step >= 1:
            time.sleep(LATE_S)
        for index, bucket in enumerate(buckets):
            loop.all_reduce_bucket(bucket, index, index == len(buckets) - 1)
        loop.synchronize()
        if run is not None:
            run.log({"loss": 1.0 / (step + 1), "user_step": step})  # the user's own row, every step
    loop.close()
    return list(loop.events)


def _wandb_run(rank: int, n: int, folder: str) -> list[dict[str, Any]]:
    """Two loops on one session, each into its own offline W&B run on rank 0: auto, then off."""
    import stragglerkit
    from stragglerkit.loop import StragglerLoop
    from stragglerkit.session import session_for

    stragglerkit.init()
    session = session_for(None)
    events = []
    for name, setting in (("auto", None), ("off", False)):
        run = None
        if rank == 0:
            run = wandb.init(mode="offline", dir=str(Path(folder) / name), project="stragglerkit-test")
        config = Config().replace(
            detection={"warmup_steps": 2, "exchange_every": 2, "quiet_exchange_every": 0},
            report={"wandb": setting},
        )
        events.append(_train(rank, StragglerLoop(session, config), run))
        if run is not None:
            run.finish()
    stragglerkit.destroy()
    return events[0]


def _records(path: Path) -> list[Any]:
    """The protobuf records of a ``.wandb`` file: W&B's log format, a 7-byte header (``:W&B``,
    magic, version) then 32 KiB blocks of records, each a 7-byte header (checksum, length, type:
    1 full, 2 first, 3 middle, 4 last) and a piece of one serialised ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    block, at, pending, records = 32 * 1024, 7, b"", []
    while at + 7 <= len(data):
        if block - at % block < 7:  # a block's tail too short for a header is padding
            at += block - at % block
            continue
        _, length, kind = struct.unpack("<IHB", data[at : at + 7])
        if at + 7 + length > len(data):  # a record still being written
            break
        at += 7
        pending += data[at : at + length]
        at += length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def _history(folder: Path) -> tuple[list[dict[str, Any]], list[Any]]:
    """The history rows (key -> value) and the metric definitions of the one run under ``folder``."""
    (path,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 60.0
    records = _records(path)
    # run.finish() can return before W&B's service has written the run's last records: wait for its exit record
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = _records(path)
    history, metrics = [], []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "metric":
            metrics.append(record.metric)
    return history, metrics


def test_rank_0_logs_every_step_into_the_user_s_rows_and_nothing_when_off(tmp_path: Path) -> None:
    events = run_group(2, _wandb_run, str(tmp_path), timeout=300.0)[0]
    # rank 0's controller switches back to its baseline after the forced plan (nothing is wrong)
    back = min([e["step"] for e in events if e["kind"] == "switch" and e["step"] > FORCED_AT] + [STEPS])
    history, metrics = _history(tmp_path / "auto")
    user_rows = [row for row in history if "user_step" in row]
    assert [row["_step"] for row in user_rows] == list(range(STEPS)), "the user's steps are the user's"
    assert len(history) <= STEPS + 1, "no rows of ours beyond the last one merged at the end"
    ours = [row for row in history if STEP_METRIC in row]
    steps = [row[STEP_METRIC] for row in ours]
    assert steps == sorted(set(steps)) and steps[: STEPS - 6] == list(range(STEPS - 6)), steps
    by_step = {row[STEP_METRIC]: row for row in ours}
    for step, row in by_step.items():
        ring = FORCED_AT <= step < back
        assert row[f"{PREFIX}/algorithm"] == ("ring" if ring else "allreduce"), (back, row)
        assert row[f"{PREFIX}/algorithm_code"] == (1 if ring else 0)
        if step >= 2:
            assert row[f"{PREFIX}/allreduce_s"] >= 0 and row[f"{PREFIX}/predicted_s"] > 0
        if FORCED_AT + 2 <= step < back - back % 2:  # windows under the ring plan measured each rank's link
            assert row[f"{PREFIX}/nic_rate_Bps/rank0"] > 0 and row[f"{PREFIX}/nic_rate_Bps/rank1"] > 0
    late = {
        r: statistics.median(row[f"{PREFIX}/lateness_s/rank{r}"] for s, row in by_step.items() if s >= 2)
        for r in (0, 1)
    }
    assert late[1] > 0.5 * LATE_S > late[0], late
    events = [row for row in history if f"{PREFIX}/events/_type" in row]
    assert events and events[0][f"{PREFIX}/events/_type"] == "table-file" and events[0][f"{PREFIX}/events/nrows"] >= 1
    assert any(m.glob_name == f"{PREFIX}/*" and m.step_metric == STEP_METRIC for m in metrics)
    # the loop's close drew the report's figures from its records and logged them as images
    images = {key.split("/_type")[0] for row in history for key, value in row.items() if value == "image-file"}
    assert {f"{PREFIX}/report/report_allreduce", f"{PREFIX}/report/report_last_rank"} <= images, images
    assert list((tmp_path / "auto").glob("wandb/offline-run-*/files/stragglerkit-report/report_allreduce.png"))

    history_off, metrics_off = _history(tmp_path / "off")
    assert [row["_step"] for row in history_off if "user_step" in row] == list(range(STEPS))
    assert not [key for row in history_off for key in row if key.startswith(PREFIX)]
    assert not metrics_off


def test_rows_leave_unknown_figures_out() -> None:
    window = {
        "kind": "window",
        "steps": [7, 8],
        "lateness_s": [[0.0, 0.02], [None, None]],
        "allreduce_s": [0.01, None],
        "algorithms": [["stragglar", "allreduce"], ["ring", "allreduce", "allreduce"]],
        "nic_rate_Bps": [1e8, None],
        "slowdown": [1.0, None],
        "predicted_s": [None, 0.02],
    }
    first, second = rows(window)
    assert first == {
        STEP_METRIC: 7,
        f"{PREFIX}/allreduce_s": 0.01,
        f"{PREFIX}/algorithm": "stragglar",
        f"{PREFIX}/algorithm_code": 4,
        f"{PREFIX}/lateness_s/rank0": 0.0,
        f"{PREFIX}/lateness_s/rank1": 0.02,
        f"{PREFIX}/nic_rate_Bps/rank0": 1e8,
        f"{PREFIX}/slowdown/rank0": 1.0,
    }
    assert second[f"{PREFIX}/algorithm"] == "allreduce" and second[f"{PREFIX}/predicted_s"] == 0.02
    assert f"{PREFIX}/allreduce_s" not in second and f"{PREFIX}/lateness_s/rank0" not in second


def test_the_setting_reads_true_false_auto_and_true_needs_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ReportConfig(wandb="auto").wandb is None and ReportConfig(wandb="on").wandb is True  # type: ignore[arg-type]
    assert Config.from_dict({"report": {"wandb": False}}).report.wandb is False
    with pytest.raises(ConfigError, match="true, false or auto"):
        ReportConfig(wandb="sometimes")  # type: ignore[arg-type]
    real = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "wandb")  # as if never installed: not imported, not found
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="pip install wandb"):
        ReportConfig(wandb=True)
    assert ReportConfig(wandb=None).wandb is None  # auto without wandb: simply off


def test_log_figures_logs_pngs_into_the_active_run(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure = tmp_path / "delay_cdf.png"
    plt.figure(figsize=(2, 2))
    plt.plot([0, 1], [0, 1])
    plt.savefig(figure)
    plt.close("all")
    with pytest.raises(ConfigError, match=r"wandb\.init"):
        log_figures([figure])
    run = wandb.init(mode="offline", dir=str(tmp_path), project="stragglerkit-test")
    try:
        with pytest.raises(ConfigError, match="PNG"):
            log_figures([tmp_path / "report.html"])
        assert log_figures([figure]) == [f"{PREFIX}/report/delay_cdf"]
        run.log({"loss": 1.0})
    finally:
        run.finish()
    history, _ = _history(tmp_path)
    assert history[0][f"{PREFIX}/report/delay_cdf/_type"] == "image-file" and history[0]["loss"] == 1.0
    assert list(tmp_path.glob("wandb/offline-run-*/files/media/images/stragglerkit/report/delay_cdf_*.png"))


def test_asked_for_without_a_run_it_warns_once_and_keeps_the_rows() -> None:
    assert wandb.run is None and wandb_logger(False) is None
    logger = wandb_logger(True)
    assert logger is not None and logger.required
    logger.add({"kind": "window", "steps": [3], "allreduce_s": [0.01]})
    with pytest.warns(UserWarning, match=r"wandb\.init"):
        logger.pump()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logger.pump()  # said once
        assert not logger.active
    quiet = wandb_logger(None)
    assert quiet is not None and not quiet.active  # auto without a run: silent, nothing built

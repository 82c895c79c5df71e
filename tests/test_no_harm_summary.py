"""profiling/_no_harm_summary.py: from the no-harm launches to the cells of the results page.

Launch files are written here as the training bench writes them (the fields the summary reads);
the launches themselves run in tests/test_bench_train.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "profiling"))

import _no_harm_summary as no_harm  # noqa: E402


def _launch(speedup: float, control: float, *, cpu: str = "Intel Xeon", switched: bool = False,
            warmup: tuple[float, float, float] = (1.0, 1.0, 1.0)) -> dict[str, Any]:  # fmt: skip
    """A launch whose steady ratios are ``speedup`` and ``control`` and whose first four steps
    (the warm-up) took ``warmup`` = (plain, control, hooked) seconds each."""
    plain, second, hooked = warmup
    events = [{"step": 30, "kind": "switch", "algorithm": "optcc"}] if switched else []
    return {
        "header": {
            "command": "python -m profiling.lab.train --world-size 8",
            "source": {"commit": "abc1234"},
            "date": "2026-11-29T12:00:00+00:00",
            "machine": {"cpu_model": cpu},
            "load_average": [2.0, 2.0, 2.0],
        },
        "speedup_steady": speedup,
        "control_speedup_steady": control,
        "speedup_steady_total": speedup,
        "control_speedup_steady_total": control,
        "plain_steady_ms": 100.0,
        "hook_config": {"warmup_steps": 4},
        "steps": {
            "plain_s": [plain] * 4 + [0.1] * 8,
            "control_s": [second] * 4 + [0.1] * 8,
            "hooked_s": [hooked] * 4 + [0.1] * 8,
        },
        "events": events,
        "detected": [],
        "steady_steps": [6, 11],
        "model": {"buckets_bytes": [1 << 20]},
        "plain_identical_on_all_ranks": True,
        "control_identical_on_all_ranks": True,
        "hooked_identical_on_all_ranks": True,
    }


def _write(folder: Path, name: str, data: dict[str, Any]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_cell_is_the_median_of_its_launches_beside_its_control(tmp_path: Path) -> None:
    paths = [
        _write(tmp_path, "ddp_8MiB_run1", _launch(0.995, 1.004)),
        _write(tmp_path, "ddp_8MiB_run2", _launch(0.991, 0.996, warmup=(1.0, 1.0, 1.1))),
        _write(tmp_path, "ddp_8MiB_run3", _launch(1.001, 1.002)),
        _write(tmp_path, "horovod_32MiB_run1", _launch(0.97, 1.03)),
    ]
    results = no_harm.summarize(paths)
    assert set(results) == {"ddp/8MiB", "horovod/32MiB"}
    ddp = results["ddp/8MiB"]
    assert ddp["median_speedup_steady"] == pytest.approx(0.995)
    assert ddp["median_control"] == pytest.approx(1.002)
    assert ddp["control_spread"] == pytest.approx(0.004)
    assert ddp["met"] and ddp["launches_that_switched"] == 0
    # the warm-up ratio is plain's total over the first warmup_steps against stragglerkit's
    assert [x["warmup"] for x in ddp["launches"]] == pytest.approx([1.0, 1 / 1.1, 1.0])
    assert ddp["median_warmup"] == pytest.approx(1.0) and ddp["warmup_met"] is True
    assert ddp["measured"]["commits"] == ["abc1234"]
    horovod = results["horovod/32MiB"]
    assert not horovod["met"] and horovod["control_spread"] == pytest.approx(0.03)


def test_a_switch_on_a_healthy_cluster_misses_the_target(tmp_path: Path) -> None:
    paths = [_write(tmp_path, f"ddp_8MiB_run{i}", _launch(1.0, 1.0, switched=i == 2)) for i in (1, 2, 3)]
    cell = no_harm.summarize(paths)["ddp/8MiB"]
    assert cell["launches_that_switched"] == 1 and not cell["met"]


def test_slow_warm_up_misses_its_own_target(tmp_path: Path) -> None:
    paths = [_write(tmp_path, f"ddp_8MiB_run{i}", _launch(1.0, 1.0, warmup=(1.0, 1.0, 1.05))) for i in (1, 2)]
    cell = no_harm.summarize(paths)["ddp/8MiB"]
    assert cell["met"] and cell["warmup_met"] is False


def test_launches_without_a_control_or_of_two_machines_are_refused(tmp_path: Path) -> None:
    lacking = _launch(1.0, 1.0)
    lacking["control_speedup_steady"] = None
    with pytest.raises(SystemExit, match="no A/A control"):
        no_harm.summarize([_write(tmp_path, "ddp_8MiB_run1", lacking)])
    mixed = [_write(tmp_path, "ddp_8MiB_run1", _launch(1.0, 1.0)),
             _write(tmp_path, "ddp_8MiB_run2", _launch(1.0, 1.0, cpu="AMD EPYC"))]  # fmt: skip
    with pytest.raises(SystemExit, match="different CPU models"):
        no_harm.summarize(mixed)
    with pytest.raises(SystemExit, match="not a <framework>_<size>_run"):
        no_harm.summarize([_write(tmp_path, "no_fault_run1", _launch(1.0, 1.0))])


def test_a_later_launch_keeps_the_cells_it_does_not_measure(tmp_path: Path) -> None:
    out = tmp_path / "bench_no_harm.json"
    out.write_text(json.dumps({"results": {"megatron/8MiB": {"kept": True}, "ddp/8MiB": {"old": True}}}))
    fresh = no_harm.summarize([_write(tmp_path, "ddp_8MiB_run1", _launch(1.0, 1.0))])
    merged = no_harm.keep_unmeasured(out, fresh)
    assert merged["megatron/8MiB"] == {"kept": True} and "old" not in merged["ddp/8MiB"]

"""The NVTX shim: a no-op without a backend and a profiler, forwarding when both are there."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from stragglerkit.report import nvtx


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in nvtx.PROFILER_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    nvtx.configure(None)
    yield monkeypatch
    monkeypatch.undo()
    nvtx.configure(None)


def fake_nvtx_module(calls: list[tuple[str, str | None]]) -> types.ModuleType:
    module = types.ModuleType("nvtx")

    def push_range(message: str, domain: str | None = None) -> None:
        calls.append(("push", message))

    def pop_range(domain: str | None = None) -> None:
        calls.append(("pop", None))

    module.push_range = push_range  # type: ignore[attr-defined]
    module.pop_range = pop_range  # type: ignore[attr-defined]
    return module


def test_no_profiler_means_no_op(clean_env: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str | None]] = []
    clean_env.setitem(sys.modules, "nvtx", fake_nvtx_module(calls))
    assert nvtx.refresh() is False
    assert nvtx.backend() == "none"
    with nvtx.range("x"):
        nvtx.push("y")
        nvtx.pop()
    assert calls == []
    assert nvtx.range("a") is nvtx.range("b"), "disabled ranges share one null context"


def test_profiler_without_backend_is_a_no_op(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("NSYS_PROFILING_SESSION_ID", "1")
    clean_env.setitem(sys.modules, "nvtx", None)  # the package is absent
    nvtx.refresh()
    # CPU torch: no torch.cuda.nvtx fallback either
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device provides torch.cuda.nvtx")
    assert not nvtx.enabled()
    with nvtx.range("x"):
        pass


def test_backend_and_profiler_emit_ranges(clean_env: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str | None]] = []
    clean_env.setitem(sys.modules, "nvtx", fake_nvtx_module(calls))
    clean_env.setenv("NSYS_PROFILING_SESSION_ID", "42")
    assert nvtx.refresh() is True and nvtx.backend() == "nvtx"
    with nvtx.range("stragglerkit/all_reduce ring"):
        nvtx.push("stragglerkit/reduction")
        nvtx.pop()
    assert calls == [
        ("push", "stragglerkit/all_reduce ring"),
        ("push", "stragglerkit/reduction"),
        ("pop", None),
        ("pop", None),
    ]


def test_forcing_off_wins(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setitem(sys.modules, "nvtx", fake_nvtx_module([]))
    clean_env.setenv("NSYS_PROFILING_SESSION_ID", "42")
    assert nvtx.refresh() is True
    assert nvtx.configure(False) is False
    assert nvtx.refresh() is False  # stays forced off
    assert nvtx.configure(None) is True  # follows the profiler again


def test_the_nvtx_setting_reaches_the_configuration() -> None:
    from stragglerkit.config import Config

    assert Config().report.nvtx is None  # follow the profiler
    assert Config.from_env({"STRAGGLERKIT_NVTX": "0"}).report.nvtx is False
    assert Config.from_env({"STRAGGLERKIT_NVTX": "on"}).report.nvtx is True
    assert Config.from_env({"STRAGGLERKIT_NVTX": "auto"}).report.nvtx is None


def test_executor_gets_a_range_callback_only_when_enabled(clean_env: pytest.MonkeyPatch) -> None:
    from stragglerkit.runtime.executor import _range_callback

    nvtx.refresh()
    assert _range_callback(["reduce_scatter round 0"]) is None
    calls: list[tuple[str, str | None]] = []
    clean_env.setitem(sys.modules, "nvtx", fake_nvtx_module(calls))
    assert nvtx.configure(True) is True  # forced on, without a profiler
    callback = _range_callback(["reduce_scatter round 0"])
    assert callback is not None
    callback(0, True)
    callback(-1, True)
    callback(-1, False)
    callback(0, False)
    assert [c[1] for c in calls if c[0] == "push"] == [
        "stragglerkit/reduce_scatter round 0",
        "stragglerkit/reduction",
    ]

"""The ``STRAGGLERKIT_*`` environment settings: all of them in one table, checked together.

Each setting is read where it is used (runtime/send_buffer.py, runtime/plan.py, runtime/api.py,
runtime/executor.py, report/nvtx.py); this module knows them all, so that a bad value is found
before anything runs, and a rank whose settings differ from the others' where they must agree is
named instead of leaving the others waiting:

* :func:`check_local` (every all_reduce call, inside the argument checks of
  ``Runtime._run``): reads every setting that is set and raises ``ValueError`` for the first bad
  value. There a failure is an invalid argument: this rank raises, and the others get an abort
  note that names it.
* :func:`check_across_ranks` (once, when a gloo group's runtime is created, a collective): every
  rank's set values and their errors are gathered. A bad value on any rank, or a difference in a
  setting that must be the same everywhere (those that decide which groups the runtime creates,
  collectively, or which plan runs), raises the same ``ValueError`` on every rank, naming the
  ranks and the values. Without it a rank with ``STRAGGLERKIT_TCP_SEND_BUFFER=off`` among ranks
  with the default would skip a group creation that the others wait in.
* :func:`unknown` lists set ``STRAGGLERKIT_*`` names that are no setting (a typo), with the
  closest known name; the runtime warns about them once.

Example::

    from stragglerkit.runtime import settings
    settings.check_local()                 # ValueError: STRAGGLERKIT_POST_AHEAD='maybe': give on or off
    settings.unknown({"STRAGGLERKIT_WAITMODE": "ordered"})  # [("STRAGGLERKIT_WAITMODE", "STRAGGLERKIT_WAIT_MODE")]
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch.distributed as dist

from stragglerkit.units import switch_from_env

__all__ = ["PREFIX", "SETTINGS", "Setting", "check_across_ranks", "check_local", "duplex_enabled", "unknown"]

PREFIX = "STRAGGLERKIT_"


def duplex_enabled() -> bool:
    """``STRAGGLERKIT_DUPLEX`` (unset: on): whether the runtime creates a second gloo group for
    messages from higher to lower ranks (runtime/executor.py: duplex_group); ValueError names a bad value."""
    return switch_from_env("STRAGGLERKIT_DUPLEX", True)


def _lazy(module: str, function: str) -> Callable[[], object]:
    """A reader that calls ``module.function``, imported at the first read: runtime/api.py imports
    this module, so this module cannot import api.py (or what api.py imports) when it loads."""

    def read() -> object:
        reader: Callable[[], object] = getattr(importlib.import_module(module), function)
        return reader()

    return read


@dataclass(frozen=True)
class Setting:
    """One ``STRAGGLERKIT_*`` variable: how to read it (raises on a bad value) and whether every
    rank must give it the same value."""

    name: str
    read: Callable[[], object]
    same_on_every_rank: bool
    what: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "STRAGGLERKIT_TCP_SEND_BUFFER",
        _lazy("stragglerkit.runtime.send_buffer", "send_buffer_from_env"),
        True,
        "the send buffer of the runtime's own gloo connections; decides which groups it creates",
    ),
    Setting(
        "STRAGGLERKIT_OPTCC_SEND_BUFFER",
        _lazy("stragglerkit.runtime.send_buffer", "optcc_send_buffer_from_env"),
        False,
        "the send buffer of the runtime's own gloo connections while OptCC runs",
    ),
    Setting("STRAGGLERKIT_DUPLEX", duplex_enabled, True, "whether the runtime creates a second gloo group"),
    Setting(
        "STRAGGLERKIT_OPTCC_MESSAGE_BYTES",
        _lazy("stragglerkit.runtime.api", "optcc_message_bytes"),
        True,
        "OptCC's message size: its plan",
    ),
    Setting(
        "STRAGGLERKIT_OPTCC_SIZING",
        _lazy("stragglerkit.runtime.api", "optcc_sizing"),
        True,
        "how OptCC sizes its chunks: its plan",
    ),
    Setting(
        "STRAGGLERKIT_OPTCC_BUBBLE_FILLING",
        _lazy("stragglerkit.runtime.api", "optcc_bubble_filling_setting"),
        True,
        "OptCC's fills: its plan",
    ),
    Setting(
        "STRAGGLERKIT_POST_AHEAD",
        _lazy("stragglerkit.runtime.plan", "post_ahead_enabled"),
        False,
        "receives posted ahead on one connection",
    ),
    Setting(
        "STRAGGLERKIT_WAIT_MODE",
        _lazy("stragglerkit.runtime.executor", "wait_mode"),
        False,
        "how the executor observes completions",
    ),
    Setting("STRAGGLERKIT_NVTX", _lazy("stragglerkit.report.nvtx", "forced_setting"), False, "NVTX ranges on or off"),
)


def _error(setting: Setting) -> str | None:
    try:
        setting.read()
    except (ValueError, RuntimeError) as err:  # the readers raise ValueError or StragglerKitError
        return str(err)
    return None


def check_local(environ: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` for the first set ``STRAGGLERKIT_*`` setting with a bad value."""
    env = os.environ if environ is None else environ
    for setting in SETTINGS:
        if env.get(setting.name, "").strip():
            error = _error(setting)
            if error is not None:
                raise ValueError(error)


def check_across_ranks(group: dist.ProcessGroup) -> None:
    """Collective over ``group`` (gloo): raise the same ``ValueError`` on every rank if any rank has
    a bad value or the ranks differ in a setting that must be the same everywhere."""
    mine: dict[str, tuple[str, str | None]] = {}
    for setting in SETTINGS:
        text = os.environ.get(setting.name, "").strip()
        if text:
            mine[setting.name] = (text, _error(setting))
    everyone: list[dict[str, tuple[str, str | None]] | None] = [None] * group.size()
    dist.all_gather_object(everyone, mine, group=group)
    problems: list[str] = []
    for setting in SETTINGS:
        values = {rank: (found or {}).get(setting.name) for rank, found in enumerate(everyone)}
        for rank, entry in values.items():
            if entry is not None and entry[1] is not None:
                problems.append(f"on rank {rank}: {entry[1]}")
        if setting.same_on_every_rank:
            by_value: dict[str | None, list[int]] = {}
            for rank, entry in values.items():
                by_value.setdefault(entry[0] if entry is not None else None, []).append(rank)
            if len(by_value) > 1:
                listed = "; ".join(
                    f"{'unset' if value is None else repr(value)} on rank(s) {', '.join(map(str, ranks))}"
                    for value, ranks in by_value.items()
                )
                problems.append(
                    f"{setting.name} differs between ranks ({listed}): it sets {setting.what}, "
                    "so give it the same value on every rank"
                )
    if problems:
        raise ValueError("stragglerkit settings: " + " | ".join(problems))


def unknown(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Set ``STRAGGLERKIT_*`` names that are no setting, each with the closest known name (or None)."""
    env = os.environ if environ is None else environ
    known = [setting.name for setting in SETTINGS]
    found = []
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in known:
            suffixes = [known_name[len(PREFIX) :] for known_name in known]
            close = difflib.get_close_matches(name[len(PREFIX) :], suffixes, n=1, cutoff=0.7)
            found.append((name, PREFIX + close[0] if close else None))
    return found

"""The per-group state that :func:`stragglerkit.init` creates, collectively, once.

Everything collective that the library needs besides the AllReduces themselves happens here, in
one documented call made by every rank of the group, so nothing collective happens behind the
user's back later:

* the configuration is checked across ranks (a rank whose configuration differs is named on every
  rank, instead of the ranks running different plans and waiting for each other);
* the :class:`~stragglerkit.runtime.runtime.Runtime` is created, with its own gloo groups whose
  connections it bounds (the user's groups are used as they are, never rebound);
* a gloo side group for the closed loop's stats exchange, and a gloo group with the configured
  timeout where the loop runs the group's own AllReduce;
* the clock offsets to rank 0 are measured (the NIC estimate pairs times across hosts).

Example::

    session = create(group=None, config=Config())      # what stragglerkit.init does
    session_for(None).runtime.all_reduce(tensor)
"""

from __future__ import annotations

import datetime
import warnings
from dataclasses import dataclass
from typing import Any, NoReturn

import torch.distributed as dist

from stragglerkit.config import Config, unknown_variables
from stragglerkit.detect.arrival import ClockOffsets, estimate_clock_offsets
from stragglerkit.errors import ConfigError, NotInitializedError
from stragglerkit.runtime.executor import gloo_group_over
from stragglerkit.runtime.runtime import Runtime

__all__ = ["Session", "create", "destroy", "is_initialized", "refuse", "session_for"]

_NOT_AGREED = ("report",)
"""Sections that may differ between ranks (they change what a rank records, not what it sends)."""


@dataclass(slots=True, eq=False)
class Session:
    """What :func:`stragglerkit.init` set up for one process group."""

    group: dist.ProcessGroup
    config: Config
    runtime: Runtime
    side_group: dist.ProcessGroup
    """gloo, same ranks: the closed loop's stats exchange, clock syncs and fault reports."""
    allreduce_group: dist.ProcessGroup
    """Where the loop runs the group's own AllReduce: with gloo a group of the session's with the
    configured timeout, else ``group`` itself."""
    clock_offsets: ClockOffsets
    """Per rank: add to its wall clock (ns) for rank 0's, measured at ``init``."""
    loops: int = 0
    """Closed loops created on this session so far (numbers them, the same on every rank)."""

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def world_size(self) -> int:
        return self.group.size()

    @property
    def backend(self) -> str:
        """The group's backend, as ``dist.get_backend`` names it (``gloo``, ``nccl``, ...)."""
        return str(dist.get_backend(self.group))


_SESSIONS: dict[int, Session] = {}


def _resolve(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    if not dist.is_initialized():
        raise NotInitializedError(
            "torch.distributed is not initialised: call dist.init_process_group(...) and then "
            "stragglerkit.init() on every rank"
        )
    return group if group is not None else dist.distributed_c10d._get_default_group()


def is_initialized(group: dist.ProcessGroup | None = None) -> bool:
    """Was :func:`stragglerkit.init` called for ``group`` (default: the default group) on this rank?"""
    if not dist.is_initialized():
        return False
    resolved = _resolve(group)
    session = _SESSIONS.get(id(resolved))
    return session is not None and session.group is resolved


def session_for(group: dist.ProcessGroup | None = None) -> Session:
    """The session of ``group``; :class:`NotInitializedError` says what to call if there is none."""
    resolved = _resolve(group)
    session = _SESSIONS.get(id(resolved))
    if session is None or session.group is not resolved:
        which = "the default group" if group is None else "this group"
        raise NotInitializedError(
            f"stragglerkit is not initialised for {which}: call stragglerkit.init("
            f"{'' if group is None else 'group=group'}) on every rank of it first (a collective call)"
        )
    return session


def create(group: dist.ProcessGroup | None, config: Config) -> Session:
    """Set up ``group`` (collective: every rank of it calls this with the same configuration)."""
    resolved = _resolve(group)
    if not isinstance(config, Config):
        refuse(group, ConfigError(f"config must be a stragglerkit.Config, got {type(config).__name__}"))
    existing = _SESSIONS.get(id(resolved))
    if existing is not None and existing.group is resolved:
        raise ConfigError(
            "stragglerkit.init was already called for this group; call stragglerkit.destroy(group) "
            "first to initialise it again with another configuration"
        )
    if resolved.rank() == 0:  # once, not once per rank
        for name, close in unknown_variables():
            hint = f" (did you mean {close}?)" if close else ""
            warnings.warn(f"{name} is not a stragglerkit setting{hint}; it has no effect", UserWarning, stacklevel=3)
    timeout = datetime.timedelta(seconds=config.executor.timeout)
    side = gloo_group_over(resolved, timeout)
    if resolved.size() > 1:
        _check_same_config(side, config)
    allreduce_group = resolved
    if dist.get_backend(resolved) == "gloo":
        allreduce_group = gloo_group_over(resolved, timeout)
    runtime = Runtime(resolved, config)
    offsets = estimate_clock_offsets(side) if resolved.size() > 1 else ClockOffsets.zero(1)
    session = Session(resolved, config, runtime, side, allreduce_group, offsets)
    _SESSIONS[id(resolved)] = session
    return session


def refuse(group: dist.ProcessGroup | None, error: ConfigError) -> NoReturn:
    """:func:`create`'s collective steps on a rank whose configuration is bad (``error``): the
    other ranks, which are in :func:`create`, raise a :class:`ConfigError` naming this rank instead
    of waiting for it; this rank raises the same."""
    resolved = _resolve(group)
    if resolved.size() == 1:
        raise error
    side = gloo_group_over(resolved, datetime.timedelta(seconds=Config().executor.timeout))
    _check_same_config(side, None, str(error))
    raise error  # not reached: the check raises on every rank


def destroy(group: dist.ProcessGroup | None = None) -> None:
    """Forget ``group``'s session (not collective; call before ``dist.destroy_process_group``)."""
    if not dist.is_initialized():
        _SESSIONS.clear()
        return
    session = _SESSIONS.pop(id(_resolve(group)), None)
    if session is not None:
        session.runtime.close()


def _check_same_config(side: dist.ProcessGroup, config: Config | None, error: str | None = None) -> None:
    """Collective: raise the same :class:`ConfigError` on every rank if a rank's configuration was
    bad (``error``, with ``config`` None) or the ranks' configurations differ in a field that
    decides what they send."""
    mine: dict[str, Any] = {"error": error}
    if config is not None:
        mine = {name: values for name, values in config.to_dict().items() if name not in _NOT_AGREED}
    everyone: list[dict[str, Any] | None] = [None] * side.size()
    dist.all_gather_object(everyone, mine, group=side)
    bad = [f"on rank {rank}: {theirs['error']}" for rank, theirs in enumerate(everyone) if theirs and "error" in theirs]
    if bad:
        raise ConfigError(
            "stragglerkit.init: a rank's configuration is bad, "
            + " | ".join(bad)
            + "; give every rank a valid configuration (the same file and STRAGGLERKIT_* variables)"
        )
    problems = []
    for section, values in mine.items():
        for key in values:
            by_value: dict[str, list[int]] = {}
            for rank, theirs in enumerate(everyone):
                value = (theirs or {}).get(section, {}).get(key)
                by_value.setdefault(repr(value), []).append(rank)
            if len(by_value) > 1:
                listed = "; ".join(f"{value} on rank(s) {', '.join(map(str, r))}" for value, r in by_value.items())
                problems.append(f"{section}.{key} differs ({listed})")
    if problems:
        raise ConfigError(
            "stragglerkit.init: the ranks' configurations differ: "
            + " | ".join(problems)
            + "; give every rank the same configuration (the same file and STRAGGLERKIT_* variables)"
        )

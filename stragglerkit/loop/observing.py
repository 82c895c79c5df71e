"""Whether the closed loop switches plans or observes only, and saying so.

``Config.detection.act`` and the session's backend decide it
(:func:`~stragglerkit.detect.settings.act_decision`): where the loop may not switch (``never``, or
``auto`` on a backend where stragglerkit's executor is not proven) every bucket takes the
baseline's path and no probe runs, while the controller still detects and reports.
:func:`act_on` puts a bound loop in that mode (every rank alike), and :func:`say_observing` tells
of it once: an ``observing`` event on every rank and a warning on rank 0.

Example::

    acting = act_decision(loop.settings.detection.act, session.backend)
    act_on(loop, acting)
    if not acting.acts:
        say_observing(loop, acting.reason, session.backend)
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from stragglerkit.detect.probe_schedule import ProbeSchedule
from stragglerkit.detect.settings import ActDecision
from stragglerkit.errors import ConfigError
from stragglerkit.plans import Decision, Plan

if TYPE_CHECKING:
    from stragglerkit.loop.loop import StragglerLoop

__all__ = ["act_on", "say_observing"]


def act_on(loop: StragglerLoop, acting: ActDecision) -> None:
    """Switch plans or observe only, as ``acting`` says (every rank alike: the same
    configuration and backend). A loop restored onto a group where the answer differs from
    its checkpoint's starts its probe intervals afresh, and one that now observes goes back to
    the baseline."""
    settings = loop.settings
    if not acting.acts and settings.baseline != "allreduce":
        raise ConfigError(
            f"the loop's baseline is stragglerkit's {settings.baseline} (Settings.baseline), which runs "
            f"stragglerkit's executor on every bucket, but it observes only here: {acting.reason}"
        )
    if acting.acts == settings.acting:
        return
    settings.acting = acting.acts  # the one object the controller and its components hold
    controller = loop.controller
    controller.probes = ProbeSchedule(settings)
    baseline = Plan(settings.baseline)
    if not acting.acts and controller.plan != baseline:
        controller.apply(Decision(0, loop._step, baseline, [], settings.probe_every))
    pending = loop.exchange.decision_in_flight  # rank 0's, not shipped before the checkpoint
    if not acting.acts and pending is not None and pending.plan != baseline:
        loop.exchange.decision_in_flight = None


def say_observing(loop: StragglerLoop, reason: str, backend: str) -> None:
    """Once per loop (not again for a restored one that said so already): an ``observing``
    event on every rank, and a warning on rank 0."""
    said = any(e.get("kind") == "observing" and e["evidence"].get("reason") == reason for e in loop.events)
    if not said:
        event = {
            "step": loop._step,
            "kind": "observing",
            "algorithm": loop.settings.baseline,
            "evidence": {"act": loop.settings.detection.act, "backend": backend, "reason": reason},
        }
        loop.controller.events.append(event)
        loop._sinks.add(event)
    if loop.rank == 0:
        warnings.warn(f"stragglerkit observes only: {reason}", UserWarning, stacklevel=4)

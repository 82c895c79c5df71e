"""What a checkpoint keeps of the controller, and how a pickled one is read back.

:func:`controller_state` is :meth:`Controller.__getstate__`'s dict: every slot but the restored
event log, the outbox as a list, and the state's ``version``. :func:`restore` sets a controller's
slots from such a dict, also as an earlier version pickled it (no ``version``: the components
shared one set of attributes and the settings were a ``ControllerConfig``, see
:mod:`stragglerkit.detect.legacy`); a restored controller takes no records until the loop says so.

Example::

    state = controller_state(controller)      # what pickle stores
    restore(Controller.__new__(Controller), state, Controller.__slots__)
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from stragglerkit.detect import legacy
from stragglerkit.detect.probe_schedule import ProbeSchedule
from stragglerkit.detect.verification import SwitchVerifier

if TYPE_CHECKING:
    from stragglerkit.detect.controller import Controller
    from stragglerkit.detect.detector import Detector

__all__ = ["STATE_VERSION", "controller_state", "restore"]

STATE_VERSION = 2
"""Of :func:`controller_state`'s dict; a state without one is an earlier version's slots."""


def controller_state(controller: Controller) -> dict[str, Any]:
    """The controller's checkpoint state (:meth:`Controller.__getstate__`)."""
    state = {name: getattr(controller, name) for name in controller.__slots__ if name != "restored_records"}
    state["outbox"] = list(controller.outbox)
    state["version"] = STATE_VERSION
    return state


def restore(controller: Controller, state: Any, slot_names: tuple[str, ...]) -> None:
    """Set ``controller``'s slots (``slot_names``: the controller's) from ``state``
    (:meth:`Controller.__setstate__`)."""
    slots = legacy.restore_slots(controller, state)
    if slots.pop("version", None) != STATE_VERSION:
        slots = _from_version_1(slots, slot_names)
    slots["outbox"] = deque(slots.get("outbox", ()))
    slots.setdefault("restored_records", None)
    slots.setdefault("_would_run", None)
    slots["records_wanted"] = False
    for name, value in slots.items():
        setattr(controller, name, value)


_PROBE_SLOTS = (
    "probe_every",
    "exchange_every",
    "_probe_target",
    "_probe_event",
    "_probe_maxima",
    "_plain_tails",
    "_tail_reference",
    "_tail_medians",
    "_quiet_since",
    "_checking",
    "_plan_checking",
    "_exchange_target",
    "_exchange_event",
    "_last_doubt",
)
_VERIFIER_SLOTS = ("_step_times", "_periods", "_ends", "_blocked", "_verify")


def _from_version_1(slots: dict[str, Any], slot_names: tuple[str, ...]) -> dict[str, Any]:
    """A controller pickled by an earlier version, whose parts shared one set of attributes:
    each component gets its own, the settings come from its ``ControllerConfig``."""
    settings = slots.pop("config").settings()
    detector: Detector = slots["detector"]
    detector.settings = settings
    probes = ProbeSchedule.__new__(ProbeSchedule)
    probes.__setstate__({"settings": settings, **{name: slots.pop(name) for name in _PROBE_SLOTS if name in slots}})
    verifier = SwitchVerifier.__new__(SwitchVerifier)
    verifier.__setstate__(
        {"settings": settings, **{name: slots.pop(name) for name in _VERIFIER_SLOTS if name in slots}}
    )
    records = slots.pop("records", None)
    return {
        **{name: slots[name] for name in slot_names if name in slots},
        "settings": settings,
        "probes": probes,
        "verifier": verifier,
        "outbox": [],  # what its log had queued stays queued in it
        "restored_records": records,
    }


"""The emulated cluster's link changes during a training run, served from outside the namespaces.

Rank 0 writes a request file in the control folder at the step of a change
(:func:`~profiling.lab.copies.control_files`); :class:`Reshaper`, on a thread of the launcher
(:mod:`.train`), reshapes the hosts' links, verifies the new rates, and answers.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["Reshaper"]


class Reshaper:
    """Waits (on a thread) for rank 0's requests: degrades the hosts' links, verified, and with
    ``again`` changes them at a second request (``{rank: l}``: l = 1 restores a NIC), verified too."""

    def __init__(
        self, cluster: Any, degrade: dict[int, float], control: Path, again: dict[int, float] | None = None
    ) -> None:
        self.cluster = cluster
        self.degrade = degrade
        self.control = control
        self.again = again
        self.measured: dict[str, list[Any]] = {"degraded_links": []}
        """Each link change's verified (send, receive) rates, under the key it is reported as."""
        if again is not None:
            self.measured[self._again_key] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="stragglerkit-reshape", daemon=True)

    def __enter__(self) -> Reshaper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    @property
    def _again_key(self) -> str:
        healthy = self.again is not None and all(v == 1.0 for v in self.again.values())
        return "recovered_links" if healthy else "reshaped_links"

    def _serve(self) -> None:
        from profiling.lab.copies import RESHAPE, RESHAPE_AGAIN, control_files
        from stragglerkit.testbed import NicDegradation

        phases = [(RESHAPE, self.degrade, "degraded_links")]
        if self.again is not None:
            phases.append((RESHAPE_AGAIN, self.again, self._again_key))
        for phase, slowdowns, key in phases:
            request, done, failed = control_files(phase)
            while not (self.control / request).exists():
                if self._stop.wait(0.05):
                    return
            try:
                rates = NicDegradation(slowdowns).apply(self.cluster, verify=True)
                measured = [[r.to_dict() for r in pair] for pair in rates if isinstance(pair, tuple)]
                self.measured[key] = measured
                answer, text = done, json.dumps({key: measured})
            except Exception as err:  # the rank raises it with this text
                answer, text = failed, f"{type(err).__name__}: {err}"
            (self.control / (answer + ".tmp")).write_text(text, encoding="utf-8")
            os.replace(self.control / (answer + ".tmp"), self.control / answer)
            if answer == failed:
                return

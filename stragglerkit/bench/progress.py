"""Progress of a long run: a tqdm bar on a terminal, plain lines anywhere else (CI logs, files).

A bar redraws one line with carriage returns, which a log file keeps as one long garbled line;
so the bar is drawn only when the stream is a terminal (and tqdm is installed). Otherwise every
status that the bar would show becomes a plain line, ``<prefix>: <message>``, as the bench always
printed them. Notes (events, calibrations) are lines in both cases, printed above the bar.

Example::

    progress = Progress(total=120, prefix="train", unit="step")
    progress.note("delay auto = 2 x pre-phase 12.0 ms = 24.0 ms")
    progress.advance(10, "step 10/120: plain 31.0 ms, hooked 22.5 ms")
    progress.close()
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["Progress", "is_terminal"]


def is_terminal(stream: Any) -> bool:
    """Is ``stream`` a terminal (where a redrawn bar reads well)?"""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """A bar over ``total`` units on a terminal, plain lines elsewhere (see the module docstring).

    ``enabled=False`` prints nothing at all (the ranks other than the one that reports);
    ``bar=None`` draws a bar exactly when ``stream`` is a terminal. ``prefix`` starts every plain
    line (``""``: none) and names the bar unless ``desc`` does.
    """

    __slots__ = ("_bar", "enabled", "prefix", "stream")

    def __init__(
        self,
        total: int,
        prefix: str,
        *,
        unit: str = "step",
        enabled: bool = True,
        stream: TextIO | None = None,
        bar: bool | None = None,
        desc: str | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.prefix = prefix
        self.enabled = enabled
        self._bar: Any = None
        if enabled and (is_terminal(self.stream) if bar is None else bar):
            try:
                from tqdm import tqdm
            except ImportError:  # plain lines, as without a terminal
                return
            name = prefix if desc is None else desc
            self._bar = tqdm(total=total, desc=name, unit=unit, file=self.stream, dynamic_ncols=True, leave=True)

    @property
    def drawing(self) -> bool:
        """Is a bar drawn (else statuses are plain lines)?"""
        return self._bar is not None

    def note(self, message: str) -> None:
        """A line that stays: above the bar, or plain."""
        if not self.enabled:
            return
        line = self._line(message)
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def advance(self, units: int = 0, status: str | None = None) -> None:
        """``units`` more done; ``status`` shown next to the bar, or printed as a line without one."""
        if not self.enabled:
            return
        if self._bar is None:
            if status is not None:
                print(self._line(status), file=self.stream, flush=True)
            return
        if status is not None:
            self._bar.set_postfix_str(status, refresh=False)
        self._bar.update(units)

    def _line(self, message: str) -> str:
        return f"{self.prefix}: {message}" if self.prefix else message

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

"""Weights & Biases: the closed loop's measurements and decisions in the user's own W&B run.

``Config.report.wandb`` (``STRAGGLERKIT_WANDB``): ``auto`` (the default) logs when the training
script has imported ``wandb`` and a run is active (``wandb.run``), ``true`` asks for it (a
:class:`~stragglerkit.ConfigError` naming ``pip install wandb`` when it is missing, a warning once
while no run is active), ``false`` never touches W&B. Only rank 0 of the loop's group logs, from
the records of :mod:`stragglerkit.telemetry.records`: nothing is measured for W&B alone.

**What is logged.** One history row per training step, from each exchange's ``window`` record:
``stragglerkit/step`` (the loop's step: every ``stragglerkit/*`` chart uses it as its x axis,
through ``define_metric``), ``stragglerkit/allreduce_s`` (last arrival to last finish),
``stragglerkit/predicted_s`` (the cost model's figure for it), ``stragglerkit/algorithm`` (the
step's algorithm as text) with ``stragglerkit/algorithm_code`` (its index in
:data:`~stragglerkit.plans.ALGORITHM_CODES`, a number that charts, so a switch shows as
a step in the line), and per rank ``stragglerkit/lateness_s/rankR``,
``stragglerkit/nic_rate_Bps/rankR`` and ``stragglerkit/slowdown/rankR``. Every decision goes into
one table, ``stragglerkit/events`` (step, kind, algorithm, evidence as JSON), logged again with
each new decision: a table panel lists every detection, switch and rollback with its evidence,
sortable by step, where a text key would show only its latest value (W&B charts no strings) and
``wandb.termlog`` lines would be buried in the run's console output.

**Not fighting the user's own ``wandb.log``.** W&B writes history rows in order, one "current"
row at a time; a library that commits rows of its own moves ``run.step`` on, and a script that
logs with ``step=`` its own counter then has its rows refused as going back in time. So this
logger never commits: each row is added to the user's current row (``commit=False``) and goes
out with the user's next ``wandb.log``, at most one of ours per user row (``run.step`` tells
when the user moved on). The rows of an exchange arrive together every ``K`` steps and are fed
one per user row, so a script that logs once a step gets every step's row, ``K`` steps late; one
that logs less often gets the newest rows (at most :data:`ROWS_KEPT` wait). Rows still waiting
when the loop closes are dropped, all but the newest.

**The report's figures at the end.** When the loop closes (``loop.close()``; ``DDPState.close``,
the optimizer wrap's ``optimizer.close()`` and the Megatron adapter's ``state.close`` call it),
the logger draws the figures of ``stragglerkit report`` (:mod:`stragglerkit.report.plots`, installed
by :func:`set_figure_drawer`) from
the records it was given (the newest :data:`RECORDS_KEPT`) and logs them as ``wandb.Image`` under
``stragglerkit/report/<figure>``, with the PNG files in the run's ``files/stragglerkit-report``.

Example::

    wandb.init(project="llama-ft")                # rank 0, before training
    state = stragglerkit.DDPState(None)           # report.wandb = auto: logs into that run
    ...
    log_figures(["report/delay_cdf.png"])         # the report's plots, as wandb.Image
"""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from stragglerkit.errors import ConfigError
from stragglerkit.plans import ALGORITHM_CODES

__all__ = [
    "PREFIX",
    "ROWS_KEPT",
    "STEP_METRIC",
    "FigureDrawer",
    "WandbLogger",
    "available",
    "log_figures",
    "rows",
    "set_figure_drawer",
    "wandb_logger",
]

PREFIX = "stragglerkit"
STEP_METRIC = f"{PREFIX}/step"
RECORDS_KEPT = 20_000
"""How many records (windows and decisions, one window per exchange) the figures at the end are
drawn from: the newest; at one window per 6 steps, the last 120,000 steps."""
ROWS_KEPT = 256
"""Rows waiting for the user's next ``wandb.log`` at most; older ones are dropped first."""
EVENT_COLUMNS = ("step", "kind", "algorithm", "evidence")
_INSTALL = "pip install wandb"


def available() -> bool:
    """Is ``wandb`` installed (without importing it)?"""
    return "wandb" in sys.modules or importlib.util.find_spec("wandb") is not None


def _module(required: bool) -> Any:
    """``wandb``: imported (``required``), or only if the script imported it already (auto)."""
    if not required:
        return sys.modules.get("wandb")
    try:
        import wandb
    except ImportError as err:
        raise ConfigError(f"report.wandb is on but wandb cannot be imported ({err}): {_INSTALL}") from None
    return wandb


def wandb_logger(setting: bool | None) -> WandbLogger | None:
    """The logger for ``report.wandb`` (``None``: off). ``True`` imports wandb now."""
    if setting is False:
        return None
    if setting is True:
        _module(True)
    return WandbLogger(required=setting is True)


def _headline(algorithms: Sequence[str]) -> str | None:
    """A step's algorithm: a straggler-aware one if any bucket ran it, else the most common."""
    ran = [a for a in algorithms if a]
    if not ran:
        return None
    special = [a for a in ran if a in ("stragglar", "optcc", "balanced_ring")]
    return special[0] if special else Counter(ran).most_common(1)[0][0]


def rows(window: dict[str, Any]) -> list[dict[str, Any]]:
    """One W&B history row per step of a ``window`` record (unknown figures left out).

    Example::

        rows({"kind": "window", "steps": [10], "allreduce_s": [0.01], ...})[0]["stragglerkit/allreduce_s"]
    """
    out = []
    per_rank = (
        ("nic_rate_Bps", window.get("nic_rate_Bps") or []),
        ("slowdown", window.get("slowdown") or []),
    )
    for i, step in enumerate(window["steps"]):
        row: dict[str, Any] = {STEP_METRIC: step}
        for key in ("allreduce_s", "predicted_s"):
            values = window.get(key) or []
            if i < len(values) and values[i] is not None:
                row[f"{PREFIX}/{key}"] = values[i]
        algorithms = window.get("algorithms") or []
        algorithm = _headline(algorithms[i]) if i < len(algorithms) else None
        if algorithm is not None:
            row[f"{PREFIX}/algorithm"] = algorithm
            if algorithm in ALGORITHM_CODES:
                row[f"{PREFIX}/algorithm_code"] = ALGORITHM_CODES.index(algorithm)
        lateness = window.get("lateness_s") or []
        for rank, value in enumerate(lateness[i] if i < len(lateness) else []):
            if value is not None:
                row[f"{PREFIX}/lateness_s/rank{rank}"] = value
        for name, values in per_rank:
            for rank, value in enumerate(values):
                if value is not None:
                    row[f"{PREFIX}/{name}/rank{rank}"] = value
        out.append(row)
    return out


class WandbLogger:
    """Rank 0's W&B side of the loop: takes records (:meth:`add`), feeds rows (:meth:`pump`).

    Called from the loop's thread only (the records are flushed there). Not saved with the loop.

    Example::

        logger = WandbLogger(required=False)
        logger.add(window_record)       # as the loop flushes its records
        logger.pump()                   # once per step
    """

    __slots__ = ("_defined", "_events", "_records", "_rows", "_seen", "_warned", "required")

    def __init__(self, required: bool = False) -> None:
        self.required = required
        """``report.wandb`` is ``true``: wandb was imported, and a missing run is worth a warning."""
        self._rows: deque[dict[str, Any]] = deque(maxlen=ROWS_KEPT)
        self._events: list[list[Any]] = []
        self._records: deque[dict[str, Any]] = deque(maxlen=RECORDS_KEPT)
        """The records the figures at :meth:`close` are drawn from (the first ``run`` header kept apart)."""
        self._seen: tuple[int, int] | None = None
        """(id of the run, its step) when the last row was added: one row per user row."""
        self._defined: int | None = None
        self._warned = False

    def run(self) -> Any:
        """The active W&B run, or ``None``."""
        module = _module(False)
        run = getattr(module, "run", None) if module is not None else None
        if run is None and self.required and not self._warned:
            self._warned = True
            warnings.warn(
                "stragglerkit: report.wandb is on but no wandb run is active; call wandb.init() on rank 0 "
                "before training (stragglerkit logs into that run)",
                UserWarning,
                stacklevel=3,
            )
        return run

    @property
    def active(self) -> bool:
        """Is there a run to log into (so records are worth building)?"""
        return self.run() is not None

    def _define(self, run: Any) -> None:
        if self._defined != id(run):
            run.define_metric(STEP_METRIC)
            run.define_metric(f"{PREFIX}/*", step_metric=STEP_METRIC)
            self._defined = id(run)

    def add(self, record: dict[str, Any]) -> None:
        """A record as the loop writes it: a ``window`` becomes rows, a decision a table row."""
        kind = record.get("kind")
        if kind == "run":
            self._records.clear()  # a new run section: its figures start afresh
        self._records.append(record)
        if kind == "window":
            self._rows.extend(rows(record))
        elif kind != "run":
            self._events.append(
                [record.get("step"), kind, record.get("algorithm"), json.dumps(record.get("evidence", {}), default=str)]
            )
            self._log_events()

    def _log_events(self) -> None:
        run = self.run()
        if run is None:
            return
        module = _module(False)
        self._define(run)
        table = module.Table(columns=list(EVENT_COLUMNS), data=[list(row) for row in self._events])
        run.log({f"{PREFIX}/events": table}, commit=False)

    def pump(self) -> None:
        """Add one waiting row to the user's current row if the user moved on since the last one."""
        if not self._rows:
            return
        run = self.run()
        if run is None:
            return
        mark = (id(run), int(run.step))
        if mark == self._seen:
            return
        self._define(run)
        run.log(self._rows.popleft(), commit=False)
        self._seen = mark

    def close(self) -> None:
        """The loop ends: the newest waiting row goes into the current user row, the rest are
        dropped, and the report's figures of the run are logged as images."""
        run = self.run()
        if run is not None and self._rows:
            self._define(run)
            run.log(self._rows[-1], commit=False)
        self._rows.clear()
        if run is not None and any(r.get("kind") == "window" for r in self._records):
            try:
                self._log_report(run)
            except Exception as err:  # the training is over; its figures are not worth failing it for
                warnings.warn(f"stragglerkit: could not log the report's figures to W&B: {err!r}", stacklevel=3)
        self._records.clear()

    def _log_report(self, run: Any) -> list[str]:
        """Draw the report's figures from the kept records into the run's files; log them."""
        folder = Path(run.dir) / "stragglerkit-report"
        folder.mkdir(parents=True, exist_ok=True)
        log = folder / "events.rank0.jsonl"
        log.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in self._records), encoding="utf-8")
        if _draw_figures is None:  # no report installed its figures: the event log alone
            return []
        paths = []
        for name, png in _draw_figures(log):
            path = folder / f"{name}.png"
            path.write_bytes(png)
            paths.append(path)
        return log_figures(paths, run=run) if paths else []


FigureDrawer = Callable[[Path], list[tuple[str, bytes]]]
"""Draws the report's figures from an event log: ``(name, PNG bytes)`` per figure."""
_draw_figures: FigureDrawer | None = None


def set_figure_drawer(draw: FigureDrawer | None) -> FigureDrawer | None:
    """Install what draws the report's figures at :meth:`WandbLogger.close` (the offline report
    lives above this layer; :mod:`stragglerkit` installs ``stragglerkit.report``'s); returns the
    one installed before."""
    global _draw_figures
    previous, _draw_figures = _draw_figures, draw
    return previous


def log_figures(paths: Iterable[str | Path], *, run: Any = None, prefix: str = f"{PREFIX}/report") -> list[str]:
    """Log PNG files as ``wandb.Image`` into ``run`` (default: the active run) under
    ``prefix/<file stem>``, without committing a row of their own; the keys logged.

    Example::

        log_figures(["report/delay_cdf.png", "report/allreduce_time.png"])
    """
    module = _module(True)
    target = run if run is not None else getattr(module, "run", None)
    if target is None:
        raise ConfigError("no wandb run is active: call wandb.init() first, or pass run=")
    images: dict[str, Any] = {}
    for path in paths:
        file = Path(path)
        if file.suffix.lower() != ".png":
            raise ConfigError(f"{file}: log_figures takes PNG files; give the report's .png plots")
        if not file.is_file():
            raise ConfigError(f"{file} does not exist: write the report first (stragglerkit report)")
        images[f"{prefix}/{file.stem}"] = module.Image(str(file))
    if images:
        target.log(images, commit=False)
    return list(images)

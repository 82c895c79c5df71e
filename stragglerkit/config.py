"""``stragglerkit.Config``: the one configuration of the library, in five sections.

Every setting a user would plausibly change lives here, with its default (the measured best) and a
docstring saying what it does. The whole of it loads from a YAML file (``configs/`` ships
presets), and a handful of environment variables let operators override single fields per job
(:data:`ENVIRONMENT`; docs/configuration.md has the table). Every rank must use the same
configuration: :func:`stragglerkit.init` checks that collectively and names the ranks that differ.

Everything else the library does is decided by measurement and fixed in the code: the internal
constants live in :mod:`stragglerkit.defaults`, each with the reason for its value; they are not
configuration.

Example::

    import stragglerkit
    config = stragglerkit.Config.from_yaml("configs/long_job.yaml")
    config = config.replace(executor={"timeout": 600.0})
    stragglerkit.init(config=config)
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

from stragglerkit.defaults import CLEAR_DEGRADED, CLEAR_FRACTION
from stragglerkit.errors import ConfigError
from stragglerkit.units import parse_size, parse_switch

__all__ = [
    "ACT_CHOICES",
    "ENVIRONMENT",
    "Config",
    "DetectionConfig",
    "EnvironmentVariable",
    "ExecutorConfig",
    "OptCCConfig",
    "ReportConfig",
    "SyncConfig",
    "restore_fields",
]

MiB = 1024 * 1024
KiB = 1024
SMALLEST_SEND_BUFFER = 8192
"""Linux doubles a socket's send buffer and keeps at least a few pages; below this a bound means nothing."""


def restore_fields(obj: Any, state: Any) -> None:
    """Unpickle the slotted dataclass ``obj`` from ``state`` (``(None, slots)``, as a slotted
    object pickles by default, or a dict), also as a checkpoint written before a field existed:
    that field gets its default. A slotted dataclass's ``__setstate__``."""
    if isinstance(state, tuple):
        state = {**(state[0] or {}), **(state[1] or {})}
    for f in dataclasses.fields(obj):
        if f.name in state:
            value = state[f.name]
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        elif f.default is not dataclasses.MISSING:
            value = f.default
        else:
            continue  # no default to give: left unset, as the default unpickling would
        object.__setattr__(obj, f.name, value)


def _send_buffer(section: str, name: str, value: object) -> int | None:
    """A send-buffer bound: bytes (int or a size such as ``"1MiB"``), or ``None``/``"off"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"{section}.{name}: give a size such as 1MiB or off, got {value!r}")
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("off", "none", "kernel"):
            return None
        try:
            value = parse_size(text)
        except ValueError as err:
            raise ConfigError(f"{section}.{name}: {err}; give a size such as 1MiB, or off") from None
    if not isinstance(value, int) or value < SMALLEST_SEND_BUFFER:
        raise ConfigError(f"{section}.{name} must be at least {SMALLEST_SEND_BUFFER} bytes (or off), got {value!r}")
    return value


@dataclass(kw_only=True, slots=True)
class ExecutorConfig:
    """How the executor runs a plan over the process group."""

    timeout: float = 300.0
    """Seconds a rank waits for a peer before the call fails with a :class:`~stragglerkit.PeerError`
    naming it. Also the timeout of the side groups :func:`stragglerkit.init` creates."""
    send_buffer: int | None = 1 * MiB
    """The most a TCP connection of stragglerkit's own gloo groups queues (bytes; ``None`` or
    ``"off"``: the kernel's default, about 4 MiB). A bounded queue keeps a send from finishing long
    before its bytes left the host, so the plan's timing holds; 1 MiB measured best for training
    steps at 1 Gbit/s. Lower it (256 KiB) on links of a few hundred Mbit/s. Any gloo group gets
    the runtime's own connections (the user's group is never rebound); NCCL groups are used as they are."""

    def __post_init__(self) -> None:
        if not (isinstance(self.timeout, int | float) and self.timeout > 0):
            raise ConfigError(f"executor.timeout must be positive seconds, got {self.timeout!r}")
        self.timeout = float(self.timeout)
        self.send_buffer = _send_buffer("executor", "send_buffer", self.send_buffer)


@dataclass(kw_only=True, slots=True)
class OptCCConfig:
    """OptCC, the pipeline for degraded NICs."""

    send_buffer: int | None = 128 * KiB
    """The send-buffer bound of the runtime's connections while an OptCC plan runs (bytes; ``None``:
    ``executor.send_buffer``). OptCC's linear-programmed chunk sizes balance its paths only if a
    send holds its link about as long as the timetable has it, which needs a short queue."""

    def __post_init__(self) -> None:
        self.send_buffer = _send_buffer("optcc", "send_buffer", self.send_buffer)


ACT_CHOICES: dict[str, str] = {
    "auto": "switch where stragglerkit's executor is proven (gloo process groups), observe only elsewhere (NCCL)",
    "always": "switch on every backend, NCCL included",
    "never": "observe only on every backend: detect, report and log, never switch, run no probes",
}
"""What ``DetectionConfig.act`` may be, and what each does."""


@dataclass(kw_only=True, slots=True)
class DetectionConfig:
    """The closed loop: when a rank counts as a persistent straggler or degraded, and how a switch is judged.

    A straggler that appears at step ``s`` is acted on at about ``s + window x late_fraction +
    confirm x exchange_every``; docs/detection.md derives it.
    """

    warmup_steps: int = 10
    """Steps run with the process group's own AllReduce before any plan (the first steps are slow anyway)."""
    window: int = 16
    """W: the steps the detector looks back over."""
    late_fraction: float = 0.75
    """q: a rank is a persistent straggler when it arrived last in at least this fraction of the window
    (and its delay is large enough for StragglAR to pay, by the cost model)."""
    confirm: int = 2
    """Consecutive exchanges that must agree before acting (hysteresis against flapping)."""
    degraded_threshold: float = 1.5
    """A rank's NIC counts as degraded when its measured slowdown l (healthy time / its time) is above this."""
    exchange_every: int = 2
    """K: steps between the small stats exchanges (gather to rank 0, broadcast of its decision) while
    anything is in question."""
    quiet_exchange_every: int = 6
    """The exchange interval once all is quiet (0: never lengthen). Up to about
    ``(late_fraction - 0.4) x window`` a straggler appearing while quiet is acted on at most one
    ``exchange_every`` later than without it."""
    probe_every: int = 8
    """Every this many steps the largest bucket runs stragglerkit's ring, whose per-link timings measure
    each NIC (0: no probes; degraded NICs are then found from sysfs link speeds only). Backs off 8x
    once the links prove healthy."""
    min_gain: float = 0.05
    """A plan must be predicted to save at least this fraction of the baseline's AllReduce time."""
    verify_steps: int = 8
    """Steps measured after a switch before judging it; a switch that did not pay is rolled back."""
    cooldown_steps: int = 200
    """A rolled-back plan is not tried again for this many steps."""
    act: str = "auto"
    """Whether the loop may switch algorithms or only observe: ``"auto"`` switches where
    stragglerkit's executor is proven (gloo process groups) and observes elsewhere (NCCL);
    ``"always"`` switches on every backend (the opt-in for NCCL); ``"never"`` observes on every
    backend. Observing, the loop detects, reports and logs as it would acting, records the switch
    it would have made (``would_switch``), and every bucket runs the process group's own AllReduce
    or the framework's (no probes). ``stragglerkit.all_reduce`` calls are the user's own and not governed by it."""

    def __post_init__(self) -> None:
        if isinstance(self.act, str):
            self.act = self.act.strip().lower()
        if self.act not in ACT_CHOICES:
            raise ConfigError(
                f"detection.act must be one of {', '.join(ACT_CHOICES)}, got {self.act!r}: "
                + "; ".join(f"{name}: {what}" for name, what in ACT_CHOICES.items())
            )
        for name in (
            "warmup_steps",
            "window",
            "confirm",
            "exchange_every",
            "quiet_exchange_every",
            "probe_every",
            "verify_steps",
            "cooldown_steps",
        ):
            value = getattr(self, name)
            least = 1 if name in ("confirm", "exchange_every", "verify_steps") else 2 if name == "window" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"detection.{name} must be an integer >= {least}, got {value!r}")
        if not (isinstance(self.late_fraction, int | float) and CLEAR_FRACTION < self.late_fraction <= 1):
            raise ConfigError(
                f"detection.late_fraction must be above {CLEAR_FRACTION} (below it a straggler counts as gone "
                f"again) and at most 1, got {self.late_fraction!r}"
            )
        if not (isinstance(self.degraded_threshold, int | float) and self.degraded_threshold >= CLEAR_DEGRADED):
            raise ConfigError(
                f"detection.degraded_threshold must be at least {CLEAR_DEGRADED} (below it a NIC counts as "
                f"recovered), got {self.degraded_threshold!r}"
            )
        if not (isinstance(self.min_gain, int | float) and 0 <= self.min_gain < 1):
            raise ConfigError(f"detection.min_gain must be a fraction in [0, 1), got {self.min_gain!r}")
        if self.quiet_exchange_every and self.quiet_exchange_every < self.exchange_every:
            raise ConfigError(
                f"detection.quiet_exchange_every ({self.quiet_exchange_every}) must be at least exchange_every "
                f"({self.exchange_every}), or 0 to never lengthen the interval"
            )

    def __setstate__(self, state: Any) -> None:
        restore_fields(self, state)


@dataclass(kw_only=True, slots=True)
class ReportConfig:
    """What the library records for people."""

    event_log: str | None = None
    """JSONL file of the closed loop's records (a run header, the decisions with their evidence and,
    from rank 0, each stats exchange's per-step measurements; docs/event_log.md), written by rank 0;
    a path containing ``{rank}`` is written by every rank."""
    nvtx: bool | None = None
    """NVTX ranges around every AllReduce, phase and round: ``None`` (on when a profiler such as nsys
    is attached), ``True`` or ``False``."""
    wandb: bool | None = None
    """Weights & Biases logging on rank 0 (per-step AllReduce time, lateness and NIC rate per rank,
    every decision): ``None`` (auto: when the script imported wandb and ``wandb.run`` is active),
    ``True`` (needs ``pip install wandb``) or ``False``."""

    def __post_init__(self) -> None:
        if self.event_log is not None and not isinstance(self.event_log, str | os.PathLike):
            raise ConfigError(f"report.event_log must be a path, got {self.event_log!r}")
        if self.event_log is not None:
            self.event_log = os.fspath(self.event_log)
        if isinstance(self.nvtx, str):
            switch = parse_switch(self.nvtx)
            if switch is None and self.nvtx.strip().lower() != "auto":
                raise ConfigError(f"report.nvtx must be true, false or auto, got {self.nvtx!r}")
            self.nvtx = switch
        if self.nvtx is not None and not isinstance(self.nvtx, bool):
            raise ConfigError(f"report.nvtx must be true, false or auto (null), got {self.nvtx!r}")
        if isinstance(self.wandb, str):
            switch = parse_switch(self.wandb)
            if switch is None and self.wandb.strip().lower() != "auto":
                raise ConfigError(f"report.wandb must be true, false or auto, got {self.wandb!r}")
            self.wandb = switch
        if self.wandb is not None and not isinstance(self.wandb, bool):
            raise ConfigError(f"report.wandb must be true, false or auto (null), got {self.wandb!r}")
        if self.wandb is True:
            import importlib.util
            import sys

            if "wandb" not in sys.modules and importlib.util.find_spec("wandb") is None:
                raise ConfigError("report.wandb is true but wandb is not installed: pip install wandb (or set auto)")


@dataclass(kw_only=True, slots=True)
class SyncConfig:
    """What training may compute: exact sums only, or also partial synchronisation."""

    partial: bool = False
    """Allow partial synchronisation (selective reduce and partial reduce,
    :mod:`stragglerkit.selective`): groups of ready ranks average their *models* instead of every
    rank summing every gradient, which changes what training computes (docs/selective.md). Off:
    only exact AllReduces run, and starting partial synchronisation is an error that says so.
    Nothing ever switches to it by itself."""

    def __post_init__(self) -> None:
        if isinstance(self.partial, str):
            switch = parse_switch(self.partial)
            if switch is None:
                raise ConfigError(f"sync.partial must be true or false, got {self.partial!r}")
            self.partial = switch
        if not isinstance(self.partial, bool):
            raise ConfigError(f"sync.partial must be true or false, got {self.partial!r}")


_SECTIONS: dict[str, type[Any]] = {
    "executor": ExecutorConfig,
    "optcc": OptCCConfig,
    "detection": DetectionConfig,
    "report": ReportConfig,
    "sync": SyncConfig,
}


@dataclass(frozen=True, slots=True)
class EnvironmentVariable:
    """An environment variable an operator may set per job, and the field it overrides."""

    name: str
    section: str
    field: str
    what: str


ENVIRONMENT: tuple[EnvironmentVariable, ...] = (
    EnvironmentVariable("STRAGGLERKIT_TIMEOUT", "executor", "timeout", "seconds before a silent peer is named"),
    EnvironmentVariable("STRAGGLERKIT_TCP_SEND_BUFFER", "executor", "send_buffer", "a size such as 256KiB, or off"),
    EnvironmentVariable("STRAGGLERKIT_OPTCC_SEND_BUFFER", "optcc", "send_buffer", "a size, or off"),
    EnvironmentVariable("STRAGGLERKIT_EVENT_LOG", "report", "event_log", "path of the decision log"),
    EnvironmentVariable("STRAGGLERKIT_NVTX", "report", "nvtx", "on, off or auto"),
    EnvironmentVariable("STRAGGLERKIT_WANDB", "report", "wandb", "on, off or auto"),
    EnvironmentVariable("STRAGGLERKIT_ACT", "detection", "act", "auto, always or never"),
)
"""The per-job overrides, applied over the configuration :func:`stragglerkit.init` receives.
``STRAGGLERKIT_CONFIG`` names a YAML file used when ``init`` gets no configuration."""

CONFIG_FILE_VARIABLE = "STRAGGLERKIT_CONFIG"
PREFIX = "STRAGGLERKIT_"


@dataclass(kw_only=True, slots=True)
class Config:
    """The whole configuration: ``executor``, ``optcc``, ``detection``, ``report`` and ``sync`` sections."""

    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    """How plans run: the peer timeout, the send-buffer bound."""
    optcc: OptCCConfig = field(default_factory=OptCCConfig)
    """OptCC's send-buffer bound."""
    detection: DetectionConfig = field(default_factory=DetectionConfig)
    """The closed loop's thresholds and intervals."""
    report: ReportConfig = field(default_factory=ReportConfig)
    """Event log, NVTX ranges, Weights & Biases."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """Whether partial synchronisation (selective reduce) is allowed; off by default."""

    SECTIONS: ClassVar[tuple[str, ...]] = tuple(_SECTIONS)

    def __post_init__(self) -> None:
        for name, kind in _SECTIONS.items():
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"Config.{name} must be a {kind.__name__}, got {type(getattr(self, name)).__name__}")

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "configuration") -> Config:
        """Build from nested mappings (``{"executor": {"timeout": 60}}``); unknown names are errors
        that suggest the closest known one."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
        sections: dict[str, Any] = {}
        for name, values in data.items():
            if name not in _SECTIONS:
                raise ConfigError(f"{source}: unknown section {name!r}{_did_you_mean(name, _SECTIONS)}")
            sections[name] = _section(_SECTIONS[name], name, values or {}, source)
        return cls(**sections)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> Config:
        """Load a YAML file of sections (see ``configs/default.yaml``)."""
        import yaml

        file = Path(path)
        if not file.is_file():
            raise ConfigError(f"configuration file {str(file)!r} does not exist")
        try:
            data = yaml.safe_load(file.read_text())
        except yaml.YAMLError as err:
            raise ConfigError(f"{file}: not valid YAML: {err}") from None
        return cls.from_dict(data or {}, source=str(file))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """The configuration a job gets without one in code: ``STRAGGLERKIT_CONFIG``'s file (or the
        defaults), with the environment's overrides applied."""
        env = os.environ if environ is None else environ
        path = env.get(CONFIG_FILE_VARIABLE, "").strip()
        return (cls.from_yaml(path) if path else cls()).with_env(env)

    def with_env(self, environ: Mapping[str, str] | None = None) -> Config:
        """A copy with the fields that :data:`ENVIRONMENT` variables set overridden."""
        env = os.environ if environ is None else environ
        changes: dict[str, dict[str, Any]] = {}
        for variable in ENVIRONMENT:
            text = env.get(variable.name, "").strip()
            if not text:
                continue
            try:
                value = _from_text(variable, text)
                changes.setdefault(variable.section, {})[variable.field] = value
                self.replace(**{variable.section: {variable.field: value}})
            except ConfigError as err:
                raise ConfigError(f"{variable.name}={text!r}: {err} ({variable.what})") from None
        return self.replace(**changes) if changes else self

    def replace(self, **sections: Mapping[str, Any]) -> Config:
        """A copy with some fields changed: ``config.replace(detection={"window": 32})``."""
        new: dict[str, Any] = {}
        for name, values in sections.items():
            if name not in _SECTIONS:
                raise ConfigError(f"unknown section {name!r}{_did_you_mean(name, _SECTIONS)}")
            current = dataclasses.asdict(getattr(self, name))
            for key in values:
                if key not in current:
                    raise ConfigError(f"{name} has no field {key!r}{_did_you_mean(key, current)}")
            new[name] = _section(_SECTIONS[name], name, {**current, **values}, "configuration")
        return dataclasses.replace(self, **new)

    # -- reading ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested data (what ``to_yaml`` writes and ``from_dict`` reads)."""
        return {name: dataclasses.asdict(getattr(self, name)) for name in _SECTIONS}

    def to_yaml(self) -> str:
        import yaml

        return str(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _section(kind: type[Any], name: str, values: object, source: str) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: section {name!r} must be a mapping of fields, got {values!r}")
    names = [f.name for f in dataclasses.fields(kind)]
    for key in values:
        if key not in names:
            raise ConfigError(f"{source}: {name} has no field {key!r}{_did_you_mean(str(key), names)}")
    hints = get_type_hints(kind)
    checked: dict[str, Any] = {}
    for key, value in values.items():
        expected = hints[key]
        if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{source}: {name}.{key} must be an integer, got {value!r}")
        if expected is float and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ConfigError(f"{source}: {name}.{key} must be a number, got {value!r}")
        checked[key] = float(value) if expected is float else value
    try:
        return kind(**checked)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _from_text(variable: EnvironmentVariable, text: str) -> object:
    if variable.field == "timeout":
        try:
            return float(text)
        except ValueError:
            raise ConfigError("give seconds, e.g. 600") from None
    if variable.field in ("nvtx", "wandb"):
        switch = parse_switch(text)
        if switch is None and text.lower() != "auto":
            raise ConfigError("give on, off or auto")
        return switch
    return text


def _did_you_mean(name: str, known: Mapping[str, Any] | list[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(known)}"


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """Set ``STRAGGLERKIT_*`` names that are no setting (a typo), each with the closest known name."""
    env = os.environ if environ is None else environ
    known = [variable.name for variable in ENVIRONMENT] + [CONFIG_FILE_VARIABLE]
    found = []
    # compared without the shared prefix, which would make every name look close to every other
    suffixes = {name.removeprefix(PREFIX): name for name in known}
    for name in sorted(env):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name.removeprefix(PREFIX), list(suffixes), n=1, cutoff=0.6)
            found.append((name, suffixes[close[0]] if close else None))
    return found

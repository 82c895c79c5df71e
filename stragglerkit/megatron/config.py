"""The switch and its settings: Megatron-LM's command line, or a section next to megatron-core's
``DistributedDataParallelConfig``.

Two ways in, one :class:`MegatronConfig`:

* **Megatron-LM** (``pretrain``): :func:`add_arguments` has the signature of Megatron-LM's
  ``extra_args_provider``, so ``pretrain(..., extra_args_provider=stragglerkit.megatron.add_arguments)``
  gives the launch line ``--straggler-aware-allreduce`` and two options: ``--straggler-config``
  (a YAML file of stragglerkit's settings) and ``--straggler-event-log`` (the JSONL decision log).
  :meth:`MegatronConfig.from_args` reads them from Megatron-LM's ``args``.
* **megatron-core** (your own loop): ``MegatronConfig(straggler_aware_allreduce=True)`` next to the
  ``DistributedDataParallelConfig``, or both from one YAML file with :func:`load_yaml`: its ``ddp``
  mapping holds ``DistributedDataParallelConfig``'s fields, its ``stragglerkit`` mapping holds
  ``straggler_aware_allreduce`` and stragglerkit's sections (``executor``, ``optcc``,
  ``detection``, ``report``; see docs/configuration.md). ``configs/megatron.yaml`` is the preset.

Example::

    ddp_config, straggler_config = load_yaml("configs/megatron.yaml")
    model = DistributedDataParallel(transformer_config, ddp_config, model)
    stragglerkit.megatron.install(model, straggler_config)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stragglerkit.config import Config
from stragglerkit.errors import ConfigError

__all__ = ["DDP_SECTION", "FLAG", "SECTION", "MegatronConfig", "add_arguments", "load_yaml"]

FLAG = "--straggler-aware-allreduce"
"""The launch-line flag that turns the integration on."""
SECTION = "stragglerkit"
"""The YAML mapping that holds :class:`MegatronConfig`."""
DDP_SECTION = "ddp"
"""The YAML mapping that holds megatron-core's ``DistributedDataParallelConfig`` fields."""
_SWITCH = "straggler_aware_allreduce"


@dataclass(kw_only=True, slots=True)
class MegatronConfig:
    """stragglerkit's section next to megatron-core's ``DistributedDataParallelConfig``.

    Example::

        MegatronConfig(straggler_aware_allreduce=True, config=stragglerkit.Config.from_yaml("configs/long_job.yaml"))
    """

    straggler_aware_allreduce: bool = False
    """The switch: route each bucket group's gradient synchronisation through the closed loop
    (off: megatron-core runs unchanged and nothing is checked)."""
    config: Config | None = None
    """stragglerkit's own configuration (executor, optcc, detection, report); ``None``: the one
    ``stragglerkit.init`` was given for the data-parallel group, or, if ``install`` makes that call,
    ``STRAGGLERKIT_CONFIG``'s file or the defaults."""

    def __post_init__(self) -> None:
        if not isinstance(self.straggler_aware_allreduce, bool):
            raise ConfigError(f"{_SWITCH} must be true or false, got {self.straggler_aware_allreduce!r}")
        if self.config is not None and not isinstance(self.config, Config):
            raise ConfigError(
                f"MegatronConfig.config must be a stragglerkit.Config or None, got {type(self.config).__name__}"
            )

    # -- building ---------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, source: str = "configuration") -> MegatronConfig:
        """From a mapping: ``straggler_aware_allreduce`` and stragglerkit's sections."""
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: the {SECTION} section must be a mapping, got {type(data).__name__}")
        sections = dict(data)
        switch = sections.pop(_SWITCH, False)
        if not isinstance(switch, bool):
            raise ConfigError(f"{source}: {SECTION}.{_SWITCH} must be true or false, got {switch!r}")
        config = Config.from_dict(sections, source=f"{source} ({SECTION} section)") if sections else None
        return cls(straggler_aware_allreduce=switch, config=config)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str]) -> MegatronConfig:
        """From a YAML file: its ``stragglerkit`` mapping if it has one (a file that also holds
        Megatron's settings, like ``configs/megatron.yaml``), else the whole file (a file of
        stragglerkit's sections, like ``configs/default.yaml``)."""
        data = _read_yaml(path)
        if SECTION in data:
            return cls.from_dict(data[SECTION], source=str(path))
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MegatronConfig:
        """From Megatron-LM's ``args`` (``megatron.training.get_args()``) with the options of
        :func:`add_arguments`: on if ``--straggler-aware-allreduce`` was given or the
        ``--straggler-config`` file's section says ``straggler_aware_allreduce: true``."""
        if not hasattr(args, _SWITCH):
            raise ConfigError(
                f"these arguments have no {_SWITCH}: give pretrain extra_args_provider="
                "stragglerkit.megatron.add_arguments (or call add_arguments(parser) in your own provider)"
            )
        path = getattr(args, "straggler_config", None)
        event_log = getattr(args, "straggler_event_log", None)
        loaded = cls.from_yaml(path) if path else cls()
        config = loaded.config
        if event_log:
            config = (config if config is not None else Config.from_env()).replace(report={"event_log": event_log})
        switch = bool(getattr(args, _SWITCH)) or loaded.straggler_aware_allreduce
        return cls(straggler_aware_allreduce=switch, config=config)

    @classmethod
    def resolve(cls, settings: MegatronConfig | argparse.Namespace | Mapping[str, Any] | None) -> MegatronConfig:
        """What :func:`~stragglerkit.megatron.install` accepts: a MegatronConfig, Megatron-LM's
        ``args``, a mapping (a YAML section), or ``None`` (on, with the session's configuration)."""
        if settings is None:
            return cls(straggler_aware_allreduce=True)
        if isinstance(settings, MegatronConfig):
            return settings
        if isinstance(settings, argparse.Namespace):
            return cls.from_args(settings)
        if isinstance(settings, Mapping):
            return cls.from_dict(settings)
        raise ConfigError(
            "install's settings must be Megatron-LM's args (argparse.Namespace), a "
            f"stragglerkit.megatron.MegatronConfig, a mapping or None, got {type(settings).__name__}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``stragglerkit`` section as plain data (what :meth:`from_dict` reads)."""
        return {_SWITCH: self.straggler_aware_allreduce, **(self.config.to_dict() if self.config else {})}


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--straggler-aware-allreduce`` and its options to Megatron-LM's parser; the signature
    of ``extra_args_provider``, so ``pretrain(..., extra_args_provider=add_arguments)`` works.

    Example::

        pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder,
                 forward_step, extra_args_provider=stragglerkit.megatron.add_arguments)
    """
    group = parser.add_argument_group(
        title="stragglerkit",
        description="straggler-aware gradient AllReduce over the data-parallel group (docs/megatron.md)",
    )
    group.add_argument(
        FLAG,
        action="store_true",
        dest=_SWITCH,
        help="route each bucket group's gradient AllReduce through stragglerkit's closed loop: megatron-core's "
        "own collective while nothing is wrong, StragglAR / OptCC / the balanced ring when a rank is persistently "
        "late or its NIC slow (the distributed optimizer's reduce-scatter is kept as it is)",
    )
    group.add_argument(
        "--straggler-config",
        default=None,
        metavar="YAML",
        help="stragglerkit's settings: a file with a 'stragglerkit' mapping (configs/megatron.yaml) or of "
        "stragglerkit's sections (configs/default.yaml); default: STRAGGLERKIT_CONFIG's file or the defaults",
    )
    group.add_argument(
        "--straggler-event-log",
        default=None,
        metavar="PATH",
        help="JSONL log of the loop's decisions, written by data-parallel rank 0 ('{rank}' in the path: by "
        "every rank); overrides the configuration's report.event_log",
    )
    return parser


def load_yaml(path: str | os.PathLike[str]) -> tuple[Any, MegatronConfig]:
    """Read megatron-core's ``DistributedDataParallelConfig`` (the ``ddp`` mapping) and the
    :class:`MegatronConfig` next to it (the ``stragglerkit`` mapping) from one YAML file.

    Example::

        ddp_config, straggler_config = load_yaml("configs/megatron.yaml")
    """
    from megatron.core.distributed import DistributedDataParallelConfig

    data = _read_yaml(path)
    unknown = [key for key in data if key not in (DDP_SECTION, SECTION)]
    if unknown:
        raise ConfigError(
            f"{path}: unknown mapping(s) {', '.join(map(repr, unknown))}; the file holds '{DDP_SECTION}' "
            f"(DistributedDataParallelConfig's fields) and '{SECTION}' (straggler_aware_allreduce and "
            "stragglerkit's sections)"
        )
    ddp_fields = data.get(DDP_SECTION) or {}
    if not isinstance(ddp_fields, Mapping):
        raise ConfigError(f"{path}: '{DDP_SECTION}' must be a mapping of DistributedDataParallelConfig's fields")
    try:
        ddp_config = DistributedDataParallelConfig(**ddp_fields)
    except TypeError as err:
        raise ConfigError(f"{path}: '{DDP_SECTION}': {err} (the fields of DistributedDataParallelConfig)") from None
    return ddp_config, MegatronConfig.from_dict(data.get(SECTION), source=str(path))


def _read_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"configuration file {str(file)!r} does not exist")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{file}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: expected a mapping at the top, got {type(data).__name__}")
    return data

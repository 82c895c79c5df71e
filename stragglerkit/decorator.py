"""``stragglerkit.straggler_aware``: one decorator turns an optimizer straggler-aware (Horovod style).

Applied to an optimizer instance, an optimizer class (its instances are distributed) or a function
that builds an optimizer, with or without arguments::

    optimizer = stragglerkit.straggler_aware(optimizer, named_parameters=model.named_parameters())

    @stragglerkit.straggler_aware
    class MyAdam(torch.optim.Adam): ...
    optimizer = MyAdam(model.parameters(), lr=1e-3, named_parameters=model.named_parameters())

    @stragglerkit.straggler_aware(config=stragglerkit.Config.from_yaml("configs/long_job.yaml"))
    def make_optimizer(model): return torch.optim.SGD(model.parameters(), lr=0.1)

The keyword arguments are ``hvd.DistributedOptimizer``'s (``named_parameters``, ``compression``,
``backward_passes_per_step``, ``op``, ``gradient_predivide_factor``, ``groups``,
``sparse_as_dense``, ``process_set``) with Horovod's meaning, plus stragglerkit's ``config``.
Where the optimizer is made decides what it runs on:

* under Horovod (``hvd.init()`` was called): :func:`stragglerkit.horovod.DistributedOptimizer`,
  over Horovod's ranks;
* else, with torch.distributed initialised: :func:`stragglerkit.integrations.optimizer.DistributedOptimizer`,
  the same behaviour over the default group, for data parallelism written by hand (it calls
  ``stragglerkit.init()`` if that was not done; Horovod-only arguments raise a ConfigError);
* neither: a ConfigError that says what to call.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from stragglerkit.config import Config
from stragglerkit.errors import ConfigError

__all__ = ["straggler_aware"]


def straggler_aware(target: Any = None, /, *, config: Config | None = None, **horovod_arguments: Any) -> Any:
    """Make an optimizer, an optimizer class or an optimizer-building function straggler-aware; see
    the module docstring."""
    if config is not None and not isinstance(config, Config):  # at once, on every rank, any world size
        raise ConfigError(
            f"straggler_aware: config must be a stragglerkit.Config or None, got {type(config).__name__} "
            "(detection settings are Config.detection fields: Config().replace(detection={...}))"
        )
    if target is None:  # @straggler_aware(...) with arguments
        return functools.partial(straggler_aware, config=config, **horovod_arguments)
    if isinstance(target, torch.optim.Optimizer):
        return _distributed(target, config, horovod_arguments)
    if isinstance(target, type) and issubclass(target, torch.optim.Optimizer):
        plain = target

        class StragglerAware(plain):  # type: ignore[valid-type,misc]
            def __new__(cls, *args: Any, named_parameters: Any = None, **kwargs: Any) -> Any:
                arguments = dict(horovod_arguments)
                if named_parameters is not None:
                    arguments["named_parameters"] = named_parameters
                return _distributed(plain(*args, **kwargs), config, arguments)

        StragglerAware.__name__ = plain.__name__
        StragglerAware.__qualname__ = plain.__qualname__
        StragglerAware.__doc__ = plain.__doc__
        StragglerAware.__module__ = plain.__module__
        return StragglerAware
    if callable(target):

        @functools.wraps(target)
        def build(*args: Any, **kwargs: Any) -> Any:
            made = target(*args, **kwargs)
            if not isinstance(made, torch.optim.Optimizer):
                raise ConfigError(
                    f"straggler_aware: {getattr(target, '__name__', target)!r} returned a {type(made).__name__}, "
                    "not a torch.optim.Optimizer"
                )
            return _distributed(made, config, horovod_arguments)

        return build
    raise ConfigError(
        "straggler_aware wraps a torch.optim.Optimizer, an optimizer class or a function that returns an "
        f"optimizer; got a {type(target).__name__}"
    )


def _distributed(optimizer: torch.optim.Optimizer, config: Config | None, arguments: dict[str, Any]) -> Any:
    from stragglerkit.integrations.optimizer import DistributedOptimizer, StragglerAwareOptimizer

    if isinstance(optimizer, StragglerAwareOptimizer) or (
        hasattr(optimizer, "_register_hooks") and hasattr(optimizer, "synchronize")
    ):
        raise ConfigError(
            f"this {type(optimizer).__name__} is already distributed (by straggler_aware or hvd.DistributedOptimizer): "
            "wrap the plain optimizer once"
        )
    if _horovod_running():
        from stragglerkit.horovod import DistributedOptimizer as HorovodOptimizer

        return HorovodOptimizer(optimizer, config=config, **arguments)
    if dist.is_available() and dist.is_initialized():
        return DistributedOptimizer(optimizer, config=config, **arguments)
    raise ConfigError(
        "straggler_aware needs the ranks to be connected first: under Horovod call hvd.init() "
        "(import horovod.torch as hvd); with torch.distributed call dist.init_process_group(...) and then "
        "stragglerkit.init(), on every rank (for PyTorch DDP use stragglerkit.DDPState with "
        "model.register_comm_hook instead)"
    )


def _horovod_running() -> bool:
    """Is Horovod installed and initialised in this process?"""
    try:
        import horovod.torch as hvd
    except ImportError:
        return False
    return bool(hvd.is_initialized())

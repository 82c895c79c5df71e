"""Which megatron-core the Megatron integration supports, checked before anything is changed.

The integration replaces one private method per bucket group,
``megatron.core.distributed.param_and_grad_buffer._ParamAndGradBucketGroup.start_grad_sync``, and
relies on the way its neighbours call it and on the fields they keep. Private code changes
without notice between releases, so the integration is pinned: :data:`SUPPORTED` names the
releases it was written against, and :func:`check_megatron_core` compares the installed release
and the signatures of every method and field it relies on with what it expects. Anything else
fails with a :class:`~stragglerkit.errors.ConfigError` that names the installed version and
what differs, before a single bucket group is touched.

Example::

    version = check_megatron_core()        # "0.16.1", or ConfigError naming what differs
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from stragglerkit.errors import ConfigError

__all__ = ["PIN", "SUPPORTED", "TESTED", "check_bucket_group", "check_megatron_core", "megatron_core_version"]

SUPPORTED = ">=0.16.0,<0.17"
"""The megatron-core releases the integration supports (a ``packaging`` specifier: 0.16.x)."""
TESTED = ("0.16.1",)
"""The releases the tests ran against."""
PIN = "megatron-core==0.16.1"
"""What to install (scripts/setup.sh installs it)."""

_BUCKET_GROUP_METHODS: dict[str, tuple[str, ...]] = {
    "start_grad_sync": ("self", "force_all_reduce"),
    "finish_grad_sync": ("self", "force_all_reduce"),
    "register_grad_ready": ("self", "param", "force_all_reduce"),
    "check_grads": ("self", "check_for_nan_or_inf", "check_for_large"),
    "reset": ("self",),
}
"""``_ParamAndGradBucketGroup``'s methods the integration wraps or whose calls into the wrapped
one it relies on, with their parameters in megatron-core 0.16."""
_BUCKET_FIELDS = ("params", "param_data", "grad_data", "offset", "numel_unpadded", "gradient_scaling_factor")
"""``_ParamAndGradBucket.__init__``'s parameters the integration reads (``grad_data``,
``gradient_scaling_factor``) or that show the bucket is the one it knows."""
_DDP_CONFIG_FIELDS = (
    "grad_reduce_in_fp32",
    "overlap_grad_reduce",
    "use_distributed_optimizer",
    "num_distributed_optimizer_instances",
    "check_for_nan_in_grad",
    "check_for_large_grads",
    "average_in_collective",
)
"""``DistributedDataParallelConfig`` fields whose meaning the wrapped method keeps."""
_MODULE = "megatron.core.distributed.param_and_grad_buffer"


def megatron_core_version() -> str:
    """The installed megatron-core's version (``ConfigError`` if there is none)."""
    try:
        from megatron.core import package_info
    except ImportError as err:
        raise ConfigError(
            f"--straggler-aware-allreduce needs megatron-core, which is not installed ({err}): pip install {PIN}"
        ) from None
    return str(package_info.__version__)


def _unsupported(version: str, what: str) -> ConfigError:
    return ConfigError(
        f"stragglerkit's Megatron integration does not support megatron-core {version}: {what}. It "
        f"supports megatron-core {SUPPORTED} (tested: {', '.join(TESTED)}); install {PIN}, or run "
        "without --straggler-aware-allreduce (straggler_aware_allreduce=False)"
    )


def _parameters(function: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def check_megatron_core() -> str:
    """Check the installed megatron-core against :data:`SUPPORTED` and the signatures the
    integration relies on; return its version, or raise a ``ConfigError`` naming it and what
    differs. Not collective; nothing is changed.

    Example::

        check_megatron_core()   # "0.16.1"
    """
    version = megatron_core_version()
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        supported = Version(version) in SpecifierSet(SUPPORTED, prereleases=True)
    except InvalidVersion:
        supported = False
    if not supported:
        raise _unsupported(version, f"its version is outside {SUPPORTED}")
    try:
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBucket, _ParamAndGradBucketGroup
    except ImportError as err:
        what = f"{_MODULE} has no _ParamAndGradBucket or _ParamAndGradBucketGroup ({err})"
        raise _unsupported(version, what) from None
    for name, expected in _BUCKET_GROUP_METHODS.items():
        method = getattr(_ParamAndGradBucketGroup, name, None)
        if not callable(method):
            raise _unsupported(version, f"_ParamAndGradBucketGroup has no method {name}")
        found = _parameters(method)
        if found != expected:
            raise _unsupported(
                version,
                f"_ParamAndGradBucketGroup.{name} takes ({', '.join(found)}) where ({', '.join(expected)}) "
                "was expected",
            )
    if getattr(_ParamAndGradBucketGroup.start_grad_sync, "__module__", None) != _MODULE:
        raise _unsupported(
            version,
            "_ParamAndGradBucketGroup.start_grad_sync was replaced by "
            f"{getattr(_ParamAndGradBucketGroup.start_grad_sync, '__module__', '?')} (another patch of "
            "megatron-core's gradient synchronisation is installed; only one can own it)",
        )
    missing = [f for f in _BUCKET_FIELDS if f not in _parameters(_ParamAndGradBucket.__init__)]
    if missing:
        raise _unsupported(version, f"_ParamAndGradBucket takes no {', '.join(missing)}")
    fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    missing = [f for f in _DDP_CONFIG_FIELDS if f not in fields]
    if missing:
        raise _unsupported(version, f"DistributedDataParallelConfig has no {', '.join(missing)}")
    return version


def check_bucket_group(bucket_group: Any, version: str) -> None:
    """Check that one bucket group of a built model holds what the wrapped method reads."""
    needed = ["buckets", "ddp_config", "is_first_batch", "grad_reduce_handle"]
    needed.append(
        "intra_distributed_optimizer_instance_group"
        if bucket_group.ddp_config.use_distributed_optimizer
        else "data_parallel_group"
    )
    missing = [name for name in needed if not hasattr(bucket_group, name)]
    for bucket in getattr(bucket_group, "buckets", []):
        missing += [f"bucket.{name}" for name in ("grad_data", "gradient_scaling_factor") if not hasattr(bucket, name)]
    if missing:
        raise _unsupported(version, f"its bucket groups have no {', '.join(sorted(set(missing)))}")

"""The arguments of the distributed optimizer without Horovod: checked, and read as the loop's.

:func:`~stragglerkit.integrations.optimizer.DistributedOptimizer` takes ``hvd.DistributedOptimizer``'s
arguments. :func:`as_loop_op` reads ``op`` as the loop's ``"avg"``/``"sum"``;
:func:`check_arguments`, :func:`check_passes` and :func:`check_process_set` reject what Horovod's
optimizer would reject or what only Horovod has (``groups``/``num_groups``, a process set of its
own, ``op=hvd.Adasum``), with a :class:`~stragglerkit.ConfigError` that names the argument;
:func:`name_parameters` names every parameter of the optimizer, as Horovod checks
``named_parameters``.

Example::

    op = as_loop_op(op)
    check_arguments(op, compression, backward_passes_per_step, gradient_predivide_factor, 0, None)
    named = name_parameters(optimizer, model.named_parameters())
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from stragglerkit.errors import ConfigError

__all__ = ["as_loop_op", "check_arguments", "check_passes", "check_process_set", "name_parameters"]

_OP_NAMES = {"avg": "avg", "average": "avg", "mean": "avg", "sum": "sum"}


def as_loop_op(op: Any) -> str:
    """``op`` as the loop's ``"avg"``/``"sum"``: torch's (and stragglerkit's) ``ReduceOp.AVG``/``SUM``,
    the strings, or Horovod's ``hvd.Average``/``hvd.Sum`` where Horovod is installed."""
    if isinstance(op, str) and op.strip().lower() in _OP_NAMES:
        return _OP_NAMES[op.strip().lower()]
    if isinstance(op, dist.ReduceOp | dist.ReduceOp.RedOpType):
        from stragglerkit.api import _op_name

        name = _op_name(op)
        if name in ("avg", "sum"):
            return name
    horovod = _horovod_ops()
    if isinstance(op, int) and not isinstance(op, bool) and op in horovod:
        loop_op = horovod[op]
        if loop_op is None:
            raise ConfigError(
                "op=hvd.Adasum is Horovod's own reduction: run under Horovod (hvd.init() first), or use "
                "op='avg' or 'sum' on torch.distributed"
            )
        return loop_op
    raise ConfigError(
        f"op must be average or sum: 'avg' or 'sum', torch.distributed.ReduceOp.AVG or .SUM (or Horovod's "
        f"hvd.Average or hvd.Sum), got {op!r}"
    )


def _horovod_ops() -> dict[int, str | None]:
    """Horovod's op constants -> the loop's op (``None``: Adasum), if Horovod is installed."""
    try:
        from horovod.torch.mpi_ops import Adasum, Average, Sum
    except ImportError:
        return {}
    return {Average: "avg", Sum: "sum", Adasum: None}


def check_passes(passes: Any) -> None:
    if isinstance(passes, bool) or not isinstance(passes, int) or passes <= 0:
        raise ConfigError(f"backward_passes_per_step must be > 0 (an integer), got {passes!r}")


def check_arguments(op: str, compression: Any, passes: Any, predivide: Any, num_groups: Any, groups: Any) -> None:
    check_passes(passes)
    if not isinstance(predivide, int | float) or not math.isfinite(predivide) or predivide <= 0:
        raise ConfigError(f"gradient_predivide_factor must be a positive number, got {predivide!r}")
    if predivide != 1.0 and op != "avg":
        raise ConfigError(
            f"gradient_predivide_factor ({predivide:g}) applies to the average only (as in Horovod): "
            "use op='avg', or leave the factor at 1.0 with op='sum'"
        )
    if compression is not None and not (
        callable(getattr(compression, "compress", None)) and callable(getattr(compression, "decompress", None))
    ):
        raise ConfigError(
            "compression must have compress(tensor) -> (tensor, ctx) and decompress(tensor, ctx) "
            f"(as hvd.Compression.fp16 has), got a {type(compression).__name__}; None: no compression"
        )
    if num_groups or groups:
        which = "groups" if groups else "num_groups"
        raise ConfigError(
            f"{which} asks for Horovod's grouped allreduce, which exists only under Horovod: without Horovod "
            "the gradients go in buckets of their own (optimizer_buckets); drop it, or call hvd.init() first"
        )


def check_process_set(process_set: Any) -> None:
    """``None`` or Horovod's global process set (the whole group); any other set is Horovod's alone."""
    if process_set is None or getattr(process_set, "process_set_id", None) == 0:
        return
    raise ConfigError(
        f"process_set {process_set!r} is a Horovod process set: without Horovod the optimizer reduces over "
        "the whole default torch.distributed group; drop process_set, or call hvd.init() to run under Horovod"
    )


def name_parameters(
    optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]] | None
) -> list[tuple[str, torch.Tensor]]:
    """Every parameter of ``optimizer`` with its name, in the optimizer's order; Horovod's checks of
    ``named_parameters`` (pairs, unique names, every parameter named), in words of our own."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [
            (f"param_groups[{i}].params[{j}]", p)
            for i, group in enumerate(optimizer.param_groups)
            for j, p in enumerate(group["params"])
        ]
    pairs = list(named_parameters)
    for index, item in enumerate(pairs):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
            raise ConfigError(
                "named_parameters must be (name, parameter) pairs, as model.named_parameters() gives; "
                f"its item {index} is a {type(item).__name__}"
            )
    counts = collections.Counter(name for name, _ in pairs)
    duplicates = sorted(name for name, count in counts.items() if count > 1)
    if duplicates:
        raise ConfigError(
            "named_parameters must give each parameter a name of its own; these names are used more than "
            f"once: {', '.join(map(repr, duplicates))} (model.named_parameters() gives unique names)"
        )
    name_of: dict[torch.Tensor, str] = {}
    for name, p in pairs:
        name_of.setdefault(p, name)
    unnamed = [
        (i, j, p)
        for i, group in enumerate(optimizer.param_groups)
        for j, p in enumerate(group["params"])
        if p not in name_of
    ]
    if unnamed:
        listed = ", ".join(f"param_groups[{i}].params[{j}] of shape {tuple(p.shape)}" for i, j, p in unnamed[:4])
        raise ConfigError(
            f"named_parameters was given but {len(unnamed)} of the optimizer's {len(params)} parameters are not "
            f"in it ({listed}{', ...' if len(unnamed) > 4 else ''}): pass the names of every parameter the "
            "optimizer updates (model.named_parameters() of the model it optimizes)"
        )
    return [(name_of[p], p) for p in params]

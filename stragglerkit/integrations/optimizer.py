"""A distributed optimizer without Horovod: Horovod's interface on the default torch.distributed group.

For data parallelism written by hand (no DDP, no Horovod): ``DistributedOptimizer`` takes
``hvd.DistributedOptimizer``'s arguments and behaves as Horovod's optimizer does, over the
default torch.distributed group, with the gradients going through stragglerkit's closed loop.
``stragglerkit.straggler_aware`` returns it when Horovod is not running.

What the result does, as Horovod's does:

* A hook on each parameter (``Tensor.register_post_accumulate_grad_hook``) counts its backward
  passes; after ``backward_passes_per_step`` of them the gradient (the sum of those passes) joins
  its bucket (:mod:`stragglerkit.integrations.optimizer_buckets`: an eighth of the gradients, from
  1 to 25 MiB, in the order the first step made them ready, started strictly in bucket order) and
  each full bucket goes to the loop. While nothing is wrong the loop runs the group's own
  ``all_reduce`` of the bucket; when it finds a persistent straggler or a degraded NIC every rank
  switches at the same step to StragglAR, OptCC or the balanced ring (:mod:`stragglerkit.loop.loop`).
* ``step()`` first calls ``synchronize()``: the buckets not started yet (a parameter that got no
  gradient is reduced as zeros, as another rank may have one) are handed over, every bucket is
  waited for and each gradient is replaced by its reduced value. ``synchronize()`` can be called
  by hand, then ``step()`` inside ``with optimizer.skip_synchronize():`` (gradient clipping
  between them). ``zero_grad()`` while reductions are in flight raises.
* ``op``: average (default) or sum; ``gradient_predivide_factor`` (average only) divides the
  gradients by it before the sum and the sum by ``world_size / factor`` after; ``compression``:
  an object with ``compress(tensor) -> (tensor, ctx)`` and ``decompress(tensor, ctx)`` (Horovod's
  ``hvd.Compression.fp16`` is one), applied to each bucket. Sparse gradients are reduced dense
  and made sparse again (``sparse_as_dense`` either way).

What only Horovod has raises a :class:`~stragglerkit.ConfigError` that names the argument:
``process_set`` (other than Horovod's global one), ``groups``/``num_groups`` and
``op=hvd.Adasum`` (the checks: :mod:`stragglerkit.integrations.optimizer_arguments`).

Construction is collective: ``stragglerkit.init()`` runs if it has not (with ``config``), and the
ranks compare their optimizers' parameters (name, shape, dtype, requires_grad) on the session's
side group; a rank whose parameters differ from rank 0's is named on every rank with the first
parameter that differs. A rank that dies or stalls makes ``step()`` (or ``synchronize()``) raise
:class:`~stragglerkit.PeerError` naming it on every other rank within ``executor.timeout`` plus
the report window (2 s).

The result is an instance of the optimizer's own class (a subclass of it, with the same name)
sharing the given optimizer's parameter groups and state; step the result, not the optimizer
passed in.

Example::

    dist.init_process_group("gloo")
    stragglerkit.init()
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters())
    loss_fn(model(x), y).backward()
    optimizer.step()
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle

from stragglerkit.config import Config
from stragglerkit.errors import ConfigError, StragglerKitError
from stragglerkit.integrations.optimizer_arguments import (
    as_loop_op,
    check_arguments,
    check_passes,
    check_process_set,
    name_parameters,
)
from stragglerkit.integrations.optimizer_buckets import GradientBuckets, check_same_parameters, parameter_signature
from stragglerkit.loop.loop import StragglerLoop

__all__ = ["DistributedOptimizer", "StragglerAwareOptimizer"]

_WHAT = "stragglerkit.straggler_aware (torch.distributed)"


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Any = None,
    backward_passes_per_step: int = 1,
    op: Any = "avg",
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = None,
    *,
    config: Config | None = None,
) -> torch.optim.Optimizer:
    """``optimizer`` distributed over the default torch.distributed group with ``hvd.DistributedOptimizer``'s
    arguments and meaning (see the module docstring); ``config`` is stragglerkit's (default: the
    session's). Collective: every rank calls it, for the same optimizers in the same order.

    Example::

        optimizer = DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op="sum")
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"{_WHAT} distributes a torch.optim.Optimizer, got a {type(optimizer).__name__}")
    if isinstance(optimizer, StragglerAwareOptimizer):
        raise ConfigError(
            f"this {type(optimizer).__name__} is already distributed (by straggler_aware): "
            "wrap the plain optimizer once"
        )
    loop_op = as_loop_op(op)
    check_arguments(loop_op, compression, backward_passes_per_step, gradient_predivide_factor, num_groups, groups)
    check_process_set(process_set)
    if not isinstance(sparse_as_dense, bool):
        raise ConfigError(f"sparse_as_dense must be True or False, got {sparse_as_dense!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise ConfigError(
            f"{_WHAT}: torch.distributed is not initialised: call dist.init_process_group(...) and "
            "stragglerkit.init() on every rank first (or hvd.init() to run under Horovod)"
        )
    from stragglerkit import api
    from stragglerkit.session import session_for

    if not api.is_initialized():
        api.init(config=config)
    session = session_for(None)
    named: list[tuple[str, torch.Tensor]] = []
    error: ConfigError | None = None
    try:
        named = name_parameters(optimizer, named_parameters)
    except ConfigError as err:  # the other ranks are in the check below: they name this rank
        error = err
    if session.world_size > 1:
        check_same_parameters(None if error else parameter_signature(named), session.side_group, _WHAT, error)
    elif error is not None:
        raise error
    distributed = _distributed_copy(optimizer)
    sync = _GradientSync(
        named,
        compression,
        backward_passes_per_step,
        loop_op,
        gradient_predivide_factor,
        StragglerLoop(session, config, framework="horovod") if session.world_size > 1 else None,
    )
    distributed._stragglerkit = sync
    return distributed


class StragglerAwareOptimizer(torch.optim.Optimizer):
    """What :func:`DistributedOptimizer` adds to an optimizer's class: Horovod's methods over
    stragglerkit's loop. Its instances come from :func:`DistributedOptimizer` only (a subclass
    with the optimizer's own class after this one, and the same name).

    Example::

        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with optimizer.skip_synchronize():
            optimizer.step()
    """

    _stragglerkit: _GradientSync

    @property
    def backward_passes_per_step(self) -> int:
        """Backward passes whose gradients are summed locally before they are reduced."""
        return self._stragglerkit.backward_passes_per_step

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change ``backward_passes_per_step`` (between steps, on every rank)."""
        self._stragglerkit.set_passes(passes)

    def synchronize(self) -> None:
        """Reduce every gradient of this step and wait: afterwards each holds the group's result.
        Raises :class:`~stragglerkit.PeerError` naming the rank when one died or stalled."""
        self._stragglerkit.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside this context does not synchronize (it was done by hand before).

        Example::

            optimizer.synchronize()
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        sync = self._stragglerkit
        sync.should_synchronize = False
        try:
            yield
        finally:
            sync.should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Synchronize (unless inside :meth:`skip_synchronize`), then the optimizer's own step."""
        sync = self._stragglerkit
        if sync.should_synchronize:
            if sync.synchronized:
                warnings.warn(
                    "optimizer.step() was called after optimizer.synchronize() outside "
                    "optimizer.skip_synchronize(): the gradients are reduced a second time; step "
                    "inside `with optimizer.skip_synchronize():` after synchronizing by hand",
                    stacklevel=2,
                )
            self.synchronize()
        sync.synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The optimizer's own ``zero_grad``; raises while this step's reductions are in flight."""
        pending = len(self._stragglerkit.touched)
        if pending:
            raise StragglerKitError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                f"optimizer.synchronize(): the gradients of {pending} parameter(s) are being reduced, and "
                "zeroing them now would race with that; call optimizer.step() (or synchronize()) first"
            )
        super().zero_grad(set_to_none)

    def close(self) -> None:
        """End the optimizer's loop, on every rank after the last step: wait for its stats exchange
        in flight, stop its thread, write its last event-log lines and, when it logs to Weights &
        Biases, the report's figures. The optimizer must not reduce gradients afterwards."""
        loop = self._stragglerkit.loop
        if loop is not None:
            loop.close()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The optimizer's own ``load_state_dict``; forgets this step's backward passes."""
        self._stragglerkit.reset()
        super().load_state_dict(state_dict)


# -- what an instance holds ------------------------------------------------------------------------
class _GradientSync:
    """The per-optimizer state: backward passes per parameter, what is in flight, the buckets."""

    __slots__ = (  # noqa: RUF023 (grouped: what users tune, then internal state)
        # user-tuned
        "backward_passes_per_step",
        "compression",
        # internal
        "buckets",
        "contexts",
        "hooks",
        "passes_left",
        "should_synchronize",
        "synchronized",
        "touched",
        "__weakref__",
    )

    def __init__(
        self,
        named: list[tuple[str, torch.Tensor]],
        compression: Any,
        passes: int,
        op: str,
        predivide_factor: float,
        loop: StragglerLoop | None,
    ) -> None:
        self.backward_passes_per_step = passes
        self.compression = compression
        params = [p for _, p in named if p.requires_grad]
        self.buckets: GradientBuckets | None = None
        """``None`` on a world of one rank: nothing to reduce, no hooks (as Horovod does)."""
        if loop is not None:
            compress = None if compression is None else (lambda flat: compression.compress(flat)[0])
            self.buckets = GradientBuckets(params, loop, op, compress, predivide_factor=predivide_factor)
        self.passes_left = {p: passes for p in params}
        self.touched: set[torch.Tensor] = set()
        """Parameters whose hook ran since the last synchronize."""
        self.contexts: dict[torch.Tensor, Any] = {}
        """Parameters handed to their bucket this step -> their compression context."""
        self.should_synchronize = True
        self.synchronized = False
        self.hooks: list[RemovableHandle] = []
        if self.buckets is not None:
            owner = weakref.ref(self)
            for p in params:
                self.hooks.append(p.register_post_accumulate_grad_hook(_gradient_hook(owner)))
            weakref.finalize(self, _remove_hooks, list(self.hooks))

    @property
    def loop(self) -> StragglerLoop | None:
        """The loop that reduces the buckets (``None`` on one rank)."""
        return None if self.buckets is None else self.buckets.loop

    def set_passes(self, passes: int) -> None:
        check_passes(passes)
        self.backward_passes_per_step = passes
        self.reset()

    def reset(self) -> None:
        """Forget this step's backward passes (nothing is in flight afterwards)."""
        for p in self.passes_left:
            self.passes_left[p] = self.backward_passes_per_step
        self.touched.clear()
        self.contexts.clear()

    def on_gradient(self, p: torch.Tensor) -> None:
        """``p``'s hook: one more backward pass; after the last one, ``p`` joins its bucket."""
        if self.passes_left[p] <= 0:
            raise ConfigError(
                f"a gradient was computed more than backward_passes_per_step ({self.backward_passes_per_step}) "
                "times before optimizer.step(): increase backward_passes_per_step to sum the gradients of "
                "more backward passes locally, or call step() (or synchronize()) after each pass"
            )
        self.touched.add(p)
        self.passes_left[p] -= 1
        if self.passes_left[p] == 0:
            self._hand_over(p)

    def _hand_over(self, p: torch.Tensor) -> None:
        assert self.buckets is not None
        if p.grad is None:  # no gradient on this rank this step; another rank may have one
            p.grad = torch.zeros_like(p)
        if self.compression is not None:
            _, self.contexts[p] = self.compression.compress(torch.empty(0, dtype=p.grad.dtype, device=p.device))
        else:
            self.contexts[p] = None
        self.buckets.grad_ready(p)

    def synchronize(self) -> None:
        buckets = self.buckets
        if buckets is None:
            self.synchronized = True
            return
        try:
            for p in buckets.order:
                if p not in self.contexts:
                    self._hand_over(p)
            buckets.wait()
            for p, context in self.contexts.items():
                reduced = buckets.reduced(p)
                if self.compression is not None:
                    reduced = self.compression.decompress(reduced, context)
                grad = p.grad
                assert grad is not None
                if grad.is_sparse:
                    p.grad = reduced.to(grad.dtype).to_sparse()
                else:
                    grad.copy_(reduced)
        finally:
            self.reset()
        self.synchronized = True


def _gradient_hook(owner: weakref.ref[_GradientSync]) -> Callable[[torch.Tensor], None]:
    """A parameter's hook that reaches its optimizer's state while the optimizer lives (a discarded
    optimizer's hooks do nothing, and are removed when its state is collected)."""

    def hook(p: torch.Tensor) -> None:
        sync = owner()
        if sync is not None:
            sync.on_gradient(p)

    return hook


def _remove_hooks(hooks: list[RemovableHandle]) -> None:
    for handle in hooks:
        handle.remove()


# -- the distributed instance ----------------------------------------------------------------------
_CLASSES: dict[type, type] = {}


def _distributed_copy(optimizer: torch.optim.Optimizer) -> Any:
    """An instance of a subclass of ``optimizer``'s class with :class:`StragglerAwareOptimizer`'s
    methods first, holding the same parameter groups, state and hooks (not constructed again: the
    optimizer's own arguments are kept, whatever its constructor needs)."""
    plain = type(optimizer)
    cls = _CLASSES.get(plain)
    if cls is None:
        cls = type(
            plain.__name__,
            (StragglerAwareOptimizer, plain),
            {"__module__": plain.__module__, "__qualname__": plain.__qualname__, "__doc__": plain.__doc__},
        )
        _CLASSES[plain] = cls
    distributed: Any = object.__new__(cls)
    # methods a learning-rate scheduler may have wrapped on the instance would bypass the class's
    vars(distributed).update({k: v for k, v in vars(optimizer).items() if k not in ("step", "zero_grad")})
    return distributed

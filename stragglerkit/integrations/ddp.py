"""PyTorch DDP communication hook: the closed loop of :mod:`stragglerkit.loop.loop` in
``model.register_comm_hook``.

The hook hands each of DDP's buckets to the loop (``bucket.buffer()``, ``bucket.index()``,
``bucket.is_last()``, averaged like DDP's own AllReduce) and returns the loop's future; the loop
does the rest (warm-up with the group's own all_reduce, probes, the stats exchange, rank 0's
decisions adopted by every rank at the same step, verification, rollback).

Faults: when a rank dies or stalls, ``loss.backward()`` raises :class:`stragglerkit.PeerError`
on every other rank within ``executor.timeout`` (plus up to 2 s of fault notes), naming it
(``err.peer``), with the library's message. (A future that DDP waits for can carry only a tensor
or torch's own error, which would read ``RuntimeError: Unable to cast ...``; so at the step's
last bucket the hook queues the loop's ``synchronize`` as an autograd callback, which runs before
DDP's own and raises the ``PeerError`` itself.) Every later hook call raises it again.

Checkpoints: the state pickles like torch's PowerSGD state (``torch.save(state, ...)``, or inside
a checkpoint dict next to the model's and optimizer's state), without its process group. In the
new processes call ``stragglerkit.init()`` first, then ``torch.load(..., weights_only=False)``
and ``model.register_comm_hook(state, stragglerkit.ddp_hook)``: the state binds to the session
of the default group at its first bucket (``state.bind(group)`` for another group) and resumes
the plan it had from the next step, with no new warm-up.

Example::

    import stragglerkit
    stragglerkit.init()                                   # every rank, once
    state = stragglerkit.DDPState(None)
    model.register_comm_hook(state, stragglerkit.ddp_hook)
    ...                                                   # train; state.algorithm, state.events, state.step
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import Variable

from stragglerkit.config import Config
from stragglerkit.loop.loop import StragglerLoop
from stragglerkit.session import session_for

__all__ = ["DDPState", "ddp_hook"]


class DDPState:
    """State of :func:`ddp_hook` for one DDP model: a :class:`~stragglerkit.loop.loop.StragglerLoop`
    on the session of ``process_group`` (``None``: the default group), which
    :func:`stragglerkit.init` must have set up on every rank first. Not collective.

    ``config``: a :class:`stragglerkit.Config` whose ``detection`` and ``report`` sections this
    model's loop uses instead of the session's (``None``: the session's).

    Example::

        stragglerkit.init()
        state = DDPState(None, stragglerkit.Config().replace(detection={"warmup_steps": 20}))
        ddp_model.register_comm_hook(state, ddp_hook)
    """

    __slots__ = (  # noqa: RUF023 (grouped: what users tune, then internal state)
        # user-tuned
        "process_group",
        # internal
        "loop",
    )

    def __init__(self, process_group: dist.ProcessGroup | None = None, config: Config | None = None) -> None:
        self.process_group = process_group
        self.loop = StragglerLoop(session_for(process_group), config, framework="ddp")

    def bind(self, process_group: dist.ProcessGroup | None = None) -> None:
        """Bind a restored state to ``process_group``'s session (``None``: the default group's);
        done on the first bucket otherwise. Every rank, after ``stragglerkit.init``."""
        self.process_group = process_group
        self.loop.bind(session_for(process_group))

    def close(self) -> None:
        """Wait for the exchange in flight and stop the controller's thread (every rank, before
        ``stragglerkit.destroy``; the hook must not run afterwards)."""
        self.loop.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"loop": self.loop}  # the loop drops its session, threads and futures

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.process_group = None
        self.loop = state["loop"]

    # -- what the training loop reads (the loop's internals: ``state.loop``) --------------------
    @property
    def algorithm(self) -> str:
        """The algorithm of the step in progress, or of the last completed one between steps."""
        return self.loop.algorithm

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every controller decision: ``{"step", "kind", "algorithm", "evidence"}``."""
        return self.loop.events

    @property
    def step(self) -> int:
        """Completed training steps (a step ends at the bucket with ``is_last()``)."""
        return self.loop.step


def ddp_hook(state: DDPState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket`` across the ranks with the loop's plan; see the module docstring.

    Example::

        ddp_model.register_comm_hook(stragglerkit.DDPState(None), stragglerkit.ddp_hook)
    """
    loop = state.loop
    if not loop.bound:
        state.bind(state.process_group)
    last = bucket.is_last()
    future = loop.all_reduce_bucket(bucket.buffer(), bucket.index(), last)
    if last:
        try:  # runs when backward ends, before DDP's own callback: a fault raises as PeerError
            Variable._execution_engine.queue_callback(loop.synchronize)
        except RuntimeError:  # called outside a backward pass: DDP's wait reports the fault
            pass
    return future


# DDP checks the hook's annotations as objects; ``from __future__ import annotations`` made them strings.
ddp_hook.__annotations__ = {"state": DDPState, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}

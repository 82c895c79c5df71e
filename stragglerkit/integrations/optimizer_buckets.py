"""Gradient buckets for the distributed optimizers (with Horovod and without): what both hand the loop.

An optimizer wrap sees one gradient at a time, when the backward pass makes it final. The loop of
:mod:`stragglerkit.loop.loop` wants large buckets, the same ones in the same order on every rank.
:class:`GradientBuckets` sits between them:

* **Layout**: the parameters cut into buckets of one dtype and device each, a bucket closing once
  it holds the cap or more (:func:`bucket_cap`: an eighth of the gradients, from 1 to 25 MiB). For
  the first step they go in reverse order (DDP's guess at the order a backward pass makes their
  gradients); after it, in the order rank 0's first step made them ready, which every rank adopts
  (DDP rebuilds its buckets the same way). Reverse registration order is often wrong inside a
  layer: a transformer block registers its input norm before its MLP, yet the norm's gradient
  comes last, so a bucket holding it waits for the whole block. ``slot_of[p]`` is ``p``'s bucket
  and its first element in the bucket's flat tensor.
* **Per step**: :meth:`GradientBuckets.grad_ready` counts ``p`` in its bucket; each bucket whose
  gradients are all ready is started, strictly in bucket order (a bucket that fills early waits
  for the ones before it), so every rank makes the same sequence of loop calls. Starting a bucket
  copies its gradients into one flat tensor (sparse ones densified), compresses it, divides it by
  the pre-divide factor and hands it to ``loop.all_reduce_bucket``; the last bucket ends the step.
* :meth:`GradientBuckets.reduced` waits for the loop (raising its
  :class:`~stragglerkit.errors.PeerError` on a fault) and returns ``p``'s slice of the reduced,
  still compressed, bucket.

:func:`check_same_parameters` is the construction-time check that every rank's optimizer holds
the same parameters (names, shapes, dtypes): run over the session's side group, it names the
first rank that differs from rank 0 and the first parameter that does, on every rank, instead of
letting the ranks build different buckets and wait for each other.

Example::

    buckets = GradientBuckets(params, loop, op="avg")
    buckets.grad_ready(p)        # from p's gradient hook, once per step
    grad = buckets.reduced(p)    # after every parameter was counted (waits for the loop)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from stragglerkit.errors import ConfigError
from stragglerkit.loop.loop import StragglerLoop

__all__ = [
    "BUCKETS_PER_STEP",
    "BUCKET_BYTES",
    "MIN_BUCKET_BYTES",
    "GradientBuckets",
    "ParameterSignature",
    "bucket_cap",
    "check_same_parameters",
    "parameter_signature",
]

BUCKET_BYTES = 25 * 1024 * 1024
"""The largest bucket cap: DDP's default bucket size (large enough for the straggler-aware
algorithms to pay, small enough to overlap the backward pass)."""
MIN_BUCKET_BYTES = 1024 * 1024
"""The smallest bucket cap (DDP's first bucket)."""
BUCKETS_PER_STEP = 8
"""The cap aims at this many buckets per step, within [MIN_BUCKET_BYTES, BUCKET_BYTES]."""


def bucket_cap(gradient_bytes: int) -> int:
    """The default cap for ``gradient_bytes`` of gradients: an eighth of them, at least 1 MiB and at
    most 25 MiB. The last bucket fills only when the backward pass ends, so its AllReduce is the
    step's tail: a model of a few 25 MiB buckets waits for a whole one after its backward pass.
    Horovod's own optimizer starts what is ready every cycle instead. Llama's 50 MiB of gradients
    (8 ranks at 1 Gbit/s) ran at 0.86x, 0.90x and 0.93x of Horovod's steady step in two 25 MiB
    buckets, and at 0.945x and 0.988x in 6 MiB ones in the order the gradients are ready.

    Example::

        bucket_cap(50 << 20) == 6.25 * 2**20;  bucket_cap(4 << 30) == 25 << 20
    """
    return min(BUCKET_BYTES, max(MIN_BUCKET_BYTES, gradient_bytes // BUCKETS_PER_STEP))


ParameterSignature = tuple[str, tuple[int, ...], str, bool]
"""What must agree across ranks for one parameter: (name, shape, dtype, requires_grad)."""


class GradientBuckets:
    """The gradients of one optimizer in buckets, handed to the loop in bucket order each step.

    ``params``: the parameters whose gradients are reduced, in the optimizer's order (the buckets
    take them reversed). ``loop``: the loop that reduces them. ``op``: ``"avg"`` or ``"sum"``.
    ``compress``: applied to each flat bucket before it is handed over (``None``: none).
    ``predivide_factor``: the bucket is divided by it before the reduction and multiplied by it
    after (Horovod's ``gradient_predivide_factor``; 1 leaves the bucket alone). ``bucket_bytes``:
    the cap (default :func:`bucket_cap` of the parameters' gradients).

    Example::

        buckets = GradientBuckets(params, loop)
        for p in reversed(params):
            buckets.grad_ready(p)
        grads = [buckets.reduced(p) for p in params]
    """

    __slots__ = (  # noqa: RUF023 (grouped: what users tune, then internal state)
        # user-tuned
        "compress",
        "op",
        "predivide_factor",
        # internal: the layout
        "bucket_bytes",
        "buckets",
        "next_layout",
        "ready_order",
        "loop",
        "slot_of",
        # internal: this step
        "next_bucket",
        "ready",
        "results",
        "starting",
    )

    def __init__(
        self,
        params: Sequence[torch.Tensor],
        loop: StragglerLoop,
        op: str = "avg",
        compress: Callable[[torch.Tensor], torch.Tensor] | None = None,
        *,
        predivide_factor: float = 1.0,
        bucket_bytes: int | None = None,
    ) -> None:
        if op not in ("avg", "sum"):
            raise ConfigError(f"op must be 'avg' or 'sum', got {op!r}")
        self.loop = loop
        self.op = op
        self.compress = compress
        self.predivide_factor = float(predivide_factor)
        total = sum(p.numel() * p.element_size() for p in params)
        self.bucket_bytes = bucket_cap(total) if bucket_bytes is None else bucket_bytes
        self.buckets: list[list[torch.Tensor]] = []
        self.slot_of: dict[torch.Tensor, tuple[int, int]] = {}
        """parameter -> (its bucket, its first element in the bucket's flat tensor)"""
        self._lay_out(list(reversed(params)))
        self.next_bucket = 0
        self.starting = 0
        """The bucket being handed to the loop (a baseline that names its calls reads it)."""
        self.ready_order: list[torch.Tensor] | None = []
        """The order this step's gradients became ready, while the first step runs (None after)."""
        self.next_layout: list[torch.Tensor] | None = None
        """Rank 0's ready order, adopted when the next step's first gradient arrives."""

    def _lay_out(self, ordered: list[torch.Tensor]) -> None:
        """Cut ``ordered`` into buckets, in that order."""
        self.buckets = []
        size = 0
        # As DDP fills its buckets: a bucket closes once it holds bucket_bytes or more, so a layer
        # larger than the cap joins the small layers before it rather than leaving them a tiny
        # first bucket. That first bucket is where a late rank's delay lands; closing a bucket
        # before the cap instead measured 1.05x, not 1.1x, against plain Horovod with a straggler
        # (8 ranks, 32 MiB MLP: StragglAR ran on a 0.18 MiB bucket and the 29 MiB one waited).
        for p in ordered:
            previous = self.buckets[-1][-1] if self.buckets else None
            same_kind = previous is not None and (previous.dtype, previous.device) == (p.dtype, p.device)
            if not same_kind or size >= self.bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.slot_of = {}
        for b, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.slot_of[p] = (b, offset)
                offset += p.numel()
        self.ready = [0] * len(self.buckets)
        self.results: list[torch.futures.Future[torch.Tensor] | None] = [None] * len(self.buckets)

    @property
    def order(self) -> list[torch.Tensor]:
        """Every parameter, in bucket order (the order the buckets start in)."""
        return [p for bucket in self.buckets for p in bucket]

    def grad_ready(self, p: torch.Tensor) -> None:
        """``p``'s gradient is final for this step: count it and start every full bucket in order."""
        if self.next_layout is not None and self.next_bucket == 0 and not any(self.ready):
            self._lay_out(self.next_layout)  # the step's first gradient: the last step's buckets are read
            self.next_layout = None
        if self.ready_order is not None:
            self.ready_order.append(p)
        self.ready[self.slot_of[p][0]] += 1
        while self.next_bucket < len(self.buckets) and self.ready[self.next_bucket] == len(
            self.buckets[self.next_bucket]
        ):
            self._start(self.next_bucket)
            self.next_bucket += 1
        if self.next_bucket == len(self.buckets):  # every bucket of the step is on its way
            self.ready = [0] * len(self.buckets)
            self.next_bucket = 0
            if self.ready_order is not None:
                self._learn_layout(self.ready_order)
                self.ready_order = None

    def _learn_layout(self, seen: list[torch.Tensor]) -> None:
        """After the first step: every rank takes rank 0's ready order for the next step's layout
        (collective on the session's side group; every rank ends its first step here). ``seen``
        holds every parameter once, and the ranks' parameters agree (:func:`check_same_parameters`
        at construction), so rank 0's order, as positions in the current layout, fits every rank."""
        current = self.order
        index = {p: i for i, p in enumerate(current)}
        shared: list[Any] = [[index[p] for p in seen]]
        if self.loop.world_size > 1:
            dist.broadcast_object_list(shared, src=0, group=self.loop.session.side_group)
        order: list[int] = shared[0]
        if order != sorted(order):
            self.next_layout = [current[i] for i in order]

    def _start(self, bucket: int) -> None:
        grads = []
        for p in self.buckets[bucket]:
            grad = p.grad
            assert grad is not None
            grads.append((grad.to_dense() if grad.is_sparse else grad).reshape(-1))
        flat = torch.cat(grads)
        if self.compress is not None:
            flat = self.compress(flat)
        scaled = self.predivide_factor != 1.0
        if scaled:
            flat.div_(self.predivide_factor)
        self.starting = bucket
        future = self.loop.all_reduce_bucket(flat, bucket, bucket == len(self.buckets) - 1, self.op)
        if scaled:
            factor = self.predivide_factor
            future = future.then(lambda done: done.value().mul_(factor))
        self.results[bucket] = future

    def wait(self) -> None:
        """Wait for every bucket handed to the loop; raise its :class:`PeerError` on a fault."""
        self.loop.synchronize()  # a fault raises here as the loop's PeerError, naming the rank

    def reduced(self, p: torch.Tensor) -> torch.Tensor:
        """``p``'s reduced gradient (still compressed), shaped like ``p``; waits for the loop."""
        bucket, offset = self.slot_of[p]
        future = self.results[bucket]
        if future is None:
            raise RuntimeError(f"stragglerkit: bucket {bucket} was never started (internal error)")
        self.wait()
        return future.wait()[offset : offset + p.numel()].view(p.shape)


def parameter_signature(named: Iterable[tuple[str, torch.Tensor]]) -> list[ParameterSignature]:
    """Per parameter, in the given order, what must agree across ranks (values need not)."""
    return [(name, tuple(p.shape), str(p.dtype).removeprefix("torch."), bool(p.requires_grad)) for name, p in named]


def check_same_parameters(
    signature: list[ParameterSignature] | None,
    group: dist.ProcessGroup,
    what: str,
    local_error: BaseException | None = None,
) -> None:
    """Collective over ``group``: raise on every rank if a rank's parameters differ from rank 0's.

    ``signature``: this rank's :func:`parameter_signature`; ``local_error``: what this rank's own
    checks of its arguments raised (then ``signature`` is ``None``), so that the other ranks raise
    a :class:`ConfigError` naming it instead of waiting for it; this rank raises ``local_error``
    itself. ``what``: the call, for the messages."""
    refusal = None if local_error is None else f"{type(local_error).__name__}: {local_error}"
    mine = {"signature": signature, "error": refusal}
    everyone: list[dict[str, Any] | None] = [None] * group.size()
    dist.all_gather_object(everyone, mine, group=group)
    if local_error is not None:
        raise local_error
    refused = [(rank, theirs["error"]) for rank, theirs in enumerate(everyone) if theirs and theirs["error"]]
    if refused:
        rank, error = refused[0]
        raise ConfigError(
            f"{what}: rank {rank} refused its arguments ({error}); give every rank the same, valid arguments"
        )
    reference: list[ParameterSignature] = (everyone[0] or {})["signature"]
    for rank, theirs in enumerate(everyone):
        other: list[ParameterSignature] = (theirs or {})["signature"]
        if other != reference:
            raise ConfigError(f"{what}: {_first_difference(rank, other, reference)}")


def _first_difference(rank: int, other: list[ParameterSignature], reference: list[ParameterSignature]) -> str:
    """How rank ``rank``'s parameters first differ from rank 0's, and what to do, in one sentence."""

    def describe(signature: ParameterSignature) -> str:
        name, shape, dtype, requires_grad = signature
        return f"{name!r} of shape {tuple(shape)} {dtype}{'' if requires_grad else ' (no grad)'}"

    index = next(i for i, (a, b) in enumerate(zip([*other, None], [*reference, None])) if a != b)
    if index >= len(other):
        detail = f"rank 0 has {describe(reference[index])} there, rank {rank} has no parameter"
    elif index >= len(reference):
        detail = f"rank {rank} has {describe(other[index])} there, rank 0 has no parameter"
    else:
        detail = f"rank {rank} has {describe(other[index])}, rank 0 has {describe(reference[index])}"
    counts = (
        ""
        if len(other) == len(reference)
        else f" (rank {rank} has {len(other)} parameters, rank 0 has {len(reference)})"
    )
    return (
        f"the optimizer's parameters differ between rank {rank} and rank 0{counts}; the first difference is "
        f"parameter {index}: {detail}. Build the same model and optimizer on every rank (the values may "
        "differ until they are broadcast)"
    )

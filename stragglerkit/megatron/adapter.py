"""megatron-core's bucket groups through the closed loop of :mod:`stragglerkit.loop.loop`.

megatron-core's ``DistributedDataParallel`` keeps the gradients in contiguous buffers cut into
buckets, and the buckets into *bucket groups*. Every gradient synchronisation of a bucket group
goes through one method, ``_ParamAndGradBucketGroup.start_grad_sync``: the backward hooks call it
(``register_grad_ready``, with ``overlap_grad_reduce``), ``finish_grad_sync`` calls it (without
overlap, and in the first batch), and so does the model's ``start_grad_sync``. :func:`install`
gives each bucket group of the model an instance attribute of that name (the class is left
alone), which keeps megatron-core's rules and hands the buckets to the loop:

* the first-batch no-op (a group whose collective was dispatched already in the first batch is not
  dispatched again) and the one-outstanding-collective check, with megatron-core's message;
* ``check_for_nan_in_grad`` / ``check_for_large_grads`` through the group's own ``check_grads``;
* each bucket's ``grad_data`` scaled by its ``gradient_scaling_factor`` first, then summed
  (``op="sum"``), or averaged with ``average_in_collective`` (``op="avg"``);
* asynchronous only with ``overlap_grad_reduce``: the group's ``grad_reduce_handle`` is a
  :class:`GradSyncHandle` whose ``wait()`` megatron-core's ``finish_grad_sync`` calls; without
  overlap the call returns when the buckets hold the result and the handle stays ``None``;
* micro-batches under ``no_sync`` never reach it (megatron-core does not call it for them);
* over the bucket group's own collective group, the data-parallel group (times context
  parallel), never the world. :func:`stragglerkit.init` is called for that group if it was not.

The loop sees one bucket per megatron-core bucket (its index: the bucket's position among the
model's bucket groups) and a step that ends when every bucket group of the model has started once.
While nothing is wrong each bucket runs megatron-core's own collective (``all_reduce`` with
``ReduceOp.SUM`` or ``ReduceOp.AVG`` over the data-parallel group), so the flag costs only the
loop's bookkeeping; when the loop decides, every data-parallel rank switches
at the same step to StragglAR, OptCC or the balanced ring, with verification and rollback.

Not routed, with one note in the event log each (and one warning): the distributed optimizer's
reduce-scatter (``use_distributed_optimizer``), which keeps megatron-core's own collective, and the
expert-parallel bucket groups of MoE models (another group, megatron-core's own collective).

Example::

    model = DistributedDataParallel(transformer_config, ddp_config, model)
    state = stragglerkit.megatron.install(model, args)    # None when the flag is off
    ...                                                  # train; state.step, state.algorithm, state.events
    state.close()                                        # every rank, at the end
"""

from __future__ import annotations

import argparse
import functools
import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from stragglerkit import api
from stragglerkit.config import Config
from stragglerkit.errors import ConfigError, StragglerKitError
from stragglerkit.loop.loop import StragglerLoop
from stragglerkit.megatron.compat import check_bucket_group, check_megatron_core
from stragglerkit.megatron.config import MegatronConfig
from stragglerkit.plans import log_path_for
from stragglerkit.session import Session, session_for
from stragglerkit.telemetry import nvtx

__all__ = ["GradSyncHandle", "MegatronState", "install", "installed"]

_STATE_ATTRIBUTE = "_stragglerkit_megatron"
"""Where an installed model keeps its state (what makes :func:`install` idempotent)."""
_OUTSTANDING = "Should not have multiple communication calls outstanding at once"
"""megatron-core's own message for a second collective while one is in flight."""


class GradSyncHandle:
    """A bucket group's ``grad_reduce_handle``: the loop's futures for its buckets.

    ``wait()`` returns when every bucket holds its result; the handle of the group that ended the
    step also waits for the step's other buckets (``loop.synchronize()``). A fault raises the
    loop's :class:`~stragglerkit.PeerError`, naming the rank at fault.
    """

    __slots__ = ("ends_step", "futures", "loop")

    def __init__(self, loop: StragglerLoop, futures: list[torch.futures.Future[torch.Tensor]], ends_step: bool) -> None:
        self.loop = loop
        self.futures = futures
        self.ends_step = ends_step

    def wait(self) -> None:
        error: BaseException | None = None
        with nvtx.range(nvtx.WAIT):  # finish_grad_sync waiting for the group's buckets
            for future in self.futures:
                try:
                    future.wait()
                except Exception as err:
                    error = error or err
        if self.loop.failure is not None:
            raise self.loop.failure
        if error is not None:
            raise error
        if self.ends_step:
            self.loop.synchronize()

    def is_completed(self) -> bool:
        return all(future.done() for future in self.futures)


class MegatronState:
    """What :func:`install` set up for one model: its loop and its routed bucket groups.

    Example::

        state = install(model, MegatronConfig(straggler_aware_allreduce=True))
        print(state.step, state.algorithm, state.events)
    """

    __slots__ = (  # noqa: RUF023 (grouped: what users read, then internal state)
        # what users read
        "config",
        "loop",
        "notes",
        # internal
        "_chunks",
        "_first_index",
        "_group",
        "_made_session",
        "_routed",
        "_started",
    )

    def __init__(
        self,
        config: MegatronConfig,
        chunks: list[Any],
        routed: list[Any],
        group: dist.ProcessGroup,
        loop: StragglerLoop | None,
        made_session: bool,
    ) -> None:
        self.config = config
        self.loop = loop
        """The closed loop (``None`` when no bucket group is routed: the distributed optimizer)."""
        self.notes: list[dict[str, Any]] = []
        """What the integration left to megatron-core, as written to the event log."""
        self._chunks = chunks
        self._routed = routed
        self._group = group
        self._made_session = made_session
        self._started: set[int] = set()
        self._first_index: dict[int, int] = {}
        index = 0
        for bucket_group in routed:
            self._first_index[id(bucket_group)] = index
            index += len(bucket_group.buckets)

    # -- what the training loop reads -----------------------------------------------------------
    @property
    def buckets(self) -> int:
        """Buckets that go through the loop (0: none, e.g. with the distributed optimizer)."""
        return sum(len(group.buckets) for group in self._routed)

    @property
    def bucket_groups(self) -> int:
        """Bucket groups that go through the loop."""
        return len(self._routed)

    @property
    def step(self) -> int:
        """Completed steps (a step ends when every routed bucket group has started once)."""
        return self.loop.step if self.loop is not None else 0

    @property
    def algorithm(self) -> str:
        """The algorithm of the step in progress, or of the last completed one between steps
        (``allreduce``: megatron-core's own; ``reduce_scatter`` when nothing is routed)."""
        return self.loop.algorithm if self.loop is not None else "reduce_scatter"

    @property
    def events(self) -> list[dict[str, Any]]:
        """The notes, then every controller decision (``{"step", "kind", "algorithm", "evidence"}``)."""
        return self.notes + (self.loop.events if self.loop is not None else [])

    @property
    def group(self) -> dist.ProcessGroup:
        """The data-parallel group the buckets are reduced over."""
        return self._group

    def close(self) -> None:
        """Give the bucket groups megatron-core's own ``start_grad_sync`` back, wait for the
        loop's exchange in flight and stop its thread; forget the stragglerkit session if
        :func:`install` created it. Every data-parallel rank, between steps."""
        for bucket_group in self._routed:
            if bucket_group.grad_reduce_handle is not None:
                raise StragglerKitError(
                    "stragglerkit.megatron: close() while a gradient synchronisation is in flight; call "
                    "finish_grad_sync() first"
                )
        for bucket_group in self._routed:
            bucket_group.__dict__.pop("start_grad_sync", None)
        for chunk in self._chunks:
            chunk.__dict__.pop(_STATE_ATTRIBUTE, None)
        if self.loop is not None:
            self.loop.close()
        if self._made_session:
            api.destroy(self._group)
            self._made_session = False
        self._routed = []

    # -- the wrapped method --------------------------------------------------------------------------
    def start_grad_sync(self, bucket_group: Any, force_all_reduce: bool | None = False) -> None:
        """``bucket_group.start_grad_sync`` (see the module docstring). ``force_all_reduce``
        changes nothing without the distributed optimizer, as in megatron-core."""
        if bucket_group.is_first_batch and bucket_group.grad_reduce_handle is not None:
            return  # megatron-core: dispatched already in the first batch
        if bucket_group.grad_reduce_handle is not None:
            raise AssertionError(_OUTSTANDING)
        loop = self.loop
        assert loop is not None
        ddp_config = bucket_group.ddp_config
        if ddp_config.check_for_nan_in_grad or ddp_config.check_for_large_grads:
            bucket_group.check_grads(
                check_for_nan_or_inf=ddp_config.check_for_nan_in_grad, check_for_large=ddp_config.check_for_large_grads
            )
        for bucket in bucket_group.buckets:
            if bucket.gradient_scaling_factor != 1.0:
                bucket.grad_data *= bucket.gradient_scaling_factor
        op = "avg" if ddp_config.average_in_collective else "sum"
        key = id(bucket_group)
        if key in self._started:
            raise StragglerKitError(
                f"stragglerkit.megatron: a bucket group started its gradient synchronisation twice in step "
                f"{loop.step} before the other {len(self._routed) - len(self._started)} group(s) started theirs; "
                "every bucket group must synchronise once per step (finish_grad_sync once per step)"
            )
        self._started.add(key)
        ends_step = len(self._started) == len(self._routed)
        if ends_step:
            self._started.clear()
        first = self._first_index[key]
        buckets = bucket_group.buckets
        futures = [
            loop.all_reduce_bucket(bucket.grad_data, first + k, ends_step and k == len(buckets) - 1, op)
            for k, bucket in enumerate(buckets)
        ]
        handle = GradSyncHandle(loop, futures, ends_step)
        if ddp_config.overlap_grad_reduce:
            bucket_group.grad_reduce_handle = handle
        else:
            handle.wait()
            bucket_group.grad_reduce_handle = None

    # -- notes ------------------------------------------------------------------------------------
    def note(self, kind: str, evidence: dict[str, Any], event_log: str | None, rank: int) -> None:
        """Record what was left to megatron-core: in :attr:`notes`, the event log (data-parallel
        rank 0, or every rank with ``{rank}`` in its path) and a warning on rank 0."""
        event = {"step": self.step, "kind": kind, "algorithm": "megatron-core", "evidence": evidence}
        self.notes.append(event)
        path = log_path_for(event_log, rank)
        if path is not None:
            with open(path, "a", encoding="utf-8") as log:
                log.write(json.dumps(event, sort_keys=True) + "\n")
        if rank == 0:
            warnings.warn(f"stragglerkit.megatron: {evidence['why']}", UserWarning, stacklevel=3)


def installed(model: Any) -> MegatronState | None:
    """The state :func:`install` left on ``model`` (a DDP chunk or a list of them), or ``None``."""
    chunks = model if isinstance(model, list | tuple) else [model]
    return chunks[0].__dict__.get(_STATE_ATTRIBUTE) if chunks else None


def install(
    model: Any, settings: MegatronConfig | argparse.Namespace | Mapping[str, Any] | None = None
) -> MegatronState | None:
    """Route ``model``'s gradient synchronisation through stragglerkit's closed loop.

    ``model``: megatron-core's ``DistributedDataParallel``, or the list of them Megatron-LM's
    ``get_model`` returns (one per model chunk). ``settings``: Megatron-LM's ``args`` (with
    :func:`~stragglerkit.megatron.add_arguments`' options), a :class:`MegatronConfig`, a mapping
    (its YAML section) or ``None`` (on, with the session's configuration).

    Collective over the data-parallel group when it is on (it may call ``stragglerkit.init``):
    every rank calls it at the same point, after the model is wrapped and before its first
    backward pass. When it is off it returns ``None`` and changes and checks nothing. A second
    call on the same model returns the first call's state. Raises
    :class:`~stragglerkit.ConfigError` for an unsupported megatron-core (naming its version), a
    model that is not megatron-core's ``DistributedDataParallel``, and a data-parallel group of one
    rank.

    Example::

        model = DistributedDataParallel(config, ddp_config, module)
        state = install(model, MegatronConfig(straggler_aware_allreduce=True))
    """
    config = MegatronConfig.resolve(settings)
    if not config.straggler_aware_allreduce:
        return None
    version = check_megatron_core()
    chunks = _chunks(model)
    existing = chunks[0].__dict__.get(_STATE_ATTRIBUTE)
    if existing is not None:
        return existing
    if any(chunk.__dict__.get(_STATE_ATTRIBUTE) is not None for chunk in chunks):
        raise ConfigError(
            "stragglerkit.megatron.install: some of these model chunks were installed already with others; "
            "install the whole list of chunks at once"
        )
    dense = [group for chunk in chunks for group in chunk.bucket_groups]
    experts = [group for chunk in chunks for group in chunk.expert_parallel_bucket_groups]
    for bucket_group in dense + experts:
        check_bucket_group(bucket_group, version)
    ddp_config = chunks[0].ddp_config
    distributed_optimizer = bool(ddp_config.use_distributed_optimizer)
    group = _data_parallel_group(chunks, dense, distributed_optimizer)
    if group.size() == 1:
        raise ConfigError(
            "--straggler-aware-allreduce: the data-parallel group has one rank, so there is no gradient "
            "AllReduce to make straggler-aware; run with a data-parallel size of 2 or more, or without the flag"
        )
    event_log = _event_log(config, group)
    if distributed_optimizer:
        state = MegatronState(config, chunks, [], group, None, made_session=False)
        state.note(
            "megatron_reduce_scatter",
            {
                "why": "use_distributed_optimizer reduce-scatters the gradient buckets; megatron-core's own "
                "reduce-scatter runs for them, not the straggler-aware AllReduce",
                "bucket_groups": len(dense),
            },
            event_log,
            group.rank(),
        )
        _mark(chunks, state)
        return state
    made_session = False
    if not api.is_initialized(group):
        api.init(group=group, config=config.config)
        made_session = True
    session = session_for(group)
    loop = StragglerLoop(session, config.config, framework="megatron")
    loop.baseline = functools.partial(_megatron_all_reduce, session)
    state = MegatronState(config, chunks, dense, group, loop, made_session)
    for bucket_group in dense:
        bucket_group.start_grad_sync = functools.partial(state.start_grad_sync, bucket_group)
    if experts:
        state.note(
            "megatron_expert_parallel",
            {
                "why": "the expert-parallel bucket groups reduce over the expert data-parallel group; "
                "megatron-core's own collective runs for them",
                "bucket_groups": len(experts),
            },
            event_log,
            group.rank(),
        )
    _mark(chunks, state)
    return state


def _chunks(model: Any) -> list[Any]:
    """``model`` as a list of megatron-core DDP chunks, or a ConfigError naming what it is."""
    from megatron.core.distributed import DistributedDataParallel

    chunks = list(model) if isinstance(model, list | tuple) else [model]
    if not chunks:
        raise ConfigError("stragglerkit.megatron.install: the list of model chunks is empty")
    for chunk in chunks:
        if not isinstance(chunk, DistributedDataParallel):
            kind = f"{type(chunk).__module__}.{type(chunk).__qualname__}"
            hint = (
                "for torch's DistributedDataParallel use stragglerkit.ddp_hook"
                if isinstance(chunk, torch.nn.parallel.DistributedDataParallel)
                else "wrap it first (DistributedDataParallel(config, ddp_config, module)) and install the wrapped model"
            )
            raise ConfigError(
                "--straggler-aware-allreduce works on megatron-core's DistributedDataParallel "
                f"(megatron.core.distributed.DistributedDataParallel), got {kind}: {hint}"
            )
    return chunks


def _data_parallel_group(chunks: Sequence[Any], dense: Sequence[Any], distributed_optimizer: bool) -> dist.ProcessGroup:
    """The one group every dense bucket group reduces over (the data-parallel group)."""
    if distributed_optimizer:
        groups = [g.intra_distributed_optimizer_instance_group for g in dense]
    else:
        groups = [g.data_parallel_group for g in dense]
    if not groups:
        groups = [chunk.intra_dp_cp_group for chunk in chunks]
    first = groups[0]
    if any(g is not first for g in groups):
        raise ConfigError(
            "stragglerkit.megatron.install: the model's bucket groups reduce over different process groups; "
            "install each model (each data-parallel group) on its own"
        )
    return first


def _event_log(config: MegatronConfig, group: dist.ProcessGroup) -> str | None:
    """Where the integration's notes go: the configured event log (the session's if there is one)."""
    if config.config is not None:
        return config.config.report.event_log
    if api.is_initialized(group):
        return session_for(group).config.report.event_log
    return Config.from_env().report.event_log


def _mark(chunks: Sequence[Any], state: MegatronState) -> None:
    for chunk in chunks:
        chunk.__dict__[_STATE_ATTRIBUTE] = state


def _megatron_all_reduce(session: Session, tensor: torch.Tensor, op: str) -> torch.futures.Future[Any]:
    """The loop's baseline: megatron-core's own collective for the bucket, ``all_reduce`` with
    ``ReduceOp.SUM`` or ``ReduceOp.AVG`` over the data-parallel group (with gloo, the session's
    twin of it, which has the configured timeout)."""
    reduce_op = dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM
    profiled = nvtx.start(nvtx.ALL_REDUCE, "process_group", cross_thread=True)
    work = dist.all_reduce(tensor, op=reduce_op, group=session.allreduce_group, async_op=True)
    assert work is not None
    future = work.get_future()
    if profiled is not None:
        future.add_done_callback(lambda _: nvtx.end(profiled))
    return future

"""The public functions: ``init`` once, then ``all_reduce`` as with ``torch.distributed``.

A program written for ``torch.distributed.all_reduce`` runs with ``stragglerkit.all_reduce`` after
one initialisation call: the same positional arguments (``tensor, op, group, async_op``), the
same ``ReduceOp`` values, ``None`` or a Work object back. stragglerkit's own choices are
keyword-only: ``algorithm`` (``"auto"`` or a registered name), ``straggler`` (a rank known to
arrive late) and ``slowdowns`` (rank -> NIC slowdown l).

Nothing collective happens behind the user's back: :func:`init` is the one collective call (it
creates the runtime's and the closed loop's side groups, checks the configuration across ranks
and measures clock offsets). Every later call is an AllReduce that every rank makes in the same
order, as with torch.

Example::

    import torch.distributed as dist
    import stragglerkit

    dist.init_process_group("gloo")
    stragglerkit.init()                                          # every rank, once
    stragglerkit.all_reduce(grad)                                # like dist.all_reduce(grad)
    work = stragglerkit.all_reduce(grad, dist.ReduceOp.AVG, None, True)
    work.wait()
    stragglerkit.all_reduce(grad, algorithm="stragglar", straggler=5)
    print(stragglerkit.last_run().algorithm)                     # what ran on this rank
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping

import torch
import torch.distributed as dist

from stragglerkit import session as _session
from stragglerkit.config import Config
from stragglerkit.errors import ConfigError
from stragglerkit.runtime.calls import AllReduceCall, AllReduceHandle, RunRecord
from stragglerkit.telemetry import nvtx  # installs the runtime's profiler ranges (runtime/hooks.py)

__all__ = ["Work", "all_reduce", "destroy", "init", "is_initialized", "last_run"]

_OPS_BY_NAME = {"SUM": "sum", "AVG": "avg"}


def init(group: dist.ProcessGroup | None = None, config: Config | None = None) -> None:
    """Set stragglerkit up on ``group`` (default: the default group). Collective: every rank of
    the group calls it once, after ``dist.init_process_group``, with the same configuration.

    ``config``: a :class:`stragglerkit.Config`; ``None`` takes ``STRAGGLERKIT_CONFIG``'s YAML file
    if set, else the defaults. The per-job environment variables (docs/configuration.md) override
    single fields of either. Raises :class:`~stragglerkit.ConfigError` on every rank when a value
    is bad or the ranks' configurations differ (naming the ranks).

    Example::

        stragglerkit.init(config=stragglerkit.Config.from_yaml("configs/long_job.yaml"))
    """
    try:
        resolved = Config.from_env() if config is None else config.with_env()
    except ConfigError as err:  # the other ranks are in init's collective steps: tell them
        _session.refuse(group, err)
    nvtx.configure(resolved.report.nvtx)
    _session.create(group, resolved)


def is_initialized(group: dist.ProcessGroup | None = None) -> bool:
    """Whether :func:`init` was called for ``group`` on this rank."""
    return _session.is_initialized(group)


def destroy(group: dist.ProcessGroup | None = None) -> None:
    """Undo :func:`init` for ``group`` on this rank (waits for queued calls; not collective).
    Call it before ``dist.destroy_process_group``; ``init`` may be called again afterwards."""
    _session.destroy(group)


class Work:
    """A pending asynchronous :func:`all_reduce`, like the Work torch returns.

    ``wait()`` blocks until the tensor holds the result (raising the call's error, e.g.
    :class:`~stragglerkit.PeerError`), ``is_completed()`` does not block, ``get_future()`` is a
    ``torch.futures.Future`` whose value is ``[tensor]``, as torch's is.
    """

    __slots__ = ("_future", "_handle")

    def __init__(self, handle: AllReduceHandle) -> None:
        self._handle = handle
        self._future: torch.futures.Future[list[torch.Tensor]] = handle.future.then(lambda done: [done.value()])

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done; ``True`` on success (the error is raised otherwise)."""
        try:
            self._handle.wait(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the AllReduce did not finish within {timeout} s (it is still running)") from None
        # The call's callbacks complete the future just after the call itself: wait for them too,
        # so that get_future().value() holds the tensor once wait() returned, as with torch.
        self._future.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        """Completed without an error."""
        return self._handle.is_completed() and self._handle.exception() is None

    def exception(self) -> BaseException | None:
        """The call's error once completed, else ``None``."""
        return self._handle.exception() if self._handle.is_completed() else None

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future

    def result(self) -> RunRecord:
        """What ran (waits): algorithm and per-op timings, as :func:`last_run` gives."""
        return self._handle.wait()


def _op_name(op: object) -> str:
    """torch's ReduceOp (or its RedOpType, or ``"sum"``/``"avg"``) as the runtime's name. Any other
    op comes back as its own name, which the runtime refuses on this rank and reports to the others
    (so no rank is left waiting)."""
    if isinstance(op, str):
        return op.strip().lower()
    if isinstance(op, dist.ReduceOp):
        for known, ours in _OPS_BY_NAME.items():
            if op == getattr(dist.ReduceOp, known):
                return ours
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    return _OPS_BY_NAME.get(str(name), f"ReduceOp.{name}")


def all_reduce(
    tensor: torch.Tensor,
    op: object = dist.ReduceOp.SUM,
    group: dist.ProcessGroup | None = None,
    async_op: bool = False,
    *,
    algorithm: str = "auto",
    straggler: int | None = None,
    slowdowns: Mapping[int, float] | None = None,
) -> Work | None:
    """In-place AllReduce of ``tensor`` over ``group``, with ``torch.distributed.all_reduce``'s signature.

    ``op``: ``ReduceOp.SUM`` or ``ReduceOp.AVG``. ``async_op``: return a :class:`Work` at once
    instead of blocking. ``algorithm``: ``"auto"`` or one of ring, rhd, direct, stragglar, optcc,
    balanced_ring (one that does not apply falls back to what ``auto`` picks, with a warning
    saying why). ``straggler``: group rank known to arrive late; ``slowdowns``: group rank -> NIC
    slowdown ``l`` (1 = healthy). Every rank passes a tensor of the same size and dtype and the
    same arguments. Bad arguments raise ``ValueError`` (a :class:`~stragglerkit.ConfigError`) on
    this rank and :class:`~stragglerkit.PeerError` naming it on the others; a peer that dies or
    stalls raises :class:`~stragglerkit.PeerError` naming it within ``executor.timeout``.

    The result is bit-identical on every rank. What ran is :func:`last_run`.

    Example::

        stragglerkit.all_reduce(grad)                                   # sum, blocking
        work = stragglerkit.all_reduce(grad, dist.ReduceOp.AVG, None, True)
        work.wait()
    """
    runtime = _session.session_for(group).runtime
    call = AllReduceCall(tensor, algorithm, _op_name(op), straggler, slowdowns)
    if async_op:
        return Work(runtime.start(call))
    runtime.run(call)
    return None


def last_run(group: dist.ProcessGroup | None = None) -> RunRecord | None:
    """What the last completed :func:`all_reduce` on ``group`` ran on this rank (``None`` before
    the first): ``algorithm``, the ``requested`` one, the lowered ``plan`` and per-op ``timings``
    (peer, bytes, post and completion times)."""
    return _session.session_for(group).runtime.last_run

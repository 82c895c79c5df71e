"""Horovod: ``hvd.DistributedOptimizer`` with stragglerkit's closed loop.

``stragglerkit.horovod.DistributedOptimizer`` takes ``hvd.DistributedOptimizer``'s arguments and
behaves like it: it *is* Horovod's optimizer class (broadcasts, ``synchronize()``,
``skip_synchronize()``, ``backward_passes_per_step``, its checks and messages), with one method
changed: where Horovod hands each gradient to its allreduce, this one collects the gradients in
buckets (an eighth of the gradients each, from 1 to 25 MiB, in the order the first step made them
ready: :mod:`stragglerkit.integrations.optimizer_buckets`) and hands each full bucket, in bucket
order, to the loop of :mod:`stragglerkit.loop.loop`.
While nothing is wrong the loop's baseline is Horovod's own allreduce of the bucket (its fusion,
compression, averaging and pre/post-scaling); when the loop finds a persistent straggler or a
degraded NIC, the buckets switch at the same step on every rank to StragglAR / OptCC / the
balanced ring through the executor, with the same verification and rollback as for DDP.
Compression applies on both paths (the bucket is compressed before either reduces it). The
buckets are :mod:`stragglerkit.integrations.optimizer_buckets`', which the optimizer without
Horovod (:mod:`stragglerkit.integrations.optimizer`) uses too.

Making the optimizer is collective: the ranks compare their optimizers' parameters (name, shape,
dtype, requires_grad) on the session's side group, and a rank whose parameters differ from rank
0's is named on every rank with the first parameter that differs (a :class:`ConfigError`); a
rank whose arguments fail Horovod's own checks raises Horovod's error and the others name it.

The executor needs a torch.distributed group over Horovod's ranks. If none exists, the first
optimizer makes one: rank 0 opens a TCP store on the address of Horovod's Gloo interface
(``HOROVOD_GLOO_IFACE``, as ``horovodrun`` sets it; else ``HOROVOD_HOSTNAME``), sends its address
and port to the others with ``hvd.broadcast_object`` and every rank joins a gloo group with
Horovod's rank and size; then ``stragglerkit.init()`` runs. So it works across hosts wherever
Horovod's own Gloo does. An existing default group must have Horovod's ranks.

Horovod's own optimizer, unchanged, serves what the loop does not cover, with a warning saying
why: ``op=hvd.Adasum``, ``groups``/``num_groups``, a process set other than the global one, and a
world of one rank (no warning there).

Example::

    import horovod.torch as hvd
    import stragglerkit.horovod
    hvd.init()
    optimizer = stragglerkit.horovod.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import os
import socket
import struct
import time
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

try:
    import horovod.torch as hvd
    from horovod.torch.compression import Compression
    from horovod.torch.mpi_ops import Adasum, Average, Sum, global_process_set
    from horovod.torch.optimizer import DistributedOptimizer as _horovods_optimizer
    from horovod.torch.optimizer import _DistributedOptimizer
except ImportError as _err:  # pragma: no cover - depends on the installation
    raise ImportError(
        "stragglerkit.horovod needs Horovod (horovod.torch): bash scripts/install_horovod.sh builds and installs "
        f"Horovod 0.28.1 for this torch ({_err})"
    ) from _err

from stragglerkit.config import Config
from stragglerkit.errors import ConfigError
from stragglerkit.integrations.optimizer_buckets import (
    BUCKET_BYTES,
    GradientBuckets,
    check_same_parameters,
    parameter_signature,
)
from stragglerkit.loop.loop import StragglerLoop
from stragglerkit.telemetry import nvtx

__all__ = ["BUCKET_BYTES", "DistributedOptimizer"]

_HOROVOD_PATH_WARNED: set[str] = set()


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: Any = Compression.none,
    backward_passes_per_step: int = 1,
    op: Any = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = global_process_set,
    *,
    config: Config | None = None,
) -> torch.optim.Optimizer:
    """``hvd.DistributedOptimizer`` (same arguments, same meaning) whose gradients go through
    stragglerkit's closed loop; ``config`` is stragglerkit's (default: the session's)."""
    hvd.size()  # Horovod's own error if hvd.init() was not called
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=2,
        )
        groups = groups if groups is not None else num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    # in the order of Horovod's optimizer class's constructor, after the parameter groups
    arguments = {
        "named_parameters": named_parameters,
        "compression": compression,
        "backward_passes_per_step": backward_passes_per_step,
        "op": op,
        "gradient_predivide_factor": gradient_predivide_factor,
        "groups": groups,
        "sparse_as_dense": sparse_as_dense,
        "process_set": process_set,
    }
    why = _horovod_path_reason(op, groups, process_set)
    if why is not None:
        if hvd.size() > 1 and why not in _HOROVOD_PATH_WARNED:
            _HOROVOD_PATH_WARNED.add(why)
            warnings.warn(f"stragglerkit: {why}: Horovod's own optimizer runs unchanged", stacklevel=2)
        return _horovods_optimizer(optimizer, **arguments)  # Horovod's, even where hvd's name was rebound to ours
    session = _horovod_session(config)
    loop = StragglerLoop(session, config, framework="horovod")
    name = optimizer.__class__.__name__
    cls = type(name, (optimizer.__class__,), {**_DistributedOptimizer.__dict__, **_OVERRIDES})
    distributed: Any = None
    signature = None
    try:
        distributed = cls(optimizer.param_groups, *arguments.values())  # Horovod's checks, Horovod's messages
        names = distributed._parameter_names
        signature = parameter_signature(
            (names.get(p, f"param_groups[{i}].params[{j}]"), p)
            for i, group in enumerate(distributed.param_groups)
            for j, p in enumerate(group["params"])
        )
    except Exception as err:  # the other ranks are in the check below: they name this rank
        check_same_parameters(None, session.side_group, "stragglerkit.horovod.DistributedOptimizer", err)
    check_same_parameters(signature, session.side_group, "stragglerkit.horovod.DistributedOptimizer")
    distributed._stragglerkit = _Buckets(distributed, loop)
    return distributed


def _horovod_path_reason(op: Any, groups: Any, process_set: Any) -> str | None:
    if op == Adasum:
        return "op=hvd.Adasum is Horovod's own reduction, not a sum the loop's algorithms compute"
    if op not in (Average, Sum):
        return f"op {op!r} is not hvd.Average or hvd.Sum"
    if groups:
        return "groups/num_groups ask for Horovod's grouped allreduce"
    if process_set is not global_process_set:
        return "a process set other than the global one"
    if hvd.size() == 1:
        return "one rank"
    return None


class _Buckets(GradientBuckets):
    """The gradients of one Horovod optimizer in buckets (:class:`GradientBuckets`), whose loop's
    baseline is Horovod's allreduce of the bucket."""

    __slots__ = ("_waiter", "number", "optimizer")

    made = 0

    def __init__(self, optimizer: Any, loop: StragglerLoop) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p in optimizer._requires_update]
        super().__init__(
            params,
            loop,
            "avg" if optimizer.op == Average else "sum",
            lambda flat: optimizer._compression.compress(flat)[0],
        )
        self.optimizer = optimizer
        self.number = _Buckets.made  # the same on every rank: each makes its optimizers in the same order
        _Buckets.made += 1
        self._waiter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stragglerkit-horovod")
        loop.baseline = self._horovod_allreduce

    def _horovod_allreduce(self, tensor: torch.Tensor, op: str) -> torch.futures.Future[torch.Tensor]:
        """The loop's baseline: Horovod's allreduce of the bucket, waited for on a thread."""
        opt = self.optimizer
        average = op == "avg"
        scale = opt.gradient_predivide_factor if average else 1.0
        profiled = nvtx.start(nvtx.ALL_REDUCE, "horovod", cross_thread=True)  # until the wait below saw it complete
        handle = hvd.allreduce_async_(
            tensor,
            name=f"stragglerkit.optimizer.{self.number}.bucket.{self.starting}",
            op=Average if average else Sum,
            prescale_factor=1.0 / scale,
            postscale_factor=scale,
        )
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

        timeout = self.loop.settings.timeout

        def wait() -> None:
            # Horovod waits for a stalled rank forever; polled, the wait ends at the configured
            # timeout and the loop's fault report names the rank that did not arrive.
            deadline, pause = time.monotonic() + timeout, 50e-6
            try:
                while not hvd.poll(handle):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"Horovod's allreduce of the bucket did not complete within {timeout:g} s")
                    time.sleep(pause)
                    pause = min(2 * pause, 1e-3)
                hvd.synchronize(handle)
            except Exception as err:
                nvtx.end(profiled)
                future.set_exception(err)  # type: ignore[arg-type]
            else:
                nvtx.end(profiled)
                future.set_result(tensor)

        self._waiter.submit(wait)
        return future


def _allreduce_grad_async(self: Any, p: torch.Tensor) -> tuple[Callable[[], torch.Tensor], Any]:
    """Replaces Horovod's: ``p``'s gradient joins its bucket. The handle is a callable, which
    Horovod's ``synchronize()`` calls for the reduced gradient in the compressed dtype, and then
    decompresses with the context the compression gives a tensor of ``p``'s gradient's dtype."""
    if p.grad is None:
        p.grad = p.data.new(p.size()).zero_()
    _, ctx = self._compression.compress(p.grad.new_empty(0))
    self._stragglerkit.grad_ready(p)
    return functools.partial(self._stragglerkit.reduced, p), ctx


def _close(self: Any) -> None:
    """``optimizer.close()``: end the optimizer's loop, on every rank after the last step (its
    exchange in flight, its thread, its last event-log lines, the report's figures on W&B)."""
    self._stragglerkit.loop.close()


_OVERRIDES = {"_allreduce_grad_async": _allreduce_grad_async, "close": _close}


# -- the torch.distributed group over Horovod's ranks ----------------------------------------------
def _horovod_session(config: Config | None) -> Any:
    """The stragglerkit session of the default group, made over Horovod's ranks if need be."""
    from stragglerkit import api
    from stragglerkit.session import session_for

    if dist.is_initialized():
        if dist.get_world_size() != hvd.size() or dist.get_rank() != hvd.rank():
            raise ConfigError(
                f"the default torch.distributed group has rank {dist.get_rank()} of {dist.get_world_size()} "
                f"but Horovod has rank {hvd.rank()} of {hvd.size()}: stragglerkit's Horovod optimizer needs "
                "them to agree (or no default group, and it makes one)"
            )
    else:
        _join_group_from_horovod()
    if not api.is_initialized():
        api.init(config=config)
    return session_for(None)


def _join_group_from_horovod() -> None:
    interface = os.environ.get("HOROVOD_GLOO_IFACE")
    if interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    store = None
    address: tuple[str, int] | None = None
    if hvd.rank() == 0:
        host = _interface_address(interface) or os.environ.get("HOROVOD_HOSTNAME") or "127.0.0.1"
        store = dist.TCPStore(host, 0, hvd.size(), True, wait_for_workers=False)
        address = (host, store.port)
    address = hvd.broadcast_object(address, root_rank=0, name="stragglerkit.rendezvous")
    assert address is not None
    if store is None:
        store = dist.TCPStore(address[0], address[1], hvd.size(), False)
    dist.init_process_group("gloo", store=store, rank=hvd.rank(), world_size=hvd.size())


def _interface_address(interface: str | None) -> str | None:
    """The IPv4 address of network interface ``interface`` (Linux), or None."""
    if not interface:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", interface[:15].encode()))  # SIOCGIFADDR
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])

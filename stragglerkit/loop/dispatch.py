"""One bucket's AllReduce with the step's plan: the loop's dispatch.

:func:`hand_off` starts a bucket with the algorithm the plan in force names for its index (a ring
on the step's probe bucket; the group's own AllReduce, or a framework's, for the ``allreduce``
baseline, during warm-up and on every step of a loop that observes only, ``Config.detection.act``)
and returns the future the framework waits for; :func:`record_bucket` records the bucket's
timings (span, per-peer messages) for the next exchange. A failed run fails the future with the
loop's :class:`~stragglerkit.errors.PeerError`.

Example::

    future = hand_off(loop, session, tensor, index=0, last=True, op="avg")
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from stragglerkit.detect.arrival import BucketTiming
from stragglerkit.detect.nic_health import ring_link_messages
from stragglerkit.runtime.calls import AllReduceCall, RunRecord
from stragglerkit.schedules.registry import NIC_ALGORITHMS
from stragglerkit.session import Session
from stragglerkit.telemetry import nvtx

if TYPE_CHECKING:
    from stragglerkit.loop.loop import StragglerLoop

__all__ = ["hand_off", "own_buckets", "plain", "probe_bucket", "record_bucket"]


def record_bucket(
    loop: StragglerLoop, timing: BucketTiming, algorithm: str, record: RunRecord | None, *, queued: bool = True
) -> None:
    """Keep the bucket's timings (its span; a ring's per-link messages) for the next exchange."""
    end = None
    links = None
    link_start = None
    if record is not None and len(record.timings):
        first_post, end = record.timings.span_ns()
        if algorithm == "ring":  # one successor and one predecessor: its links' messages (see nic_health)
            link_start = first_post  # the executor's entry: its first post
            links = ring_link_messages(record.timings.records(), link_start)
    loop.profiler.finish(timing, algorithm, end, links, link_start, queued=queued)


# -- one bucket ---------------------------------------------------------------------------------
def hand_off(
    loop: StragglerLoop, session: Session, tensor: torch.Tensor, index: int, last: bool, op: str
) -> torch.futures.Future[torch.Tensor]:
    """Start the bucket's AllReduce with this step's plan; the future the framework waits for."""
    timing = loop.profiler.begin(loop._step, index, tensor.numel() * tensor.element_size())
    if last:
        loop._step += 1
        loop._step_open = False
    if loop.world_size == 1:
        record_bucket(loop, timing, "none", None)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(tensor)
        return done
    if timing.step < loop.settings.detection.warmup_steps or not loop.settings.acting:
        return plain(loop, session, tensor, timing, op)  # warm-up, or a loop that observes only
    plan = loop.controller.plan
    algorithm = plan.algorithm_for(index)
    probe = None
    if index == loop._probe_bucket and (algorithm == "allreduce" or algorithm in NIC_ALGORITHMS):
        algorithm = "ring"  # a probe: its links' timings re-measure each rank's NIC
        probe = nvtx.start(nvtx.PROBE, cross_thread=True)
    elif algorithm == "allreduce":
        return plain(loop, session, tensor, timing, op)
    slowdowns = dict(plan.slowdowns) if algorithm in NIC_ALGORITHMS else None
    straggler = plan.straggler if algorithm == "stragglar" else None
    # the plan's rank map goes with each call: the runtime's own stays the user's calls'
    handle = session.runtime.start(
        AllReduceCall(tensor, algorithm, op, straggler, slowdowns, plan.rank_map(loop.world_size))
    )
    result = _future_for(tensor)

    def finish(_: torch.futures.Future[torch.Tensor]) -> None:
        nvtx.end(probe)
        try:
            record = handle.wait(0)
        except Exception as err:  # the executor's error (naming a rank), and who stalled
            failure = loop._fail(f"stragglerkit all_reduce (algorithm {algorithm}", timing.step, err, timing)
            result.set_exception(failure)  # type: ignore[arg-type]
            return
        try:
            record_bucket(loop, timing, record.algorithm, record)
        except Exception as err:  # bookkeeping must not hold the gradient back
            warnings.warn(
                f"stragglerkit could not record bucket {timing.bucket} of step {timing.step}: {err!r}", stacklevel=1
            )
        result.set_result(tensor)

    handle.future.add_done_callback(finish)
    return result


def plain(
    loop: StragglerLoop, session: Session, tensor: torch.Tensor, timing: BucketTiming, op: str
) -> torch.futures.Future[torch.Tensor]:
    """The baseline: :attr:`StragglerLoop.baseline`, else the process group's own all_reduce (on the session's
    group with the timeout)."""
    baseline_range = None  # a framework's baseline names its own range (horovod.py, megatron/adapter.py)
    if loop.baseline is not None:
        started = loop.baseline(tensor, op)
    else:
        baseline_range = nvtx.start(nvtx.ALL_REDUCE, "process_group", cross_thread=True)
        if op == "avg":
            tensor.div_(loop.world_size)
        work = dist.all_reduce(tensor, group=session.allreduce_group, async_op=True)
        assert work is not None
        started = work.get_future()
    result = _future_for(tensor)

    def finish(fut: torch.futures.Future[Any]) -> None:
        nvtx.end(baseline_range)
        try:
            fut.wait()
        except Exception as err:
            what = "stragglerkit all_reduce (the process group's own"
            result.set_exception(loop._fail(what, timing.step, err, timing))  # type: ignore[arg-type]
            return
        try:
            loop.profiler.finish(timing, "allreduce", queued=False)  # gloo may run it next to the others
        except Exception as err:  # bookkeeping must not hold the gradient back
            warnings.warn(
                f"stragglerkit could not record bucket {timing.bucket} of step {timing.step}: {err!r}", stacklevel=1
            )
        result.set_result(tensor)

    started.then(finish)
    return result


def _future_for(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future for ``tensor``'s result (CUDA-aware on a GPU, so consumers wait on its streams)."""
    if tensor.is_cuda:
        return torch.futures.Future(devices=[tensor.device])
    return torch.futures.Future()


def probe_bucket(loop: StragglerLoop) -> int:
    """This step's probe: the largest bucket of the previous step (-1: none). The same on every
    rank: the step number, the buckets and the adopted plan and interval are. Under a plan for
    degraded NICs not before the switch's settle and verification steps are over (the probe
    would lengthen a step that the verification measures)."""
    cfg = loop.settings
    controller = loop.controller
    if loop.world_size < 3 or loop._step < max(cfg.detection.warmup_steps, 1) or not cfg.acting:
        return -1
    if controller.plan.runs_nic_plan:
        if loop._step < controller.plan_start + cfg.settle_steps + cfg.detection.verify_steps:
            return -1
    elif cfg.baseline != "allreduce":
        return -1  # another baseline measures the links in every run
    every = controller.probe_every  # the same on every rank: adopted from the last decision
    if every == 0 or loop._step % every != 0:
        return -1
    previous = [(t.bucket, t.nbytes) for t in loop.profiler.buckets(loop._step - 1)]
    previous = previous or loop._previous_sizes  # the step before a restore
    if not previous:
        return -1
    bucket, nbytes = max(previous, key=lambda sized: (sized[1], -sized[0]))
    return bucket if nbytes >= cfg.min_bucket_bytes else -1


def own_buckets(loop: StragglerLoop, steps: range) -> tuple[list[int], list[list[str]]]:
    sizes: dict[int, int] = {}
    algorithms = []
    buckets = loop.settings.max_buckets
    for s in steps:
        per_step = [""] * buckets
        for t in loop.profiler.buckets(s):
            if t.bucket < buckets:
                per_step[t.bucket] = t.algorithm
                sizes[t.bucket] = t.nbytes
        algorithms.append(per_step)
    count = max(sizes) + 1 if sizes else 0
    return [sizes.get(b, 0) for b in range(count)], algorithms

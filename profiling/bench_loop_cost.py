"""What the closed loop costs when nothing is wrong, accounted directly: time on the training thread
per bucket and per step, CPU time of the loop's own threads, and extra bytes written or allocated,
on the four paths a user takes (DDP comm hook, Horovod optimizer, torch-only optimizer, megatron-core).

Every path launches ``--world-size`` real ranks (default 4) on this machine that train with
stragglerkit at its defaults and nothing wrong:

* ``ddp``: torch DDP at its defaults (25 MiB buckets, the first 1 MiB) with
  ``register_comm_hook(stragglerkit.DDPState(None), stragglerkit.ddp_hook)``;
* ``horovod``: ``horovodrun --gloo`` ranks with ``stragglerkit.straggler_aware(SGD, named_parameters=...)``
  after ``hvd.init()``;
* ``optimizer``: the same decorator without Horovod (torch.distributed only);
* ``megatron``: megatron-core's ``DistributedDataParallel`` (``overlap_grad_reduce``, 25 MiB buckets,
  as ``profiling/lab/train_megatron.py``) with ``stragglerkit.megatron.install`` (the flag).

The first three train the lab's MLP (256-H-H-16, 16 rows, SGD) whose float32 gradients are
``--sizes`` MiB (default 8 and 32); megatron trains the lab's 2-layer GPT of that gradient size
(one 32-token sequence). Forward passes run under megatron's CPU shim
(``examples/megatron/cpu_shim.py``); the backward pass and the gradient sync run outside it, so
the adapter's tensor calls do not pay the shim's dispatch.

**Why gloo over loopback is adequate.** What is accounted is work done by this process: Python and
tensor work on the training thread inside stragglerkit's entry points, CPU time of its threads, bytes
its code writes and allocates. None of it depends on the wire; the network sets only how long the
collective takes, which the accounting takes out, and the step time the shares divide by. A
loopback AllReduce is faster than a real network's, so steps are shorter and the shares are an upper
bound of what a cluster sees. The ranks share the machine's cores, so wall time inside a call can
include time a rank waited for a core; the training-thread figures are therefore CPU time of the
thread inside the calls (``time.thread_time_ns``), plus the completion latency it waited through
(below); wall time inside the calls is reported beside them.

**What counts** (on the training thread, per step; instrumented from outside, nothing in the
library changes: the bench wraps the entry points in this process):

* *hand-off*: CPU time from an entry point's start to its return -- the DDP hook, the optimizer's per-parameter
  gradient hook (``_allreduce_grad_async`` under Horovod, ``_GradientSync.on_gradient`` without),
  megatron's ``start_grad_sync`` -- less the framework's own work inside it, which the framework
  pays without stragglerkit too: the collective's issue (``torch.distributed.all_reduce``,
  ``hvd.allreduce_async_``) and megatron's gradient scaling (``grad_data *= factor``). What stays
  is ours, copies into flat buckets included (``torch.cat`` of the optimizer paths) and the
  averaging pass of the DDP hook (DDP without a hook folds the division into its bucket copy).
  Step-boundary bookkeeping (the stats exchange, records) runs inside the step's first hand-off.
  A hand-off's time, with that of the calls before it that handed over no bucket (per-parameter
  hooks), is split evenly among the buckets it handed over: the *per-bucket* samples.
* *wait beyond the collective*: in each wait of ours (``StragglerLoop.synchronize``,
  ``GradientBuckets.reduced``, ``_GradientSync.synchronize`` with its copy back, megatron's
  ``GradSyncHandle.wait``), the thread's CPU time (bookkeeping, copies) and, where it waited for
  the step's last collective to complete, that collective's completion path: from the
  collective's completion to our future's (our callbacks on its thread, the GIL they need). The
  wake-up after it is not counted: the framework's own wait has it too. A collective completes at
  its future's first callback (gloo), at the midpoint between the last two polls of the waiter
  thread (Horovod), or at the executor's future (a probe's ring). The wall time of the wait after
  the last completion is reported beside it.
* *completion* (per bucket, reported apart): from the collective's completion to our future's, on
  the thread that completes it (gloo's, Horovod's waiter).

Not seen from inside and not counted: DDP calling a Python hook at all (its C++-to-Python call;
``bench_hook_overhead.py`` measures that end to end). Counted though not ours: part of the
wrappers' own cost, a few us a call (``instrumentation_ns`` measures it on the machine).

**Nothing wrong**: on a loaded machine a rank can fall behind or a link read slow often enough for
the loop to switch to a plan. A configuration whose loop left the baseline in its measured steps
runs again (``--attempts``); the figures count the steps that ran the baseline only, the bytes
too (``steps_off_baseline`` says how many did not), and ``loop`` records the intervals and decisions.

**Loop threads**: CPU time (``/proc/self/task/<tid>/schedstat``, read between steps) per measured
step of the loop's threads: the controller (``stragglerkit-controller``), the runtime's worker that runs
probes (``stragglerkit_*``), Horovod's bucket waiter (``stragglerkit-horovod``), the gloo threads
of stragglerkit's side group (the stats exchange), the other threads its set-up starts (the
executor's gloo groups, under Horovod the torch.distributed group it makes) and native threads
started while training. The gloo threads of the session's twin of the process group carry the
collective itself, which the framework runs without stragglerkit too: reported apart, not counted
(on the Horovod path the twin carries nothing of Horovod's and counts). Threads are told apart by
when they appear (the framework's before stragglerkit is set up) and by name.

**Probes**: a probe runs stragglerkit's ring on the largest bucket in place of the group's
AllReduce, every ``probe_every`` steps at first and every ``defaults.QUIET_PROBE_EVERY`` once the
links read healthy. Its extra collective time (the ring's median less the AllReduce's of the same
bucket, at least 0) is amortised over the backed-off interval and added to the share.

**Bytes**: the ``--profile-steps`` steps after the skipped ones run under ``torch.profiler``
(``profile_memory``, ``record_shapes``), before the measured ones (a loaded machine can make the
loop switch to a plan later in a run): per step, the bytes that ops inside our entry points (less
the framework's work) write (an in-place op: its first operand; an op that makes a tensor: what it
allocates) and allocate; the summary gives the median step. Beside them, where the hand-offs' time
goes under the profiler (self time by op and range: wall time, profiler overhead and waits for a
core included, so shares rather than figures). Steps under the profiler are not in the timings.

**Sampling profiler**: ``--pyspy PATH:MIB`` runs that configuration once more with ``py-spy record``
(200 Hz) attached to rank 0 for the measured steps and keeps the stragglerkit frames with the
largest share of the samples (inclusive and innermost) and the lines where the samples under them
end.

**Targets** (reported, not tuned to): at most 50 us per bucket on the training thread (the step's
training-thread time over its buckets) and at most 0.5 % of the step in all (training thread,
loop threads and the probes' amortised extra collective time, over the mean step time); per rank,
the worst rank reported.

Overwrites ``profiling/results/bench_loop_cost.json`` (``--json``). The default run takes about
12 minutes on a 2-core machine, longer when other work loads it.

Example::

    python profiling/bench_loop_cost.py
    python profiling/bench_loop_cost.py --paths ddp --sizes 1 --world-size 2 --steps 30 --skip 12 --pyspy none \\
        --json /tmp/loop_cost.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PATHS = ("ddp", "horovod", "optimizer", "megatron")
TARGET_PER_BUCKET_US = 50.0
TARGET_SHARE = 0.005
MIB = 2**20
PYSPY_RATE_HZ = 200
BIN = Path(sys.executable).parent


# -- accounting on the training thread ----------------------------------------------------------------
class _Call:
    """One outermost call of ours on the training thread."""

    __slots__ = ("buckets", "framework_cpu", "framework_wall", "kind")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.buckets = 0
        self.framework_wall = 0
        self.framework_cpu = 0


class Accounting:
    """Wraps entry points (``ours``), the framework's work inside them (``framework``) and the
    collectives' completions; keeps per-step sums and per-bucket samples for the measured steps."""

    def __init__(self) -> None:
        self.main = threading.get_ident()
        self.current: _Call | None = None
        self.step = -1
        self.measuring = False
        self.profiling = False
        self.rows: list[dict[str, Any]] = []
        self.bucket_us: list[tuple[int, float, float]] = []
        """Per bucket of the measured steps: (step, CPU us, wall us) of its hand-off."""
        self.completion: list[tuple[int, float]] = []
        """Per bucket: (step, us from the collective's completion to our future's)."""
        self.durations: dict[int, list[float]] = defaultdict(list)
        self.probe_durations: list[float] = []
        self.probe_index: list[int] = []
        self.completions: list[tuple[int, int, dict[str, Any]]] = []
        self.open_bucket: dict[str, Any] | None = None
        self.buckets: list[dict[str, Any]] = []
        self.hvd_handles: dict[int, dict[str, Any]] = {}
        self.hvd_last_poll: dict[int, int] = {}
        self.off_thread_calls = 0
        self.profiled: dict[int, tuple[str, str]] = {}
        self._new_step()

    def _new_step(self) -> None:
        self.pool_cpu = 0
        self.pool_wall = 0
        names = ("hand_off_cpu", "hand_off_wall", "wait_beyond", "wait_completion", "wait_beyond_wall", "wait_wall")
        self.sums = dict.fromkeys((*names, "calls"), 0)
        self.flags: dict[str, Any] = {
            "buckets": 0,
            "executor": [],
            "probe": False,
            "exchange_start": False,
            "exchange_receive": False,
        }

    # -- steps --------------------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step
        self._new_step()
        self.buckets = []
        self.completions = [c for c in self.completions if c[0] >= step]

    def end_step(self, wall_ns: int, algorithm: str) -> None:
        self._finish_buckets()
        self.flags["probe"] = algorithm == "allreduce" and self.flags["executor"] == ["ring"]
        if self.profiling:
            self.profiled[self.step] = (_kind(self.flags), algorithm)
        if not self.measuring:
            return
        s = self.sums
        self.rows.append(
            {
                "step": self.step,
                "step_us": wall_ns / 1e3,
                "hand_off_us": s["hand_off_cpu"] / 1e3,
                "hand_off_wall_us": s["hand_off_wall"] / 1e3,
                "wait_beyond_us": s["wait_beyond"] / 1e3,
                "wait_completion_us": s["wait_completion"] / 1e3,
                "wait_beyond_wall_us": s["wait_beyond_wall"] / 1e3,
                "wait_us": s["wait_wall"] / 1e3,
                "ours_us": (s["hand_off_cpu"] + s["wait_beyond"]) / 1e3,
                "calls": s["calls"],
                "algorithm": algorithm,
                **self.flags,
            }
        )

    def _finish_buckets(self) -> None:
        """The step's buckets: completion overhead and collective durations (callbacks ran by now)."""
        if not self.measuring:
            return
        for rec in self.buckets:
            done, ours = rec.get("done"), rec.get("ours_done")
            if done is not None and ours is not None:
                self.completion.append((self.step, (ours - done) / 1e3))
            if done is not None and rec.get("issued") is not None:
                duration = (done - rec["issued"]) / 1e3
                if rec.get("probe") and self.flags["executor"] == ["ring"]:
                    self.probe_durations.append(duration)
                    self.probe_index.append(rec["index"])
                elif "probe" not in rec:
                    self.durations[rec["index"]].append(duration)

    # -- wrappers -----------------------------------------------------------------------------------
    def ours(self, fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
        """``fn`` as an entry point of ours: ``kind`` is ``hand_off`` or ``wait``."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.current is not None:
                return fn(*args, **kwargs)
            if threading.get_ident() != self.main:
                self.off_thread_calls += 1
                return fn(*args, **kwargs)
            call = self.current = _Call(kind)
            profiled = _range(f"loop_cost/ours {kind} {self.step}") if self.profiling else None
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
                if profiled is not None:
                    profiled.__exit__(None, None, None)
                self.current = None
                self._account(call, w0, w1, c1 - c0)

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    def _account(self, call: _Call, w0: int, w1: int, cpu: int) -> None:
        s = self.sums
        s["calls"] += 1
        if call.kind == "wait":
            # ours: the thread's CPU time in the wait, and, where it waited for the step's last
            # collective to complete, that collective's completion path (its future's callbacks of
            # ours up to our future); not the wake-up after it, which the framework's wait has too
            done = [(t, rec) for step, t, rec in self.completions if step == self.step and t <= w1]
            completion = 0
            if done:
                last, rec = max(done, key=lambda item: item[0])
                ours_done = rec.get("ours_done")
                if last > w0 and ours_done is not None:
                    completion = min(max(ours_done - last, 0), w1 - last)
                s["wait_beyond_wall"] += w1 - max(w0, last)
            else:
                s["wait_beyond_wall"] += w1 - w0
            s["wait_beyond"] += cpu + completion
            s["wait_completion"] += completion
            s["wait_wall"] += w1 - w0
            return
        ours_cpu = max(cpu - call.framework_cpu, 0)
        ours_wall = max(w1 - w0 - call.framework_wall, 0)
        s["hand_off_cpu"] += ours_cpu
        s["hand_off_wall"] += ours_wall
        if call.buckets == 0:
            self.pool_cpu += ours_cpu
            self.pool_wall += ours_wall
            return
        per_cpu = (self.pool_cpu + ours_cpu) / call.buckets / 1e3
        per_wall = (self.pool_wall + ours_wall) / call.buckets / 1e3
        self.pool_cpu = self.pool_wall = 0
        if self.measuring:
            self.bucket_us += [(self.step, per_cpu, per_wall)] * call.buckets

    def framework(self, fn: Callable[..., Any], what: str, collective: str | None = None) -> Callable[..., Any]:
        """``fn`` as the framework's own work inside ours: its time is taken out of the enclosing
        call. ``collective``: ``gloo`` (returns a Work) or ``horovod`` (returns a handle), whose
        completion is recorded for the bucket being handed over."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = self.current
            if call is None or threading.get_ident() != self.main:
                return fn(*args, **kwargs)
            profiled = _range(f"loop_cost/framework {what}") if self.profiling else None
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            try:
                result = fn(*args, **kwargs)
            finally:
                c1, w1 = time.thread_time_ns(), time.perf_counter_ns()
                if profiled is not None:
                    profiled.__exit__(None, None, None)
                call.framework_wall += w1 - w0
                call.framework_cpu += c1 - c0
            rec = self.open_bucket
            if rec is not None and collective is not None:
                rec["issued"] = w0
                if collective == "gloo" and result is not None:
                    result.get_future().add_done_callback(self._completed(rec))
                elif collective == "horovod":
                    self.hvd_handles[int(result)] = rec
            return result

        return wrapper

    def _completed(self, rec: dict[str, Any]) -> Callable[[Any], None]:
        step = self.step

        def done(_: Any) -> None:
            t = time.perf_counter_ns()
            rec["done"] = t
            self.completions.append((step, t, rec))

        return done

    def hvd_poll(self, fn: Callable[[int], bool]) -> Callable[[int], bool]:
        """Horovod's ``poll`` as the waiter thread calls it: a bucket's completion is the midpoint
        between the last poll that said no and the first that said yes."""

        def poll(handle: int) -> bool:
            ready = fn(handle)
            t = time.perf_counter_ns()
            rec = self.hvd_handles.get(handle)
            if rec is not None:
                if ready:
                    last = self.hvd_last_poll.pop(handle, None)
                    done = (last + t) // 2 if last is not None else t
                    rec["done"] = done
                    self.completions.append((rec["step"], done, rec))
                    del self.hvd_handles[handle]
                else:
                    self.hvd_last_poll[handle] = t
            return bool(ready)

        return poll

    def bucket(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``StragglerLoop.all_reduce_bucket``: counts the bucket in the enclosing call and follows its future."""

        def all_reduce_bucket(loop: Any, tensor: Any, index: int, last: bool, op: str = "avg") -> Any:
            if threading.get_ident() != self.main:
                return fn(loop, tensor, index, last, op)
            if self.current is not None:
                self.current.buckets += 1
            self.flags["buckets"] += 1
            rec: dict[str, Any] = {"step": self.step, "index": index, "issued": None}
            self.open_bucket = rec
            try:
                future = fn(loop, tensor, index, last, op)
            finally:
                self.open_bucket = None
            self.buckets.append(rec)
            if not future.done():
                future.add_done_callback(lambda _: rec.__setitem__("ours_done", time.perf_counter_ns()))
            return future

        return self.ours(all_reduce_bucket, "hand_off")

    def runtime_start(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``Runtime.start``: a run of stragglerkit's executor (with nothing wrong, a probe's ring)."""

        def start(runtime: Any, call: Any) -> Any:
            issued = time.perf_counter_ns()
            handle = fn(runtime, call)
            rec = self.open_bucket
            if rec is not None and threading.get_ident() == self.main:
                # with the baseline in force, a ring on one bucket is the step's probe
                rec["issued"], rec["probe"] = issued, call.algorithm == "ring"
                self.flags["executor"].append(call.algorithm)
                handle.future.add_done_callback(self._completed(rec))
            return handle

        return start

    def flag(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def flagged(*args: Any, **kwargs: Any) -> Any:
            self.flags[name] = True
            return fn(*args, **kwargs)

        return flagged


def _kind(flags: dict[str, Any]) -> str:
    """What a step did: ``probe``, ``exchange_start``, ``exchange_receive`` or ``plain``."""
    for kind in ("probe", "exchange_start", "exchange_receive"):
        if flags.get(kind):
            return kind
    return "plain"


def _range(name: str) -> Any:
    import torch

    rf = torch.profiler.record_function(name)
    rf.__enter__()
    return rf


# -- threads ------------------------------------------------------------------------------------------
def _tasks() -> list[int]:
    return sorted(int(t) for t in os.listdir("/proc/self/task"))


def _comm(tid: int) -> str:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _cpu_ns(tid: int) -> int | None:
    """The thread's CPU time (ns) from schedstat; ``None`` once it is gone."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class ThreadCensus:
    """Labels threads by when they appeared: the framework's before :meth:`setup_begins`, the groups
    stragglerkit makes (``side_group``, ``allreduce_group``) and the rest of its set-up, then the
    threads started while training (by Python name, else ``executor_native``)."""

    def __init__(self) -> None:
        self.labels: dict[int, str] = {}
        self.group_threads: list[tuple[Any, list[int]]] = []

    def setup_begins(self) -> None:
        for tid in _tasks():
            self.labels.setdefault(tid, "framework")

    def gloo_group_over(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def made(*args: Any, **kwargs: Any) -> Any:
            before = set(_tasks())
            group = fn(*args, **kwargs)
            self.group_threads.append((group, [t for t in _tasks() if t not in before]))
            return group

        return made

    def setup_ends(self, session: Any) -> None:
        for group, tids in self.group_threads:
            label = "side_group" if group is session.side_group else "allreduce_group"
            if group is session.side_group or group is session.allreduce_group:
                for tid in tids:
                    self.labels.setdefault(tid, label)
        for tid in _tasks():
            self.labels.setdefault(tid, "executor_groups")

    def classify(self) -> dict[int, str]:
        named = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
        main = threading.main_thread().native_id
        out = {}
        for tid in _tasks():
            name = named.get(tid)
            if tid == main:
                out[tid] = "training"
            elif name is not None and name.startswith("stragglerkit-controller"):
                out[tid] = "controller"
            elif name is not None and name.startswith("stragglerkit-horovod"):
                out[tid] = "horovod_waiter"
            elif name is not None and name.startswith("stragglerkit"):
                out[tid] = "executor_worker"
            elif tid in self.labels:
                out[tid] = self.labels[tid]
            elif name is not None:
                out[tid] = "other_python"
            else:
                out[tid] = "executor_native"
        return out

    def snapshot(self) -> dict[int, int]:
        return {tid: ns for tid in _tasks() if (ns := _cpu_ns(tid)) is not None}


OURS_THREADS = ("controller", "executor_worker", "horovod_waiter", "side_group", "executor_groups", "executor_native")
"""Thread classes whose CPU is the loop's (plus ``allreduce_group`` on the Horovod path)."""


# -- the paths ----------------------------------------------------------------------------------------
class Trainer:
    """One path's model and step; ``buckets``: the framework's (or stragglerkit's own) buckets per step."""

    loop: Any
    session: Any

    def step(self, step: int) -> None:
        raise NotImplementedError

    def buckets(self) -> list[int]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def _mlp(model_bytes: int) -> tuple[Any, Any]:
    import torch

    from profiling.lab.copies import build_model, mlp_batch
    from profiling.lab.train_config import TrainConfig

    config = TrainConfig(model_bytes=model_bytes, batch=16)
    return build_model(config), lambda step, rank: mlp_batch(config, step, rank, torch.device("cpu"))


class DdpTrainer(Trainer):
    def __init__(self, acct: Accounting, census: ThreadCensus, model_bytes: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        import stragglerkit
        from stragglerkit.session import session_for

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        census.setup_begins()
        stragglerkit.init()
        self.session = session_for(None)
        census.setup_ends(self.session)
        module, self.batch = _mlp(model_bytes)
        self.model = DDP(module)
        self.state = stragglerkit.DDPState(None)
        self.loop = self.state.loop
        timed = acct.ours(stragglerkit.ddp_hook, "hand_off")

        def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            return timed(state, bucket)  # type: ignore[no-any-return]

        hook.__annotations__ = dict(stragglerkit.ddp_hook.__annotations__)
        self.model.register_comm_hook(self.state, hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.rank = dist.get_rank()

    def step(self, step: int) -> None:
        import torch

        x, y = self.batch(step, self.rank)
        self.opt.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.opt.step()

    def buckets(self) -> list[int]:
        data = self.model._get_ddp_logging_data()  # the buckets DDP rebuilt after the first step
        sizes = str(data.get("rebuilt_bucket_sizes" if data.get("has_rebuilt_buckets") else "bucket_sizes", ""))
        return [int(s) for s in sizes.split(",") if s.strip()]

    def close(self) -> None:
        self.state.close()


class OptimizerTrainer(Trainer):
    """``straggler_aware`` on torch.distributed, or under Horovod (``horovod=True``)."""

    def __init__(self, acct: Accounting, census: ThreadCensus, model_bytes: int, horovod: bool) -> None:
        import torch
        import torch.distributed as dist

        import stragglerkit
        from stragglerkit.session import session_for

        if horovod:
            import horovod.torch as hvd

            hvd.init()
            census.setup_begins()
            self.rank = hvd.rank()
        else:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
            census.setup_begins()
            stragglerkit.init()
            self.rank = dist.get_rank()
        self.model, self.batch = _mlp(model_bytes)
        self.opt = stragglerkit.straggler_aware(
            torch.optim.SGD(self.model.parameters(), lr=1e-3), named_parameters=self.model.named_parameters()
        )
        self.session = session_for(None)
        census.setup_ends(self.session)
        self.loop = self.opt._stragglerkit.loop

    def step(self, step: int) -> None:
        import torch

        x, y = self.batch(step, self.rank)
        self.opt.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.opt.step()

    def buckets(self) -> list[int]:
        from stragglerkit.integrations.optimizer_buckets import GradientBuckets

        held = self.opt._stragglerkit  # Horovod's: the buckets; torch's: the sync that holds them
        buckets = held if isinstance(held, GradientBuckets) else held.buckets
        return [sum(p.numel() * p.element_size() for p in bucket) for bucket in buckets.buckets]

    def close(self) -> None:
        self.opt.close()


class MegatronTrainer(Trainer):
    def __init__(self, acct: Accounting, census: ThreadCensus, model_bytes: int) -> None:
        import warnings

        import torch
        import torch.distributed as dist

        from examples.megatron.cpu_shim import cuda_calls_on_cpu
        from profiling.lab import train_megatron as lab
        from profiling.lab.train_config import TrainConfig
        from stragglerkit.megatron import MegatronConfig, install

        warnings.filterwarnings("ignore")
        with warnings.catch_warnings():
            from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
            from megatron.core.models.gpt import GPTModel
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
            from megatron.core.transformer import TransformerConfig

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        self.rank = dist.get_rank()
        self.shim = cuda_calls_on_cpu
        self.config = TrainConfig(model_bytes=model_bytes, batch=1, framework="megatron")
        lab._initialize(self.config.seed, torch.device("cpu"))
        census.setup_begins()
        hidden = lab.gpt_hidden_size(model_bytes)
        with cuda_calls_on_cpu():
            transformer = TransformerConfig(
                num_layers=lab.LAYERS,
                hidden_size=hidden,
                num_attention_heads=hidden // lab.HEAD_SIZE,
                hidden_dropout=0.0,
                attention_dropout=0.0,
                use_cpu_initialization=True,
                pipeline_dtype=torch.float32,
            )
            torch.manual_seed(self.config.seed)
            module = GPTModel(
                config=transformer,
                transformer_layer_spec=get_gpt_layer_local_spec(),
                vocab_size=lab.VOCAB,
                max_sequence_length=lab.SEQ_LENGTH,
            )
            ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=lab.BUCKET_PARAMETERS)
            self.model = DistributedDataParallel(transformer, ddp_config, module)
            self.model.broadcast_params()
            self.state = install(self.model, MegatronConfig(straggler_aware_allreduce=True))
            optimizer = OptimizerConfig(optimizer="sgd", lr=1e-3, sgd_momentum=0.0, weight_decay=0.0, clip_grad=0.0)
            self.opt = get_megatron_optimizer(optimizer, [self.model])
        assert self.state is not None and self.state.loop is not None
        self.loop = self.state.loop
        self.session = self.loop.session
        census.setup_ends(self.session)

    def step(self, step: int) -> None:
        import torch

        from profiling.lab.train_megatron import gpt_batch

        batch = gpt_batch(self.config, step, self.rank, torch.device("cpu"))
        with self.shim():
            self.model.zero_grad_buffer()
            self.opt.zero_grad()
            output = self.model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
            loss = output.float().mean()
        loss.backward()  # the bucket groups start their sync from the backward hooks
        self.model.finish_grad_sync()
        with self.shim():
            self.opt.step()

    def buckets(self) -> list[int]:
        return [b.grad_data.numel() * b.grad_data.element_size() for g in self.model.bucket_groups for b in g.buckets]

    def close(self) -> None:
        self.state.close()


def _instrument(acct: Accounting, census: ThreadCensus, path: str) -> None:
    """Wrap, in this process, the entry points of ``path`` and the framework's work inside them."""
    import torch
    import torch.distributed as dist

    from stragglerkit import session as session_module
    from stragglerkit.loop.exchange import Exchange
    from stragglerkit.loop.loop import StragglerLoop
    from stragglerkit.runtime.runtime import Runtime

    session_module.gloo_group_over = census.gloo_group_over(session_module.gloo_group_over)  # type: ignore[attr-defined]
    StragglerLoop.all_reduce_bucket = acct.bucket(StragglerLoop.all_reduce_bucket)  # type: ignore[method-assign]
    StragglerLoop.synchronize = acct.ours(StragglerLoop.synchronize, "wait")  # type: ignore[method-assign]
    Runtime.start = acct.runtime_start(Runtime.start)  # type: ignore[method-assign]
    Exchange.start = acct.flag(Exchange.start, "exchange_start")  # type: ignore[method-assign]
    Exchange.receive = acct.flag(Exchange.receive, "exchange_receive")  # type: ignore[method-assign]
    dist.all_reduce = acct.framework(dist.all_reduce, "all_reduce issue", collective="gloo")
    if path in ("horovod", "optimizer"):
        from stragglerkit.integrations.optimizer_buckets import GradientBuckets

        GradientBuckets.reduced = acct.ours(GradientBuckets.reduced, "wait")  # type: ignore[method-assign]
    if path == "optimizer":
        from stragglerkit.integrations import optimizer

        sync = optimizer._GradientSync
        sync.on_gradient = acct.ours(sync.on_gradient, "hand_off")  # type: ignore[method-assign]
        sync.synchronize = acct.ours(sync.synchronize, "wait")  # type: ignore[method-assign]
    if path == "horovod":
        import horovod.torch as hvd

        from stragglerkit import horovod

        hvd.allreduce_async_ = acct.framework(hvd.allreduce_async_, "hvd.allreduce_async_", collective="horovod")
        hvd.poll = acct.hvd_poll(hvd.poll)
        overrides = horovod._OVERRIDES
        overrides["_allreduce_grad_async"] = acct.ours(overrides["_allreduce_grad_async"], "hand_off")
    if path == "megatron":
        from stragglerkit.megatron.adapter import GradSyncHandle, MegatronState

        MegatronState.start_grad_sync = acct.ours(MegatronState.start_grad_sync, "hand_off")  # type: ignore[method-assign]
        GradSyncHandle.wait = acct.ours(GradSyncHandle.wait, "wait")  # type: ignore[method-assign]
        # megatron-core scales each bucket before its collective, with stragglerkit or without
        torch.Tensor.__imul__ = acct.framework(torch.Tensor.__imul__, "gradient scaling")  # type: ignore[method-assign]


# -- the profiler window ------------------------------------------------------------------------------
_ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "bool": 1}


def _profile_summary(prof: Any) -> dict[str, Any]:
    """Per profiled step: bytes written and allocated by ops inside our calls (less the framework's
    work); and where the hand-offs' time goes (self time by op or range; wall time, so it includes
    waiting for a core; the waits' self time is mostly blocking, so they count for bytes only)."""
    written: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    allocated: dict[int, float] = defaultdict(float)
    self_us: dict[str, float] = defaultdict(float)

    def op_bytes(event: Any) -> float:
        if event.name.endswith("_") and event.input_shapes and event.input_shapes[0]:
            numel = 1
            for dim in event.input_shapes[0]:
                numel *= dim
            dtype = (event.input_dtypes or ["float"])[0]
            return float(numel * _ITEMSIZE.get(dtype, 4))
        return float(max(event.cpu_memory_usage, 0))

    def visit(event: Any, step: int, in_op: bool, timed: bool) -> None:
        if event.name.startswith("loop_cost/framework"):
            return
        allocated[step] += max(event.self_cpu_memory_usage, 0)
        if timed:
            name = "python (ours)" if event.name.startswith("loop_cost/ours") else event.name
            head, _, detail = name.rpartition(" ")
            name = head if head and detail.isdigit() else name  # "stragglerkit/step 12"
            self_us[name] += event.self_cpu_time_total
        if not in_op and event.name.startswith("aten::"):
            nbytes = op_bytes(event)
            if nbytes:
                written[step][event.name] += nbytes
            in_op = True
        for child in event.cpu_children:
            visit(child, step, in_op, timed)

    steps: set[int] = set()
    for event in prof.events():
        if event.name.startswith("loop_cost/ours") and (
            event.cpu_parent is None or not _inside_ours(event.cpu_parent)
        ):
            _, kind, step = event.name.split()
            steps.add(int(step))
            visit(event, int(step), False, kind == "hand_off")
    count = max(len(steps), 1)
    total = sum(self_us.values())
    top = sorted(self_us.items(), key=lambda kv: -kv[1])[:8]
    per_step = [
        {
            "step": step,
            "written": round(sum(written[step].values())),
            "allocated": round(allocated[step]),
            "written_by_op": {k: round(v) for k, v in sorted(written[step].items(), key=lambda kv: -kv[1])},
        }
        for step in sorted(steps)
    ]
    return {
        "profiled_steps": len(steps),
        "bytes_per_step": per_step,
        "hand_off_us_per_step": round(total / count, 1),
        "hand_off_top": [
            {"name": name, "us_per_step": round(us / count, 1), "share": round(us / total, 3) if total else 0.0}
            for name, us in top
        ],
    }


def _inside_ours(event: Any) -> bool:
    while event is not None:
        if event.name.startswith("loop_cost/ours"):
            return True
        event = event.cpu_parent
    return False


# -- one rank -----------------------------------------------------------------------------------------
def _worker(args: argparse.Namespace) -> None:
    import warnings

    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    acct = Accounting()
    census = ThreadCensus()
    _instrument(acct, census, args.path)
    trainer: Trainer
    if args.path == "ddp":
        trainer = DdpTrainer(acct, census, args.size_bytes)
    elif args.path in ("optimizer", "horovod"):
        trainer = OptimizerTrainer(acct, census, args.size_bytes, horovod=args.path == "horovod")
    else:
        trainer = MegatronTrainer(acct, census, args.size_bytes)
    rank = trainer.loop.rank
    out_dir = Path(args.out_dir)
    marker = Path(args.pyspy_marker) if args.pyspy_marker and rank == 0 else None
    # the profiled steps come first, right after the skipped ones (a loaded machine can make the
    # loop switch to a plan later in the run), then the measured ones
    measure_from = args.skip + args.profile_steps
    total = args.steps + args.profile_steps
    before: dict[int, int] = {}
    previous: dict[int, int] = {}
    labels: dict[int, str] = {}
    window_start = 0.0
    profiler: Any = None
    for step in range(total):
        if step == args.skip and args.profile_steps:
            profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=True
            )
            profiler.__enter__()
            acct.profiling = True
        if step == measure_from:
            if profiler is not None:
                acct.profiling = False
                profiler.__exit__(None, None, None)
            acct.measuring = True
            if marker is not None:
                (marker / "start").write_text(str(os.getpid()))
                time.sleep(1.0)  # py-spy attaches
            before = previous = census.snapshot()
            labels = census.classify()
            window_start = time.perf_counter()
        acct.begin_step(step)
        t0 = time.perf_counter_ns()
        trainer.step(step)
        acct.end_step(time.perf_counter_ns() - t0, trainer.loop.algorithm)
        if acct.measuring:  # the step's CPU time per thread class, read between steps
            current = census.snapshot()
            if any(tid not in labels for tid in current):
                labels = census.classify()
            per_class: dict[str, float] = defaultdict(float)
            for tid, ns in current.items():
                per_class[labels.get(tid, "executor_native")] += (ns - previous.get(tid, 0)) / 1e3
            acct.rows[-1]["threads"] = {k: round(v, 1) for k, v in per_class.items()}
            previous = current
        if rank == 0 and (step + 1) % 20 == 0:
            print(f"[loop_cost] {args.path} {args.size_bytes / MIB:g} MiB: step {step + 1}/{total}", flush=True)
    window_wall = time.perf_counter() - window_start
    acct.measuring = False
    if marker is not None:
        (marker / "stop").write_text("")
    after = previous
    labels = census.classify()
    names = {tid: _comm(tid) for tid in after}
    profile = None
    if profiler is not None:
        profile = _profile_summary(profiler)
        for item in profile["bytes_per_step"]:
            item["kind"], item["algorithm"] = acct.profiled.get(item["step"], ("?", "?"))
    threads: dict[str, float] = defaultdict(float)
    measured = max(args.steps - args.skip, 1)
    comms: dict[str, float] = defaultdict(float)
    for tid, ns in after.items():
        label = labels.get(tid, "executor_native")
        threads[label] += (ns - before.get(tid, 0)) / measured / 1e3
        comms[f"{label}/{names.get(tid, '?')}"] += (ns - before.get(tid, 0)) / measured / 1e3
    controller = trainer.loop.controller
    events = [
        {"step": e["step"], "kind": e["kind"], "algorithm": e["algorithm"], "why": e["evidence"].get("reason") or ""}
        for e in trainer.loop.events
    ]
    record = {
        "rank": rank,
        "exchange_every": controller.exchange_every,
        "probe_every": controller.probe_every,
        "events": events,
        "world_size": trainer.loop.world_size,
        "buckets": trainer.buckets(),
        "rows": acct.rows,
        "bucket_us": acct.bucket_us,
        "completion_us": acct.completion,
        "durations_us": {str(k): v for k, v in acct.durations.items()},
        "probe_durations_us": acct.probe_durations,
        "probe_index": acct.probe_index,
        "threads_us_per_step": {k: round(v, 1) for k, v in sorted(threads.items())},
        "thread_names_us_per_step": {k: round(v, 1) for k, v in sorted(comms.items())},
        "window_s": window_wall,
        "off_thread_calls": acct.off_thread_calls,
        "profile": profile,
    }
    trainer.close()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")


# -- the launcher ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(args: argparse.Namespace, path: str, size_mib: float, pyspy: Path | None = None) -> list[dict[str, Any]]:
    """Run ``path`` at ``size_mib`` on ``--world-size`` ranks; every rank's record. With ``pyspy``
    (a folder), py-spy samples rank 0 over the measured steps and leaves ``pyspy.txt`` there."""
    n = args.world_size
    with tempfile.TemporaryDirectory(prefix="loop_cost_") as tmp:
        worker = [sys.executable, str(Path(__file__).resolve()), "--worker", "--path", path]
        worker += ["--size-bytes", str(int(size_mib * MIB)), "--steps", str(args.steps), "--skip", str(args.skip)]
        worker += ["--profile-steps", str(0 if pyspy else args.profile_steps), "--out-dir", tmp]
        if pyspy is not None:
            worker += ["--pyspy-marker", str(pyspy)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        env["GLOO_SOCKET_IFNAME"] = "lo"
        logs = [Path(tmp) / f"rank{r}.log" for r in range(n)]
        procs: list[subprocess.Popen[Any]] = []
        pumps: list[threading.Thread] = []
        try:
            if path == "horovod":
                env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "300"
                command = [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo", *worker]
                commands = [(command, env)]
            else:
                port = _free_port()
                commands = []
                for r in range(n):
                    rank_env = {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r)}
                    rank_env.update(WORLD_SIZE=str(n), LOCAL_RANK=str(r))
                    commands.append((worker, rank_env))
            for (command, command_env), log in zip(commands, logs):
                proc = subprocess.Popen(
                    command, cwd=ROOT, env=command_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
                procs.append(proc)
                pumps.append(threading.Thread(target=_pump, args=(proc, log), daemon=True))
                pumps[-1].start()
            spy = _follow(procs, pyspy, args.timeout) if pyspy is not None else None
            codes = [p.wait(timeout=args.timeout) for p in procs]
            if spy is not None:
                spy.wait(timeout=60)
            for pump in pumps:
                pump.join(timeout=10)
        except BaseException:
            for p in procs:
                with contextlib.suppress(OSError):
                    p.kill()
            raise
        if any(codes):
            tails = "\n".join(
                f"--- {log.name} ---\n" + log.read_text(errors="replace")[-3000:] for log in logs if log.exists()
            )
            raise SystemExit(f"bench_loop_cost: {path} {size_mib:g} MiB failed (exit codes {codes})\n{tails}")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(n)]


def _pump(proc: subprocess.Popen[Any], log: Path) -> None:
    """Copy a rank's output to its log, and its progress lines to this one's."""
    assert proc.stdout is not None
    with open(log, "w", encoding="utf-8") as out:
        for line in proc.stdout:
            out.write(line)
            if "[loop_cost]" in line:
                print(line.rstrip(), flush=True)


def _follow(procs: list[subprocess.Popen[Any]], folder: Path, timeout: float) -> subprocess.Popen[Any] | None:
    """Attach py-spy to rank 0 when it starts its measured steps and stop it when they end."""
    spy: subprocess.Popen[Any] | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        if spy is None and (folder / "start").exists():
            pid = (folder / "start").read_text().strip()
            command = [str(BIN / "py-spy"), "record", "--pid", pid, "--rate", str(PYSPY_RATE_HZ), "--format", "raw"]
            command += ["--output", str(folder / "pyspy.txt")]
            spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if spy is not None and (folder / "stop").exists():
            spy.send_signal(signal.SIGINT)
            return spy
        time.sleep(0.1)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
    return spy


def _pyspy_top(raw: str, top: int) -> dict[str, Any]:
    """The stragglerkit frames with the largest share of py-spy's samples (collapsed stacks:
    ``frame;frame;... count``, each frame ``function (file:line)``): inclusive (anywhere on the
    stack) and innermost (the deepest stragglerkit frame of the sample); the lines where samples
    under a stragglerkit frame end (the innermost frame of any file: a torch call there is torch's
    work on our behalf); and the training thread's share (stacks rooted in this script's module)."""
    inclusive: dict[str, int] = defaultdict(int)
    innermost: dict[str, int] = defaultdict(int)
    lines: dict[str, int] = defaultdict(int)
    total = ours = training = training_ours = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        texts = stack.split(";")
        on_training = texts[0].startswith("<module> (") and "bench_loop_cost.py" in texts[0]
        training += count if on_training else 0
        frames = [_frame(f) for f in texts]
        mine = [f for f in frames if f is not None]
        if not mine:
            continue
        ours += count
        training_ours += count if on_training else 0
        for frame in set(mine):
            inclusive[frame] += count
        innermost[mine[-1]] += count
        # the bench's own wrappers: one entry, so that they do not read as the package's
        bench = "bench_loop_cost.py" in texts[-1]
        lines["instrumentation (bench_loop_cost.py)" if bench else _line(texts[-1])] += count
    ranked = sorted(inclusive, key=lambda f: (-inclusive[f], -innermost.get(f, 0), f))[:top]
    share = (lambda n: round(n / total, 4)) if total else (lambda n: 0.0)
    return {
        "samples": total,
        "stragglerkit_share": share(ours),
        "training_thread_share": share(training),
        "training_thread_stragglerkit_share": share(training_ours),
        "top": [
            {"frame": f, "inclusive_share": share(inclusive[f]), "innermost_share": share(innermost.get(f, 0))}
            for f in ranked
        ],
        "top_lines": [
            {"line": text, "share": share(n)} for text, n in sorted(lines.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        ],
    }


def _line(text: str) -> str:
    """``function (path:line)`` with the path from its package on (``stragglerkit/...``, ``torch/...``)."""
    name, _, where = text.strip().partition(" (")
    where = where.rstrip(")")
    for marker in ("stragglerkit/", "torch/", "numpy/", "horovod/", "megatron/"):
        at = where.rfind(marker)
        if at >= 0:
            where = where[at:]
            break
    return f"{name} ({where})"


def _frame(text: str) -> str | None:
    """``function (stragglerkit/...py)`` for a frame of the package, else None."""
    name, _, where = text.strip().partition(" (")
    where = where.rstrip(")")
    marker = "stragglerkit/"
    at = where.rfind(marker)
    if at < 0 or "/profiling/" in where:
        return None
    file = where[at:].split(":")[0]
    return f"{name} ({file})"


# -- the summary -------------------------------------------------------------------------------------
def _q(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _row(path: str, size_mib: float, ranks: list[dict[str, Any]], quiet_probe_every: int, skip: int) -> dict[str, Any]:
    """One path and size: the figures of the summary (see the module docstring)."""
    # steps that ran the baseline (a loaded machine can make the loop switch: those steps are the plan's)
    baseline = [{row["step"] for row in r["rows"] if row["algorithm"] == "allreduce"} for r in ranks]
    bucket_cpu = [cpu for r, ok in zip(ranks, baseline) for step, cpu, _ in r["bucket_us"] if step in ok]
    bucket_wall = [wall for r, ok in zip(ranks, baseline) for step, _, wall in r["bucket_us"] if step in ok]
    completion = [us for r, ok in zip(ranks, baseline) for step, us in r["completion_us"] if step in ok]
    # the probes' extra collective time: the ring against the group's AllReduce of the same bucket
    extra: list[float] = []
    for r in ranks:
        for index, ring in zip(r["probe_index"], r["probe_durations_us"]):
            plain = r["durations_us"].get(str(index))
            if plain:
                extra.append(ring - statistics.median(plain))
    probe_extra_us = statistics.median(extra) if extra else None
    probe_amortized = max(probe_extra_us or 0.0, 0.0) / quiet_probe_every
    per_rank = []
    for r, ok in zip(ranks, baseline):
        rows = [row for row in r["rows"] if row["step"] in ok]
        steps = [row["step_us"] for row in rows]
        ours = [row["ours_us"] for row in rows]
        ours_threads = (*OURS_THREADS, "allreduce_group") if path == "horovod" else OURS_THREADS
        threads = {
            k: round(statistics.mean(row["threads"].get(k, 0.0) for row in rows), 1)
            for k in sorted({k for row in rows for k in row["threads"]})
        }
        loop_threads = sum(v for k, v in threads.items() if k in ours_threads)
        step_mean = statistics.mean(steps)
        per_rank.append(
            {
                "rank": r["rank"],
                "step_us": step_mean,
                "ours_us": statistics.mean(ours),
                "ours_median_us": statistics.median(ours),
                "ours_p90_us": _q(ours, 0.9),
                "hand_off_us": statistics.mean(row["hand_off_us"] for row in rows),
                "hand_off_wall_us": statistics.mean(row["hand_off_wall_us"] for row in rows),
                "wait_beyond_us": statistics.mean(row["wait_beyond_us"] for row in rows),
                "buckets": statistics.median(row["buckets"] for row in rows),
                "loop_threads_us": loop_threads,
                "threads": threads,
                "thread_names": r["thread_names_us_per_step"],
                "share_training": statistics.mean(ours) / step_mean,
                "share_all": (statistics.mean(ours) + loop_threads + probe_amortized) / step_mean,
                "exchange_steps": sum(1 for row in rows if row["exchange_start"] or row["exchange_receive"]),
                "by_kind": _by_kind(rows),
                "wait_completion_us": statistics.mean(row["wait_completion_us"] for row in rows),
                "wait_beyond_wall_us": statistics.mean(row["wait_beyond_wall_us"] for row in rows),
                "probe_steps": sum(1 for row in rows if row["probe"]),
                "steps": len(rows),
            }
        )
    worst = max(per_rank, key=lambda p: p["share_all"])
    buckets_per_step = worst["buckets"]
    per_bucket_all_in = max(p["ours_us"] / max(p["buckets"], 1) for p in per_rank)
    profile = ranks[0].get("profile") or {}
    profiled = profile.get("bytes_per_step", [])
    on_baseline = sorted((i for i in profiled if i["algorithm"] == "allreduce"), key=lambda i: i["written"])
    median_step = on_baseline[len(on_baseline) // 2] if on_baseline else {}
    r1 = lambda v: round(v, 1)  # noqa: E731
    return {
        "path": path,
        "size_mib": size_mib,
        "buckets_per_step": buckets_per_step,
        "framework_buckets": len(ranks[0]["buckets"]),
        "bucket_bytes": ranks[0]["buckets"],
        "steps_measured": worst["steps"],
        "steps_off_baseline": max(len(r["rows"]) - len(ok) for r, ok in zip(ranks, baseline)),
        "exchange_steps": worst["exchange_steps"],
        "probe_steps": max(p["probe_steps"] for p in per_rank),
        "step_ms": round(statistics.mean(p["step_us"] for p in per_rank) / 1e3, 2),
        "per_bucket_us": {"median": r1(_q(bucket_cpu, 0.5)), "p90": r1(_q(bucket_cpu, 0.9)), "n": len(bucket_cpu)},
        "per_bucket_wall_us": {"median": r1(_q(bucket_wall, 0.5)), "p90": r1(_q(bucket_wall, 0.9))},
        "completion_us": {"median": r1(_q(completion, 0.5)), "p90": r1(_q(completion, 0.9)), "n": len(completion)},
        "per_step_us": {
            "mean": r1(worst["ours_us"]),
            "median": r1(worst["ours_median_us"]),
            "p90": r1(worst["ours_p90_us"]),
            "hand_off": r1(worst["hand_off_us"]),
            "hand_off_wall": r1(worst["hand_off_wall_us"]),
            "wait_beyond_collective": r1(worst["wait_beyond_us"]),
            "of_which_completion": r1(worst["wait_completion_us"]),
            "wait_beyond_collective_wall": r1(worst["wait_beyond_wall_us"]),
        },
        "per_step_by_kind_us": worst["by_kind"],
        "per_bucket_all_in_us": r1(per_bucket_all_in),
        "loop_threads_us_per_step": r1(worst["loop_threads_us"]),
        "threads_us_per_step": worst["threads"],
        "thread_names_us_per_step": worst["thread_names"],
        "probe": {
            "ring_extra_us": None if probe_extra_us is None else r1(probe_extra_us),
            "every": quiet_probe_every,
            "amortized_us_per_step": r1(probe_amortized),
        },
        "extra_bytes_per_step": {
            "written": median_step.get("written"),
            "allocated": median_step.get("allocated"),
            "written_by_op": median_step.get("written_by_op"),
            "profiled": [
                {k: item[k] for k in ("step", "kind", "algorithm", "written", "allocated")} for item in profiled
            ],
        },
        "profile": {k: profile.get(k) for k in ("profiled_steps", "hand_off_us_per_step", "hand_off_top")},
        "share_of_step": {"training_thread": round(worst["share_training"], 5), "all": round(worst["share_all"], 5)},
        "worst_rank": worst["rank"],
        "loop": {
            "algorithms": sorted({row["algorithm"] for r in ranks for row in r["rows"]}),
            "exchange_every": ranks[0]["exchange_every"],
            "probe_every": ranks[0]["probe_every"],
            "events_in_window": [{**e, "why": str(e["why"])[:200]} for e in ranks[0]["events"] if e["step"] >= skip],
        },
        "per_rank_share_all": [round(p["share_all"], 5) for p in sorted(per_rank, key=lambda p: p["rank"])],
        "met": {
            "per_bucket": per_bucket_all_in <= TARGET_PER_BUCKET_US,
            "share": worst["share_all"] <= TARGET_SHARE,
        },
    }


def _by_kind(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean training-thread time of ours per step by what the step did (:func:`_kind`), with the
    number of such steps."""
    kinds: dict[str, list[float]] = {"plain": [], "exchange_start": [], "exchange_receive": [], "probe": []}
    for row in rows:
        kinds[_kind(row)].append(row["ours_us"])
    return {k: {"mean": round(statistics.mean(v), 1), "steps": len(v)} if v else None for k, v in kinds.items()}


def _instrumentation_ns() -> dict[str, float]:
    """What the bench's wrappers cost per call on this machine (thread CPU time, ns): an entry point
    of ours around a function that does nothing, and one with the framework's work inside it. Part
    of it falls inside the measured interval, so the figures include up to a few us a bucket of it."""
    acct = Accounting()

    def nothing() -> None:
        return None

    framework = acct.framework(nothing, "calibration")
    wrapped = {
        "plain": nothing,
        "ours": acct.ours(nothing, "hand_off"),
        "ours_with_framework": acct.ours(framework, "hand_off"),
    }
    calls = 20000
    cost: dict[str, float] = {}
    for name, fn in wrapped.items():
        start = time.thread_time_ns()
        for _ in range(calls):
            fn()
        cost[name] = (time.thread_time_ns() - start) / calls
    return {name: round(ns - cost["plain"]) for name, ns in cost.items() if name != "plain"}


def _sizes(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--sizes", default="8,32", help="gradient sizes in MiB, comma-separated (default 8,32)")
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100, help="steps of each run, the profiled ones not counted")
    parser.add_argument("--skip", type=int, default=40, help="steps not measured (warm-up and the first probes)")
    parser.add_argument("--profile-steps", type=int, default=4, help="steps under torch.profiler after the skipped")
    parser.add_argument("--pyspy", default="ddp:32", help="PATH:MIB sampled with py-spy on rank 0, or 'none'")
    parser.add_argument("--pyspy-top", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    parser.add_argument(
        "--attempts", type=int, default=2, help="runs of a configuration while its loop leaves the baseline"
    )
    parser.add_argument("--json", type=Path, help="summary file (default profiling/results/bench_loop_cost.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--size-bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    parser.add_argument("--pyspy-marker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown or not paths:
        parser.error(f"--paths: unknown {unknown}; choose from {', '.join(PATHS)}")
    sizes = _sizes(args.sizes)
    if not sizes or min(sizes) <= 0:
        parser.error("--sizes: one or more positive sizes in MiB")
    if args.world_size < 2:
        parser.error("--world-size must be at least 2")
    if not 0 <= args.skip < args.steps:
        parser.error(f"--skip ({args.skip}) must be below --steps ({args.steps})")
    if "horovod" in paths and not (BIN / "horovodrun").exists() and not shutil.which("horovodrun"):
        parser.error("the horovod path needs horovodrun (bash scripts/install_horovod.sh)")
    from _env import RESULTS, write_summary

    from stragglerkit import defaults

    started = time.monotonic()
    rows = []
    for path in paths:
        for size in sizes:
            print(f"[loop_cost] {path} {size:g} MiB: {args.world_size} ranks, {args.steps} steps", flush=True)
            load = os.getloadavg()[0]
            for attempt in range(1, args.attempts + 1):
                ranks = _launch(args, path, size)
                left = sorted({row["algorithm"] for r in ranks for row in r["rows"]} - {"allreduce"})
                if not left:
                    break
                print(
                    f"[loop_cost] {path} {size:g} MiB: the loop left the baseline for {', '.join(left)} "
                    f"(attempt {attempt}/{args.attempts}; a loaded machine delays ranks and links)",
                    flush=True,
                )
            row = _row(path, size, ranks, defaults.QUIET_PROBE_EVERY, args.skip)
            row["attempts"] = attempt
            row["load_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            rows.append(row)
            print(
                f"[loop_cost] {path} {size:g} MiB: step {row['step_ms']:.1f} ms, {row['buckets_per_step']:g} buckets; "
                f"per bucket {row['per_bucket_us']['median']:.1f} us (p90 {row['per_bucket_us']['p90']:.1f}), "
                f"all in {row['per_bucket_all_in_us']:.1f} us; per step {row['per_step_us']['mean']:.1f} us + "
                f"threads {row['loop_threads_us_per_step']:.1f} us = {100 * row['share_of_step']['all']:.3f} % "
                f"of the step; written {row['extra_bytes_per_step']['written']} B/step "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    pyspy = None
    if args.pyspy != "none":
        where, _, mib = args.pyspy.partition(":")
        if where not in PATHS or not mib:
            parser.error("--pyspy: PATH:MIB, e.g. ddp:32, or none")
        print(f"[loop_cost] py-spy on rank 0 of {where} {mib} MiB", flush=True)
        with tempfile.TemporaryDirectory(prefix="loop_cost_pyspy_") as folder:
            _launch(args, where, float(mib), pyspy=Path(folder))
            raw = Path(folder) / "pyspy.txt"
            if raw.exists():
                pyspy = {"path": where, "size_mib": float(mib), "rank": 0, "rate_hz": PYSPY_RATE_HZ}
                pyspy.update(_pyspy_top(raw.read_text(), args.pyspy_top))
                for item in pyspy["top"]:
                    print(f"[loop_cost] py-spy: {item['inclusive_share']:7.2%} {item['frame']}", flush=True)
            else:
                print("[loop_cost] py-spy wrote no samples", flush=True)
    record = {
        "world_size": args.world_size,
        "transport": "gloo over loopback",
        "steps": args.steps,
        "skip": args.skip,
        "profile_steps": args.profile_steps,
        "attempts": args.attempts,
        "targets": {"per_bucket_us": TARGET_PER_BUCKET_US, "share_of_step": TARGET_SHARE},
        "instrumentation_ns": _instrumentation_ns(),
        "rows": rows,
        "pyspy": pyspy,
    }
    write_summary(args.json or RESULTS / "bench_loop_cost.json", "loop_cost", record)
    print(f"[loop_cost] done in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()

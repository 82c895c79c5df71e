"""One rank of ``stragglerkit bench``: runs every (size, algorithm) case and records the timings.

Every rank runs the same loop inside an initialised process group. Per buffer size:

1. Inputs whose sum is exact in the dtype: rank r holds ``(7i + 3r) mod m`` at element i (small
   integers), so the expected sum is known in closed form and every iteration of every algorithm is
   compared with it element by element (``#wrong`` counts the elements that differ).
2. With ``--delay auto`` the straggler's delay is measured first: StragglAR runs with the straggler
   held back long enough, and the punctual ranks read from the executor's per-op timings when their
   pre-phase ReduceScatter finished; the delay is the median over the calibration runs of the
   slowest punctual rank's pre-phase time.
3. Warm-up iterations of every algorithm, then ``iters`` timed iterations in which the algorithms
   take turns (the order rotates each iteration), so that a load change on the machine hits all
   of them alike. An iteration: copy the input, barrier, the straggler sleeps its delay, then
   ``arrival = time.time()``, the AllReduce, ``finish = time.time()``, a second barrier, and only
   then the comparison with the expected sum (so that no rank's checking competes for a core with
   a rank still in the AllReduce, as it would on an emulated cluster, whose hosts share the
   machine's cores). Each rank also reads its host's CPU counters after the first barrier and after
   the finish (:mod:`stragglerkit.bench.cpu_load`).
4. The per-rank arrival and finish times of every iteration are gathered on rank 0, which returns
   them as case records (:mod:`stragglerkit.bench.results` turns them into the table).

:func:`main` (``argv``: CONFIG JOB OUT, as the launcher starts it) runs one rank from the environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and writes rank 0's records to OUT (JSON).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

import stragglerkit
from stragglerkit.bench.config import BASELINE, BenchConfig
from stragglerkit.bench.cpu_load import CpuTimes, run_queue_wait_ns
from stragglerkit.bench.progress import Progress
from stragglerkit.runtime.calls import RunRecord
from stragglerkit.runtime.trace import rank_trace
from stragglerkit.schedules.registry import Situation, why_not
from stragglerkit.testbed.inject import sleep_precisely

__all__ = ["Job", "exact_inputs", "main", "measure_pre_phase", "run_job"]

_EXACT_INTEGERS = {  # largest integer up to which every integer is exact in the dtype
    torch.float16: 2048,
    torch.bfloat16: 256,
    torch.float32: 2**24,
    torch.float64: 2**53,
    torch.int32: 2**31 - 1,
    torch.int64: 2**63 - 1,
}
_CALIBRATION_RUNS = 3
_CALIBRATION_ATTEMPTS = 8


@dataclass(kw_only=True, slots=True)
class Job:
    """What one group of ranks runs: a scenario and the algorithms to measure in it."""

    scenario: str
    """``none``, ``straggler`` or ``degraded`` (the NICs are already reshaped by the launcher)."""
    algorithms: list[str] = field(default_factory=list)


def exact_inputs(numel: int, rank: int, world_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input of rank, expected sum)``: small integers whose sum over all ranks is exact in ``dtype``.

    Example::

        x, expected = exact_inputs(10, rank=0, world_size=4, dtype=torch.bfloat16)
    """
    limit = _EXACT_INTEGERS[dtype]
    modulus = max(2, min(5, limit // world_size + 1))
    period = torch.arange(modulus, dtype=torch.int64)
    index = (period * 7) % modulus
    own = (index + 3 * rank) % modulus
    total = sum((index + 3 * r) % modulus for r in range(world_size))
    assert isinstance(total, torch.Tensor)
    repeats = -(-numel // modulus)
    return own.repeat(repeats)[:numel].to(dtype), total.repeat(repeats)[:numel].to(dtype)


class _Rank:
    """The state of this rank: group, device, scenario."""

    def __init__(self, config: BenchConfig, job: Job, device: torch.device) -> None:
        self.config = config
        self.job = job
        self.device = device
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.straggler = config.straggler if job.scenario == "straggler" else None
        self.slowdowns = dict(config.degrade) if job.scenario == "degraded" else {}
        self.progress = Progress(len(config.sizes) * config.iters, "bench", unit="iteration", enabled=self.rank == 0)
        """Rank 0 reports: a bar over every size's iterations on a terminal, plain lines elsewhere."""

    def situation(self) -> Situation:
        return Situation(world_size=self.world_size, straggler=self.straggler, slowdowns=self.slowdowns)

    def applicable(self) -> list[str]:
        """The job's algorithms that apply here (gloo and auto always do)."""
        situation = self.situation()
        return [a for a in self.job.algorithms if a in (BASELINE, "auto") or why_not(a, situation) is None]

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def all_reduce(self, algorithm: str, x: torch.Tensor) -> tuple[str, RunRecord | None]:
        """One AllReduce of ``x`` in place; the algorithm that ran and its record (None: gloo's)."""
        if algorithm == BASELINE:
            dist.all_reduce(x)
            return BASELINE, None

        stragglerkit.all_reduce(x, algorithm=algorithm, straggler=self.straggler, slowdowns=self.slowdowns)
        record = stragglerkit.last_run()
        assert record is not None
        return record.algorithm, record

    def iteration(
        self,
        algorithm: str,
        x: torch.Tensor,
        source: torch.Tensor,
        expected: torch.Tensor,
        delay: float,
        keep_trace: bool = False,
    ) -> tuple[float, float, int, str, dict[str, Any], CpuTimes | None, int | None]:
        """(arrival, finish, wrong elements, algorithm that ran, its per-op trace, CPU time of this
        host and this rank's run-queue wait in ns, both from the barrier to the finish) of one timed
        AllReduce. The trace: ``timeline`` (per phase/round label, first post and last completion
        after this rank's arrival) and ``critical`` (:func:`stragglerkit.runtime.trace.rank_trace`);
        empty for gloo's all_reduce and unless ``keep_trace``."""
        x.copy_(source)
        self.synchronize()
        dist.barrier()
        cpu_before, waited_before = CpuTimes.read(), run_queue_wait_ns()
        if self.rank == self.straggler:
            sleep_precisely(delay)
        arrival, entered_ns = time.time(), time.monotonic_ns()
        ran, record = self.all_reduce(algorithm, x)
        self.synchronize()
        finish = time.time()
        cpu_after, waited_after = CpuTimes.read(), run_queue_wait_ns()
        trace: dict[str, Any] = {}
        if record is not None and keep_trace:
            trace = {
                "timeline": _timeline(record.labelled_timings(), entered_ns),
                "critical": rank_trace(record, entered_ns),
            }
        cpu = cpu_after - cpu_before if cpu_after is not None and cpu_before is not None else None
        waited = None if waited_after is None or waited_before is None else max(0, waited_after - waited_before)
        # Check only once every rank has finished: on an emulated cluster the hosts share the
        # machine's cores, and a rank that finished early would otherwise compare and copy its
        # buffers on a core that a rank still in the AllReduce needs.
        dist.barrier()
        wrong = 0 if torch.equal(x, expected) else int((x != expected).sum().item())
        return arrival, finish, wrong, ran, trace, cpu, waited

    # -- the straggler's delay ------------------------------------------------------------------
    def measure_pre_phase(self, x: torch.Tensor, source: torch.Tensor, size_bytes: int) -> dict[str, Any]:
        """The punctual ranks' StragglAR pre-phase time, with the straggler held back (seconds)."""
        assert self.straggler is not None
        return measure_pre_phase(x, source, self.straggler, self.config.bandwidth, self.synchronize)

    # -- one buffer size ------------------------------------------------------------------------
    def run_size(self, size_bytes: int, algorithms: list[str], index: int, total: int) -> list[dict[str, Any]]:
        dtype = getattr(torch, self.config.dtype)
        element = torch.empty(0, dtype=dtype).element_size()
        numel = max(1, size_bytes // element)
        source, expected = exact_inputs(numel, self.rank, self.world_size, dtype)
        source, expected = source.to(self.device), expected.to(self.device)
        x = torch.empty_like(source)
        where = f"[{index + 1}/{total}] {size_bytes / 2**20:g} MiB {self.job.scenario}"
        delay = 0.0
        calibration: dict[str, Any] | None = None
        if self.straggler is not None:
            if self.config.delay is None:
                calibration = self.measure_pre_phase(x, source, size_bytes)
                delay = calibration["delay_s"]
                self.progress.note(f"{where}: delay auto = pre-phase {delay * 1e3:.1f} ms")
            else:
                delay = self.config.delay
        for algorithm in algorithms:
            for _ in range(self.config.warmup):
                self.iteration(algorithm, x, source, expected, delay)
        samples: dict[str, dict[str, Any]] = {
            a: {"arrival": [], "finish": [], "wrong": 0, "ran": a, "trace": {}, "cpu": [], "waited": []}
            for a in algorithms
        }
        for it in range(self.config.iters):
            shift = it % len(algorithms)
            for algorithm in algorithms[shift:] + algorithms[:shift]:
                last = it == self.config.iters - 1
                arrival, finish, wrong, ran, trace, cpu, waited = self.iteration(
                    algorithm, x, source, expected, delay, keep_trace=last
                )
                sample = samples[algorithm]
                sample["waited"].append(waited)
                if cpu is not None:
                    sample["cpu"].append([cpu.busy, cpu.softirq, cpu.total])
                if last:
                    sample["trace"] = trace
                sample["arrival"].append(arrival)
                sample["finish"].append(finish)
                sample["wrong"] += wrong
                sample["ran"] = ran
            self.progress.advance(1, f"{where}: iteration {it + 1}/{self.config.iters}")
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, samples)
        cases = []
        for algorithm in algorithms:
            per_rank = [g[algorithm] for g in gathered]
            cases.append(
                {
                    "scenario": self.job.scenario,
                    "algorithm": algorithm,
                    "ran": per_rank[0]["ran"],
                    "size_bytes": numel * element,
                    "count": numel,
                    "dtype": self.config.dtype,
                    "world_size": self.world_size,
                    "straggler": self.straggler,
                    "slowdowns": {str(k): v for k, v in self.slowdowns.items()},
                    "delay_s": delay,
                    "calibration": calibration,
                    # [iteration][rank]
                    "arrival": [list(t) for t in zip(*(p["arrival"] for p in per_rank), strict=True)],
                    "finish": [list(t) for t in zip(*(p["finish"] for p in per_rank), strict=True)],
                    "wrong": sum(p["wrong"] for p in per_rank),
                    # per rank: phase/round label -> [first post, last completion] in seconds after that
                    # rank's own arrival, from the executor's per-op timings of the last iteration
                    "timeline": [p["trace"].get("timeline", {}) for p in per_rank],
                    # per rank: its messages of the last iteration and their dependencies, for the
                    # critical path (stragglerkit.report.critical_path); None for gloo's all_reduce
                    "critical": [p["trace"].get("critical") for p in per_rank],
                    # per rank: [busy, softirq, total] CPU ticks of its host, summed over the iterations
                    "cpu": [[sum(c[i] for c in p["cpu"]) for i in range(3)] if p["cpu"] else None for p in per_rank],
                    # [iteration][rank]: ns the rank's threads waited in a run queue (None: unknown)
                    "waited_ns": [list(t) for t in zip(*(p["waited"] for p in per_rank), strict=True)],
                }
            )
        return cases


def measure_pre_phase(
    x: torch.Tensor,
    source: torch.Tensor,
    straggler: int,
    bandwidth: float | None,
    synchronize: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """The punctual ranks' StragglAR pre-phase time on ``x``, with ``straggler`` held back.

    Collective over the default group. Each run copies ``source`` into ``x``, holds the straggler
    back long enough (the hold doubles if it came back too soon) and reads, from the executor's
    per-op timings, when each punctual rank's last pre-phase (``reduce_scatter``) message completed;
    ``delay_s`` is the median over the runs of the slowest punctual rank's pre-phase time.

    Example::

        measured = measure_pre_phase(torch.ones(2**20), torch.ones(2**20), straggler=3, bandwidth=125e6)
        delay = measured["delay_s"]
    """

    rank = dist.get_rank()
    size_bytes = x.numel() * x.element_size()
    hold = 0.02 + 3.0 * size_bytes / (bandwidth or 200e6)
    x.copy_(source)
    stragglerkit.all_reduce(x, algorithm="stragglar", straggler=straggler)  # builds the plan
    measured: list[float] = []
    holds: list[float] = []
    for _ in range(_CALIBRATION_ATTEMPTS):
        x.copy_(source)
        synchronize()
        dist.barrier()
        if rank == straggler:
            sleep_precisely(hold)
        entered = time.monotonic_ns()
        stragglerkit.all_reduce(x, algorithm="stragglar", straggler=straggler)
        record = stragglerkit.last_run()
        assert record is not None
        synchronize()
        pre_done = [t.end_ns for label, t in record.labelled_timings() if label.startswith("reduce_scatter")]
        own = (max(pre_done) - entered) / 1e9 if pre_done and rank != straggler else 0.0
        slowest = torch.tensor([own], dtype=torch.float64, device=x.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = float(slowest.item())
        if seconds > 0.8 * hold:  # the straggler came back too early: hold it longer and repeat
            hold = 2.0 * seconds + 0.01
            continue
        measured.append(seconds)
        holds.append(hold)
        if len(measured) == _CALIBRATION_RUNS:
            break
    if not measured:
        raise RuntimeError("could not measure the pre-phase: it never finished before the straggler's return")
    return {"delay_s": statistics.median(measured), "pre_phase_s": measured, "hold_s": holds}


def _timeline(timings: list[tuple[str, Any]], entered_ns: int) -> dict[str, list[float]]:
    spans: dict[str, list[float]] = {}
    for label, timing in timings:
        start, end = (timing.start_ns - entered_ns) / 1e9, (timing.end_ns - entered_ns) / 1e9
        span = spans.setdefault(label, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    return spans


def run_job(config: BenchConfig, job: Job, device: torch.device | None = None) -> list[dict[str, Any]]:
    """Run ``job`` on this rank of the initialised default group; the case records (same on every rank)."""
    state = _Rank(config, job, device or torch.device("cpu"))
    algorithms = state.applicable()
    if not algorithms:
        return []
    cases: list[dict[str, Any]] = []
    try:
        for index, size in enumerate(config.sizes):
            cases.extend(state.run_size(size, algorithms, index, len(config.sizes)))
    finally:
        state.progress.close()
    return cases


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m stragglerkit.bench.worker CONFIG.json JOB.json OUT.json", file=sys.stderr)
        return 2
    config_path, job_path, out_path = args
    with open(config_path, encoding="utf-8") as handle:
        config = BenchConfig.from_json(handle.read())
    with open(job_path, encoding="utf-8") as handle:
        job = Job(**json.load(handle))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=_timedelta(config.timeout))
    try:
        stragglerkit.init(config=stragglerkit.Config().replace(executor={"timeout": config.timeout}))
        cases = run_job(config, job)
        if dist.get_rank() == 0:
            with open(out_path + ".tmp", "w", encoding="utf-8") as handle:
                json.dump({"job": asdict(job), "cases": cases}, handle)
            os.replace(out_path + ".tmp", out_path)
        dist.barrier()
    finally:
        stragglerkit.destroy()
        dist.destroy_process_group()
    return 0


def _timedelta(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


if __name__ == "__main__":
    sys.exit(main())

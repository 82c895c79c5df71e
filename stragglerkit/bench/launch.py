"""Where ``stragglerkit bench`` runs its ranks: emulated cluster, loopback, or under torchrun.

* **torchrun** (RANK, WORLD_SIZE and MASTER_ADDR set): this process *is* one rank; NCCL when it
  has a GPU, gloo otherwise; the real network, no emulation. Rank 0 gets the results.
* **emulated** (``EmulatedCluster.available()``): one host per rank, each a network namespace whose
  NIC is shaped to ``--bandwidth``; ``--degrade`` reshapes a host's link for the degraded scenario
  (and, by default, gloo is then also measured with every NIC healthy, as the fault-free baseline).
* **loopback**: ranks as local processes over 127.0.0.1 (no shaping; only CPU and memory limit).

A group of ranks runs one :class:`~stragglerkit.bench.worker.Job`; each rank is
``stragglerkit.bench.worker.main``; rank 0 writes the case records to a file that the launcher
reads. Every process started here is ended, and every namespace removed, on the way out. The
training bench (``profiling/lab/train.py``, outside the package) starts its ranks with the same
functions (:func:`run_ranks`, :func:`loopback_ranks`, :func:`cluster_ranks`, :func:`torchrun_device`).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from stragglerkit.bench.config import BASELINE, BenchConfig
from stragglerkit.bench.worker import Job
from stragglerkit.errors import StragglerKitError
from stragglerkit.units import parse_bandwidth

if TYPE_CHECKING:
    import torch

__all__ = [
    "EnvFor",
    "LaunchResult",
    "Starter",
    "by_mode",
    "cluster_ranks",
    "detect_mode",
    "jobs_for",
    "launch",
    "launch_emulated_together",
    "loopback_ranks",
    "run_ranks",
    "torchrun_device",
    "torchrun_finish",
]

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_DEFAULT_ALPHA = 50e-6
_TAIL = 3000


@dataclass(slots=True)
class LaunchResult:
    """What the ranks measured, and where: the case records plus a description of the setting."""

    mode: str
    why: str
    cases: list[dict[str, Any]] = field(default_factory=list)
    cluster: dict[str, Any] | None = None
    """``EmulatedCluster.describe()`` (healthy), plus ``degraded_links`` as measured after reshaping."""
    alpha: float = _DEFAULT_ALPHA
    """Per-message latency used by the model (half the median TCP round trip on the emulated cluster)."""
    is_reporter: bool = True
    """False on torchrun ranks other than 0 (they print nothing)."""


def torchrun_env(env: Mapping[str, str]) -> bool:
    return all(key in env for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def where_ranks_run(
    loopback: bool, world_size: int | None, bandwidth: float | None
) -> tuple[str, str, int, float | None]:
    """``(mode, why, world size, bandwidth)`` for a launch: :func:`detect_mode`'s mode; torchrun's
    world size (``world_size`` must agree or be ``None``), else ``world_size`` or 8; on the
    emulated cluster 1 Gbit/s unless ``bandwidth`` is given."""
    mode, why = detect_mode(loopback)
    ranks = world_size if world_size is not None else 8
    if mode == "torchrun":
        ranks = int(os.environ["WORLD_SIZE"])
        if world_size not in (None, ranks):
            raise ValueError(f"--world-size {world_size} differs from torchrun's WORLD_SIZE; leave it out")
    if bandwidth is None and mode == "emulated":
        bandwidth = parse_bandwidth("1Gbit")
    return mode, why, ranks, bandwidth


def detect_mode(loopback: bool, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(mode, why)``: torchrun if its environment is set, else emulated when possible, else loopback."""
    environ = os.environ if env is None else env
    if torchrun_env(environ):
        return "torchrun", f"torchrun environment (RANK={environ['RANK']}, WORLD_SIZE={environ['WORLD_SIZE']})"
    if loopback:
        return "loopback", "asked for with --loopback"
    from stragglerkit.testbed import EmulatedCluster

    ok, reason = EmulatedCluster.available()
    if ok:
        return "emulated", "emulated cluster: one network namespace per rank with a shaped NIC"
    return "loopback", f"no emulated cluster ({reason}); falling back to loopback"


def jobs_for(config: BenchConfig) -> list[Job]:
    """The groups of ranks a run needs: its scenario, plus the healthy gloo baseline with --degrade."""
    jobs = [Job(scenario=config.scenario, algorithms=list(config.algorithms))]
    if config.scenario == "degraded" and config.mode == "emulated" and config.fault_free_baseline:
        jobs.append(Job(scenario="none", algorithms=[BASELINE]))
    return jobs


# --------------------------------------------------------------------------- spawning ranks (both benches)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _python_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": _PACKAGE_ROOT + (os.pathsep + path if path else ""), "OMP_NUM_THREADS": "1"}


Starter = Callable[[int, list[str], dict[str, str], Any], "subprocess.Popen[Any]"]
"""Starts rank ``r``'s process: ``(rank, argv, environment additions, stderr)``."""
EnvFor = Callable[[int], dict[str, str]]
"""The torch.distributed environment of rank ``r``."""


def loopback_ranks(world_size: int) -> tuple[Starter, EnvFor]:
    """Local processes over 127.0.0.1, meeting on a free port."""
    port = _free_port()

    def env_for(rank: int) -> dict[str, str]:
        return {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "GLOO_SOCKET_IFNAME": "lo",
        }

    def start(rank: int, argv: list[str], env: dict[str, str], stderr: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(argv, env={**os.environ, **env}, stderr=stderr)

    return start, env_for


def cluster_ranks(cluster: Any, port: int) -> tuple[Starter, EnvFor]:
    """One process per host of the emulated ``cluster``, meeting on ``port``."""

    def env_for(rank: int) -> dict[str, str]:
        return dict(cluster.torch_env(rank, port=port))

    def start(rank: int, argv: list[str], env: dict[str, str], stderr: Any) -> subprocess.Popen[Any]:
        return cluster.popen(rank, argv, env=env, stderr=stderr)

    return start, env_for


def run_ranks(
    world_size: int,
    timeout: float,
    module: str,
    args: list[str],
    ranks: tuple[Starter, EnvFor],
    logs_at: Path,
    scenario: str,
) -> None:
    """Run ``module``'s ``main`` on every rank with ``args``, wait for all, and raise a
    :class:`StragglerKitError` naming the ranks that failed (with the end of one's stderr). Rank 0's
    stderr goes to the terminal, the others' to ``{logs_at}-rank{r}.log``."""
    start, env_for = ranks
    entry = f"import sys; from {module} import main; sys.exit(main())"
    argv = [sys.executable, "-c", entry, *args]
    logs = [open(f"{logs_at}-rank{r}.log", "w+b") for r in range(world_size)]
    procs: list[subprocess.Popen[Any]] = []
    try:
        for rank in range(world_size):
            stderr = None if rank == 0 else logs[rank]
            procs.append(start(rank, argv, {**_python_env(), **env_for(rank)}, stderr))
        failed = _wait_all(procs, timeout)
        if failed:
            raise StragglerKitError(_failure_text(failed, logs, scenario))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for log in logs:
            log.close()


def _wait_all(procs: list[subprocess.Popen[Any]], timeout: float) -> list[tuple[int, int | None]]:
    """Wait for every rank; as soon as one fails, give the others a moment and stop them."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            time.sleep(2.0)  # let the other ranks raise their own errors (abort notes)
            return [(r, p.poll()) for r, p in enumerate(procs) if p.poll() != 0]
        if all(c == 0 for c in codes):
            return []
        time.sleep(0.05)
    return [(r, p.poll()) for r, p in enumerate(procs) if p.poll() != 0]


def _failure_text(failed: list[tuple[int, int | None]], logs: list[Any], scenario: str) -> str:
    lines = [f"bench ranks failed in the {scenario!r} scenario:"]
    for rank, code in failed:
        state = "timed out" if code is None else f"exit code {code}"
        lines.append(f"  rank {rank}: {state}")
    for rank, _ in failed:
        if rank == 0:
            continue  # its stderr went to the terminal
        logs[rank].flush()
        logs[rank].seek(0)
        tail = logs[rank].read().decode(errors="replace")[-_TAIL:].strip()
        if tail:
            lines.append(f"--- rank {rank} stderr (end) ---\n{tail}")
            break
    return "\n".join(lines)


def torchrun_device(world_size: int, timeout: float | None = None) -> tuple[str, torch.device]:
    """Under torchrun: join the process group (NCCL with a GPU, gloo otherwise) and check that it
    has ``world_size`` ranks; ``(backend, this rank's device)``."""
    import datetime

    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available()
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if timeout is None:
            dist.init_process_group(backend)
        else:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    if dist.get_world_size() != world_size:
        raise ValueError(
            f"--world-size {world_size} differs from torchrun's WORLD_SIZE={dist.get_world_size()}; "
            "leave --world-size out under torchrun"
        )
    return backend, device


def torchrun_finish() -> bool:
    """Under torchrun: wait for every rank and leave the process group; is this rank 0 (the reporter)?"""
    import torch.distributed as dist

    reporter = dist.get_rank() == 0
    dist.barrier()
    dist.destroy_process_group()
    return reporter


Result = TypeVar("Result")


def by_mode(
    mode: str,
    prefix: str,
    torchrun: Callable[[], Result],
    emulated: Callable[[Path], Result],
    loopback: Callable[[Path], Result],
) -> Result:
    """Call the launcher of ``mode``; the emulated and loopback ones get a scratch folder, removed after."""
    if mode == "torchrun":
        return torchrun()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return (emulated if mode == "emulated" else loopback)(Path(tmp))


# --------------------------------------------------------------------------- the AllReduce bench


def _run_group(config: BenchConfig, job: Job, workdir: Path, ranks: tuple[Starter, EnvFor]) -> list[dict[str, Any]]:
    """Run ``job`` on every rank; rank 0's case records."""
    tag = f"{job.scenario}-{len(list(workdir.glob('job-*.json')))}"
    config_path, job_path, out_path = workdir / "config.json", workdir / f"job-{tag}.json", workdir / f"out-{tag}.json"
    config_path.write_text(config.to_json(), encoding="utf-8")
    job_path.write_text(json.dumps(asdict(job)), encoding="utf-8")
    args = [str(config_path), str(job_path), str(out_path)]
    run_ranks(config.world_size, config.timeout, "stragglerkit.bench.worker", args, ranks, workdir / tag, job.scenario)
    data = json.loads(out_path.read_text(encoding="utf-8"))
    cases: list[dict[str, Any]] = data["cases"]
    return cases


def _launch_loopback(config: BenchConfig, workdir: Path) -> LaunchResult:
    cases: list[dict[str, Any]] = []
    for job in jobs_for(config):
        cases.extend(_run_group(config, job, workdir, loopback_ranks(config.world_size)))
    return LaunchResult(mode="loopback", why="", cases=cases, alpha=config.alpha or _DEFAULT_ALPHA)


def _launch_emulated(config: BenchConfig, workdir: Path) -> LaunchResult:
    return launch_emulated_together([config], workdir)


def launch_emulated_together(configs: list[BenchConfig], workdir: Path) -> LaunchResult:
    """Run the jobs of every config of ``configs`` on one emulated cluster, one after the other.

    The configs must share the cluster's shape (world size, bandwidth and TCP settings): the
    calibration run measures three scenarios per cluster without building it three times.
    """
    from stragglerkit.testbed import EmulatedCluster, NicDegradation

    config = configs[0]
    assert config.bandwidth is not None
    tcp = ("tcp_send_buffer", "tcp_congestion_control", "tcp_slow_start_after_idle", "fair_queueing")
    shape = ("world_size", "bandwidth", *tcp)
    differ = [name for name in shape for other in configs if getattr(other, name) != getattr(config, name)]
    if differ:
        raise ValueError(f"configs run on one emulated cluster must share {differ[0]}")
    cluster_config = EmulatedCluster.Config(
        hosts=config.world_size, bandwidth=config.bandwidth, **{name: getattr(config, name) for name in tcp}
    )
    cases: list[dict[str, Any]] = []
    with EmulatedCluster(cluster_config) as cluster:
        description = cluster.describe()
        alpha = config.alpha
        if alpha is None:
            alpha = statistics.median(cluster.ping(0, 1, rounds=20)) / 2.0
        jobs = [(each, job) for each in configs for job in jobs_for(each)]
        for index, (each, job) in enumerate(jobs):
            ranks = cluster_ranks(cluster, port=29500 + index)
            if job.scenario == "degraded":
                with NicDegradation(each.degrade).applied(cluster, verify=True) as rates:
                    description["degraded_links"] = [
                        [r.to_dict() for r in pair] for pair in rates if isinstance(pair, tuple)
                    ]
                    cases.extend(_run_group(each, job, workdir, ranks))
            else:
                cases.extend(_run_group(each, job, workdir, ranks))
    return LaunchResult(mode="emulated", why="", cases=cases, cluster=description, alpha=alpha)


def _launch_torchrun(config: BenchConfig) -> LaunchResult:
    from stragglerkit.bench.worker import run_job

    backend, device = torchrun_device(config.world_size)
    cases: list[dict[str, Any]] = []
    for job in jobs_for(config):
        cases.extend(run_job(config, job, device))
    reporter = torchrun_finish()
    return LaunchResult(
        mode="torchrun", why=backend, cases=cases, alpha=config.alpha or _DEFAULT_ALPHA, is_reporter=reporter
    )


def launch(config: BenchConfig, why: str = "") -> LaunchResult:
    """Run every job of ``config`` in ``config.mode``; the case records and the setting."""
    result = by_mode(
        config.mode,
        "stragglerkit-bench-",
        lambda: _launch_torchrun(config),
        lambda workdir: _launch_emulated(config, workdir),
        lambda workdir: _launch_loopback(config, workdir),
    )
    result.why = why or result.why
    return result

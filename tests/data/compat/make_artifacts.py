"""Writes the artifacts that tests/test_compat.py loads: what one release of stragglerkit leaves on a
user's disk (a pickled ``DDPState``, event logs, bench JSON), so that the next one is held to reading it.

Run it with the release's own code first on the path, from a clean checkout of that release (its
compiled extension built or copied into ``stragglerkit/``), for example::

    git worktree add /tmp/sk-release <commit>
    cp stragglerkit/_C*.so /tmp/sk-release/stragglerkit/
    cd /tmp/sk-release && PYTHONPATH=/tmp/sk-release python /path/to/tests/data/compat/make_artifacts.py \\
        --out /path/to/tests/data/compat/<short commit>

The artifacts of fa05462 (0.2.0) were made exactly so, on 2 CPU cores (about a minute). The script
refuses a checkout whose package sources are modified, and records which commit it imported. Paths
that the files keep (the states' event log, the training bench's ``--event-log``) are relative to
the folder (``stragglerkit report bench_train`` joins the training bench's JSON and its logs when
run in the folder, as after a bench run there).

Into ``--out`` it writes:

``ddp_state.rank{r}.pkl``
    each rank's ``stragglerkit.DDPState`` (``pickle``, protocol 4), taken between two steps of a
    4-rank DDP run on gloo over loopback in which rank 3 sleeps 30 ms before every backward, once
    the loop has detected it, switched to StragglAR and run it for 4 steps.
``ddp_state.json``
    what those states hold (the plan, the step, the events, the model and bucket layout of the run,
    the classes the pickles name) and how they were made.
``events/events.rank{r}.jsonl``
    that run's event logs (``Config.report.event_log``), for ``stragglerkit report``.
``bench_allreduce.json``
    ``stragglerkit bench --loopback --world-size 3 --sizes 256KiB ... --json`` (the AllReduce bench).
``bench_train/``
    ``stragglerkit bench --mode train --loopback --world-size 4 --steps 30 ... --event-log --json``
    (the training bench's JSON and its hooked copy's event logs; ``python -m profiling.lab.train``
    with the same options once the training bench left the command line).

tests/test_compat.py reads every folder next to this script, so a release adds its own folder and
keeps the older ones.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import queue
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD_SIZE = 4
LATE_RANK = 3
LATE_S = 0.03
"""Rank 3 sleeps this long before every backward: a persistent straggler."""
BUCKET_CAP_MB = 0.1
MAX_STEPS = 120
STRAGGLAR_STEPS = 4
"""The state is saved once StragglAR has run this many steps."""
STEPS_AFTER = 8
"""Steps run after the save, so that the event log shows the plan at work."""
DETECTION = {
    "warmup_steps": 5,
    "window": 6,
    "confirm": 1,
    "probe_every": 0,
    "min_gain": 0.0,
    "verify_steps": 1000,
    "degraded_threshold": 1e9,
}
"""``Config.detection``: act on a short window, never judge the switch within the run (loopback's
timings on 2 cores say little), never believe a loopback link degraded."""

BENCH_ALLREDUCE = [
    "--loopback", "--world-size", "3", "--sizes", "256KiB", "--iters", "4", "--warmup", "1",
    "--algorithms", "gloo,ring", "--straggler", "2", "--delay", "40ms",
]  # fmt: skip
BENCH_TRAIN = [
    "--mode", "train", "--loopback", "--world-size", "4", "--steps", "30", "--straggler", "3",
    "--delay", "40ms", "--model-size", "1MiB",
]  # fmt: skip


def make_model() -> nn.Module:
    """The DDP run's model (tests/test_compat.py builds the same one, so DDP's buckets match)."""
    return nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 192), nn.ReLU(), nn.Linear(192, 8))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)


class _RecordingUnpickler(pickle.Unpickler):
    """Notes every ``module.name`` a pickle refers to."""

    def __init__(self, data: bytes) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self.names: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.names.add(f"{module}:{name}")
        return super().find_class(module, name)


def _ddp_rank(rank: int, store_path: str, out: str, results: Any) -> None:
    try:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
        torch.set_num_threads(1)
        dist.init_process_group("gloo", store=dist.FileStore(store_path, WORLD_SIZE), rank=rank, world_size=WORLD_SIZE)
        os.chdir(out)  # the paths the state keeps (its event log's) are relative to the folder
        results.put((rank, "ok", _ddp_body(rank, Path("."))))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def _ddp_body(rank: int, out: Path) -> dict[str, Any]:
    import stragglerkit

    event_log = "events/events.rank{rank}.jsonl"
    config = stragglerkit.Config().replace(detection=DETECTION, report={"event_log": event_log})
    stragglerkit.init(config=config)
    torch.manual_seed(0)
    model = DDP(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    state = stragglerkit.DDPState(None)
    model.register_comm_hook(state, stragglerkit.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    algorithms: list[str] = []
    saved: dict[str, Any] | None = None
    stop_at = MAX_STEPS
    step = 0
    while step < stop_at:
        x, y = _batch(rank, step)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        if rank == LATE_RANK:
            time.sleep(LATE_S)
        loss.backward()
        opt.step()
        algorithms.append(state.algorithm)
        step += 1
        if saved is None and algorithms[-STRAGGLAR_STEPS:] == ["stragglar"] * STRAGGLAR_STEPS:
            blob = pickle.dumps(state, protocol=4)  # between steps, as with a checkpoint
            (out / f"ddp_state.rank{rank}.pkl").write_bytes(blob)
            unpickler = _RecordingUnpickler(blob)
            unpickler.load()
            plan = state.loop.controller.plan
            buckets = sorted(state.loop.profiler.buckets(step - 1), key=lambda t: t.bucket)
            saved = {
                "step": state.step,
                "algorithm": state.algorithm,
                "plan": plan.describe(),
                "rank_map": state.loop.rank_map,
                "events": [{"step": e["step"], "kind": e["kind"], "algorithm": e["algorithm"]} for e in state.events],
                "bucket_bytes": [t.nbytes for t in buckets],
                "bucket_algorithms": [t.algorithm for t in buckets],
                "pickle_bytes": len(blob),
                "pickle_globals": sorted(unpickler.names),
            }
            stop_at = step + STEPS_AFTER
    state.close()
    stragglerkit.destroy()
    if saved is None:
        raise RuntimeError(f"no switch to StragglAR in {MAX_STEPS} steps: {algorithms}")
    return saved


def make_ddp_state(out: Path) -> dict[int, Any]:
    """The 4-rank run: the pickled states, the event logs; returns each rank's record."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_ddp_rank, args=(rank, store_path, str(out), results), daemon=True)
            for rank in range(WORLD_SIZE)
        ]
        for p in procs:
            p.start()
        records: dict[int, Any] = {}
        errors = []
        try:
            for _ in range(WORLD_SIZE):
                rank, status, payload = results.get(timeout=600)
                if status == "ok":
                    records[rank] = payload
                else:
                    errors.append(f"rank {rank}:\n{payload}")
        except queue.Empty:
            errors.append("a rank did not answer within 600 s")
        finally:
            for p in procs:
                p.join(timeout=20)
                if p.is_alive():
                    p.kill()
    if errors:
        raise SystemExit("\n".join(errors))
    return records


def _bench(args: list[str], out: Path, checkout: Path) -> None:
    """``stragglerkit bench ARGS`` in ``out`` (the JSON's header records the command as given).
    The training bench left the command line after 0.2.0: where ``profiling/lab/train.py`` exists,
    ``--mode train`` runs as ``python -m profiling.lab.train`` with the other options."""
    command = [sys.executable, "-m", "stragglerkit.cli", "bench", *args]
    if args[:2] == ["--mode", "train"] and (checkout / "profiling" / "lab" / "train.py").is_file():
        command = [sys.executable, "-m", "profiling.lab.train", *args[2:]]
    print("+", " ".join(command[1:]), flush=True)
    path = os.pathsep.join(p for p in (str(checkout), os.environ.get("PYTHONPATH", "")) if p)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=out, env={**os.environ, "PYTHONPATH": path})


def _checkout() -> tuple[str, Path]:
    """The commit of the stragglerkit that is imported; refuses modified package sources."""
    import stragglerkit

    package = Path(stragglerkit.__file__).resolve().parent
    commit = subprocess.run(
        ["git", "-C", str(package), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(package), "status", "--porcelain", "--", "."], check=True, capture_output=True, text=True
    ).stdout.strip()
    if dirty:
        raise SystemExit(f"{package} has modified sources; make the artifacts from a clean checkout:\n{dirty}")
    return commit, package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the folder (default: tests/data/compat/<short commit>)")
    args = parser.parse_args()
    import stragglerkit

    commit, package = _checkout()
    out: Path = (args.out or Path(__file__).resolve().parent / commit[:7]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"stragglerkit {stragglerkit.__version__} from {package} at {commit}", flush=True)

    records = make_ddp_state(out)
    rank0 = records[0]
    assert all(records[r]["plan"] == rank0["plan"] for r in records), records
    assert all(records[r]["step"] == rank0["step"] for r in records), records
    _bench([*BENCH_ALLREDUCE, "--json", "bench_allreduce.json"], out, package.parent)
    (out / "bench_train").mkdir(exist_ok=True)
    _bench([*BENCH_TRAIN, "--event-log", "bench_train", "--json", "bench_train/train.json"], out, package.parent)
    for path in [*out.rglob("*.json"), *out.rglob("*.jsonl")]:  # the bench JSON's absolute --event-log
        path.write_text(path.read_text().replace(f"{out}{os.sep}", ""))

    described = {
        "what": "each rank's pickled stragglerkit.DDPState (pickle protocol 4) of a 4-rank DDP run on gloo over "
        f"loopback, rank {LATE_RANK} {LATE_S * 1e3:.0f} ms late before every backward; saved once StragglAR "
        f"had run {STRAGGLAR_STEPS} steps; the run went on {STEPS_AFTER} steps (events/ holds its event logs)",
        "commit": commit,
        "version": stragglerkit.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "script": "tests/data/compat/make_artifacts.py",
        "command": f"PYTHONPATH=<checkout of {commit[:7]}> python tests/data/compat/make_artifacts.py "
        f"--out tests/data/compat/{commit[:7]}",
        "world_size": WORLD_SIZE,
        "late_rank": LATE_RANK,
        "model": "nn.Sequential(nn.Linear(64, 192), nn.ReLU(), nn.Linear(192, 192), nn.ReLU(), nn.Linear(192, 8))",
        "bucket_cap_mb": BUCKET_CAP_MB,
        "detection": DETECTION,
        "bench_allreduce": ["stragglerkit", "bench", *BENCH_ALLREDUCE, "--json", "bench_allreduce.json"],
        "bench_train": ["stragglerkit", "bench", *BENCH_TRAIN, "--event-log", "bench_train", "--json", "train.json"],
        "ranks": {str(r): records[r] for r in sorted(records)},
    }
    (out / "ddp_state.json").write_text(json.dumps(described, indent=1) + "\n")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()

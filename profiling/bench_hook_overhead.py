"""What the DDP hook costs when nothing is wrong, on the emulated cluster: where the step time goes.

Every rank trains the same MLP as ``stragglerkit bench --mode train`` (256-H-H-16, ``--model-size``
of gradients) in several DDP copies, one step of each per training step, in a rotating order so
that background work and load changes fall on every copy alike:

* ``plain``: DDP without a hook (its C++ all_reduce; the baseline);
* ``python_allreduce_hook``: DDP with the smallest Python comm hook there is -- torch's documented
  pattern ``all_reduce(async_op=True).get_future().then(lambda f: f.value()[0])`` -- the cost of
  running *any* Python comm hook;
* ``hook_quiet``: stragglerkit's hook with no stats exchange and no probes (its per-bucket
  bookkeeping on top of the group's own all_reduce);
* ``hook_exchange_only``: the stats exchange and rank 0's controller, no probes;
* ``hook_exchange_allgather``: the same with the exchange as it was first built, one all-gather
  of every rank's vector (gloo runs it as a ring: ``n(n-1)`` messages) instead of a gather to
  rank 0 and a broadcast of its decision (about ``2(n-1)``);
* ``hook_probes_only``: the ring probes every 8th step, no exchange;
* ``hook_fixed_probes``: the default ControllerConfig but with a probe every 8th step throughout
  (``quiet_probe_every=0``: the default before the probes backed off);
* ``hook_default``: stragglerkit's hook with the default ControllerConfig (exchange every 2 steps,
  rank 0's controller, a ring probe every 8th step until the last 4 probes read healthy links
  (the median of their largest ``l``), then every 64th).

A step's time is the slowest rank's forward + backward (the AllReduce) after a barrier. Reported:
median and mean over the steps after ``--skip``, and each copy's ratio to ``plain``. The probes
are 1 step in 8 (or 64): they move the mean, which is what a run's throughput is, more than the
median.

Example::

    python profiling/bench_hook_overhead.py --world-size 8 --steps 100 --json profiling/results/hook_overhead.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

COPIES = (
    "plain",
    "python_allreduce_hook",
    "hook_quiet",
    "hook_exchange_only",
    "hook_exchange_allgather",
    "hook_probes_only",
    "hook_fixed_probes",
    "hook_default",
)


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import stragglerkit
    from stragglerkit.bench.train_config import TrainConfig
    from stragglerkit.bench.train_worker import build_model
    from stragglerkit.detect.controller import ControllerConfig

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    config = TrainConfig(model_bytes=args.model_bytes)

    def python_allreduce_hook(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        tensor = bucket.buffer().div_(n)
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda f: f.value()[0])

    # DDP checks the hook's annotations as objects (``from __future__ import annotations`` made strings)
    python_allreduce_hook.__annotations__ = {
        "_": object,
        "bucket": dist.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    models: dict[str, DDP] = {name: DDP(build_model(config)) for name in COPIES}
    models["python_allreduce_hook"].register_comm_hook(None, python_allreduce_hook)
    from stragglerkit.detect import exchange as exchange_module

    class AllGatherExchange(exchange_module.StatsExchange):
        """The exchange as first built: every rank's vector to every rank in one all-gather."""

        __slots__ = ()

        def start(self, payload: torch.Tensor, first_step: int) -> exchange_module.PendingExchange:
            rows = [torch.empty(self.size, dtype=torch.float64) for _ in range(self.world_size)]
            work = dist.all_gather(rows, payload, group=self.group, async_op=True)
            assert work is not None
            return exchange_module.PendingExchange([work], rows, first_step)

        def wait(self, pending: exchange_module.PendingExchange) -> Any:
            for work in pending.works:
                work.wait()
            return torch.stack(pending.rows).numpy()

    allgather_state = stragglerkit.DDPState(None, ControllerConfig(probe_every=0))
    allgather_state.exchange.__class__ = AllGatherExchange
    states = {
        "hook_quiet": stragglerkit.DDPState(None, ControllerConfig(exchange_every=10**9, probe_every=0)),
        "hook_exchange_only": stragglerkit.DDPState(None, ControllerConfig(probe_every=0)),
        "hook_exchange_allgather": allgather_state,
        "hook_probes_only": stragglerkit.DDPState(None, ControllerConfig(exchange_every=10**9, quiet_probe_every=0)),
        "hook_fixed_probes": stragglerkit.DDPState(None, ControllerConfig(quiet_probe_every=0)),
        "hook_default": stragglerkit.DDPState(None, ControllerConfig()),
    }
    for name, state in states.items():
        models[name].register_comm_hook(state, stragglerkit.ddp_hook)
    times: dict[str, list[float]] = {name: [] for name in COPIES}
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(config.batch, 256, generator=g), torch.randn(config.batch, 16, generator=g)
        shift = step % len(COPIES)
        for name in COPIES[shift:] + COPIES[:shift]:
            model = models[name]
            dist.barrier()
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            times[name].append(time.perf_counter() - start)
        if rank == 0 and (step + 1) % 20 == 0:
            print(f"hook overhead: step {step + 1}/{args.steps}", file=sys.stderr, flush=True)
    for state in states.values():
        state.close()
    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, times)
    if rank == 0:
        slowest = {name: [max(g[name][i] for g in gathered) for i in range(args.skip, args.steps)] for name in COPIES}
        events = {name: state.events for name, state in states.items()}
        Path(args.out).write_text(json.dumps({"times": slowest, "events": events}), encoding="utf-8")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--bandwidth", type=float, default=125e6, help="bytes/s per emulated NIC (default 1 Gbit/s)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--skip", type=int, default=20, help="steps not measured (warm-up of the hook is 10)")
    parser.add_argument("--model-bytes", type=int, default=8 * 2**20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    if args.skip >= args.steps:
        parser.error(f"--skip ({args.skip}) must be below --steps ({args.steps})")
    from _meta import provenance

    from stragglerkit.testbed import EmulatedCluster

    ok, why = EmulatedCluster.available()
    if not ok:
        raise SystemExit(f"bench_hook_overhead needs the emulated cluster: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        argv = [sys.executable, __file__, "--worker", "--out", out, "--steps", str(args.steps)]
        argv += ["--skip", str(args.skip), "--model-bytes", str(args.model_bytes)]
        config = EmulatedCluster.Config(hosts=args.world_size, bandwidth=args.bandwidth)
        with EmulatedCluster(config) as cluster:
            procs = [cluster.popen(h, argv, env=cluster.torch_env(h, port=29580)) for h in range(args.world_size)]
            codes = [p.wait(timeout=1800) for p in procs]
            if any(codes):
                raise SystemExit(f"ranks exited with {codes}")
        written = json.loads(Path(out).read_text(encoding="utf-8"))
        slowest, events = written["times"], written["events"]
    plain_median = statistics.median(slowest["plain"])
    plain_mean = statistics.mean(slowest["plain"])
    rows = []
    for name, copy_events in events.items():
        for event in copy_events:
            print(f"{name}: step {event['step']}: {event['kind']} {event['evidence'].get('reason', '')}")
    for name in COPIES:
        median, mean = statistics.median(slowest[name]), statistics.mean(slowest[name])
        rows.append(
            {
                "copy": name,
                "median_ms": round(1e3 * median, 2),
                "mean_ms": round(1e3 * mean, 2),
                "plain_over_copy_median": round(plain_median / median, 4),
                "plain_over_copy_mean": round(plain_mean / mean, 4),
            }
        )
        print(
            f"{name:24s} median {1e3 * median:7.1f} ms  mean {1e3 * mean:7.1f} ms  "
            f"plain/this: {plain_median / median:.3f} (median), {plain_mean / mean:.3f} (mean)"
        )
    if args.json:
        record = {
            **provenance(),
            "world_size": args.world_size,
            "bandwidth_Bps": args.bandwidth,
            "model_bytes": args.model_bytes,
            "steps_measured": args.steps - args.skip,
            "rows": rows,
            "events": events,
            "step_times_s": slowest,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

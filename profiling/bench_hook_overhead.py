"""What the DDP hook costs when nothing is wrong, on the emulated cluster: where the step time goes.

Every rank trains the same MLP as ``stragglerkit bench --mode train`` (256-H-H-16, ``--model-size``
of gradients) in several DDP copies, one step of each per training step, in a rotating order so
that background work and load changes fall on every copy alike:

* ``plain``: DDP without a hook (its C++ all_reduce; the baseline);
* ``builtin_allreduce_hook``: DDP with torch's own C++ comm hook ``BuiltinCommHookType.ALLREDUCE``
  (divide the bucket by the world size, then all_reduce): no Python at all;
* ``python_allreduce_hook``: DDP with the smallest Python comm hook there is -- torch's documented
  pattern ``all_reduce(async_op=True).get_future().then(lambda f: f.value()[0])`` after dividing
  the bucket -- the cost of running *any* Python comm hook that averages;
* ``python_hook_no_division``: the same hook without the division (it sums instead of averaging,
  so it is a timing reference only; the bench never steps an optimizer). Without a hook DDP
  divides while it copies each gradient into its bucket (one pass over the gradients); with a
  hook it copies, and the hook must divide the bucket in a pass of its own. This copy isolates
  that pass from the cost of calling Python;
* ``hook_quiet``: stragglerkit's hook with no stats exchange and no probes (its per-bucket
  bookkeeping on top of the group's own all_reduce);
* ``hook_exchange_only``: the stats exchange and rank 0's controller, no probes;
* ``hook_exchange_every_6``: the same with an exchange every 6th step instead of every 2nd;
* ``hook_exchange_allgather``: the same with the exchange as it was first built, one all-gather
  of every rank's vector (gloo runs it as a ring: ``n(n-1)`` messages) instead of a gather to
  rank 0 and a broadcast of its decision (about ``2(n-1)``);
* ``hook_probes_only``: the ring probes every 8th step, no exchange;
* ``hook_fixed_probes``: the default configuration but with a probe every 8th step throughout
  (the internal ``quiet_probe_every=0``: the default before the probes backed off);
* ``hook_default``: stragglerkit's hook with the default configuration (exchange every 2 steps,
  rank 0's controller, a ring probe every 8th step until the last 4 probes read healthy links
  (the median of their largest ``l``), then every 64th).

A step's time is the slowest rank's forward + backward (the AllReduce) after a barrier. Reported:
median and mean over the steps after ``--skip``, and each copy's ratio to ``plain``. The probes
are 1 step in 8 (or 64): they move the mean, which is what a run's throughput is, more than the
median.

``--copies`` picks some of them (``plain`` always); ``--runs N`` launches the cluster N times and
reports each copy's median ratio over the runs (run-to-run spread on this machine is a few %).

Overwrites ``profiling/results/bench_hook_overhead.json`` (``--json``) with the ratios and each
run's rows and events. Needs root (the emulated cluster). The command below takes about
25 minutes on a 2-core machine (3 launches of 8 ranks, 6 copies, 200 steps).

Example::

    python profiling/bench_hook_overhead.py --world-size 8 --steps 200 --runs 3 --gradient-as-bucket-view \\
        --copies plain,builtin_allreduce_hook,python_allreduce_hook,hook_quiet,hook_exchange_only,hook_default
"""

from __future__ import annotations

import argparse
import dataclasses
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
    "builtin_allreduce_hook",
    "python_allreduce_hook",
    "python_hook_no_division",
    "hook_quiet",
    "hook_exchange_only",
    "hook_exchange_every_6",
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
    from profiling.lab.copies import build_model
    from profiling.lab.train_config import TrainConfig
    from stragglerkit.detect.settings import tuned

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    stragglerkit.init()  # collective: every rank, once
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

    def python_hook_no_division(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    python_hook_no_division.__annotations__ = python_allreduce_hook.__annotations__
    copies = tuple(args.copies.split(","))
    models: dict[str, DDP] = {
        name: DDP(build_model(config), gradient_as_bucket_view=args.gradient_as_bucket_view) for name in copies
    }
    if "builtin_allreduce_hook" in models:
        models["builtin_allreduce_hook"]._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    if "python_allreduce_hook" in models:
        models["python_allreduce_hook"].register_comm_hook(None, python_allreduce_hook)
    if "python_hook_no_division" in models:
        models["python_hook_no_division"].register_comm_hook(None, python_hook_no_division)
    from stragglerkit.detect import exchange as exchange_module

    class AllGatherExchange(exchange_module.StatsExchange):
        """The exchange as first built: every rank's vector to every rank in one all-gather."""

        __slots__ = ()

        def start(self, payload: torch.Tensor, first_step: int) -> exchange_module.PendingExchange:
            rows = [torch.empty_like(payload) for _ in range(self.world_size)]
            work = dist.all_gather(rows, payload, group=self.group, async_op=True)
            assert work is not None
            return exchange_module.PendingExchange([work], rows, first_step)

        def wait(self, pending: exchange_module.PendingExchange) -> Any:
            for work in pending.works:
                work.wait()
            return torch.stack(pending.rows).numpy()

    # each copy's loop: the default detection fields (not the session's) with some changed, and
    # the probes' quiet interval, an internal setting, where a copy changes it
    session_config = stragglerkit.Config.from_env()  # what init() resolved: its executor and report

    def hook_state(quiet_probe_every: int | None = None, **detection: int) -> stragglerkit.DDPState:
        config = session_config.replace(detection={**dataclasses.asdict(stragglerkit.Config().detection), **detection})
        with tuned(**({} if quiet_probe_every is None else {"quiet_probe_every": quiet_probe_every})):
            return stragglerkit.DDPState(None, config)

    def allgather_state() -> stragglerkit.DDPState:
        state = hook_state(probe_every=0)
        state.loop.exchange.stats.__class__ = AllGatherExchange  # the loop's StatsExchange
        return state

    configs = {
        "hook_quiet": lambda: hook_state(exchange_every=10**9, quiet_exchange_every=0, probe_every=0),
        "hook_exchange_only": lambda: hook_state(probe_every=0),
        "hook_exchange_every_6": lambda: hook_state(exchange_every=6, probe_every=0),
        "hook_exchange_allgather": allgather_state,
        "hook_probes_only": lambda: hook_state(quiet_probe_every=0, exchange_every=10**9, quiet_exchange_every=0),
        "hook_fixed_probes": lambda: hook_state(quiet_probe_every=0),
        "hook_default": lambda: hook_state(),
    }
    states = {name: make() for name, make in configs.items() if name in copies}
    for name, state in states.items():
        models[name].register_comm_hook(state, stragglerkit.ddp_hook)
    times: dict[str, list[float]] = {name: [] for name in copies}
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(config.batch, 256, generator=g), torch.randn(config.batch, 16, generator=g)
        shift = step % len(copies)
        for name in copies[shift:] + copies[:shift]:
            model = models[name]
            dist.barrier()
            start = time.perf_counter()
            # with gradient_as_bucket_view the gradients stay views of the buckets only when zeroed in place
            model.zero_grad(set_to_none=not args.gradient_as_bucket_view)
            nn.functional.mse_loss(model(x), y).backward()
            times[name].append(time.perf_counter() - start)
        if rank == 0 and (step + 1) % 20 == 0:
            print(f"hook overhead: step {step + 1}/{args.steps}", file=sys.stderr, flush=True)
    for state in states.values():
        state.close()
    gathered: list[Any] = [None] * n
    dist.all_gather_object(gathered, times)
    if rank == 0:
        slowest = {name: [max(g[name][i] for g in gathered) for i in range(args.skip, args.steps)] for name in copies}
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
    parser.add_argument("--copies", default=",".join(COPIES), help="comma-separated copies to train (default: all)")
    parser.add_argument("--runs", type=int, default=1, help="launch the cluster this many times; report the median")
    parser.add_argument(
        "--gradient-as-bucket-view",
        action="store_true",
        help="every copy's DDP with gradient_as_bucket_view=True, gradients zeroed in place (set_to_none=False)",
    )
    parser.add_argument("--json", type=Path, help="summary file (default profiling/results/bench_hook_overhead.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    if args.skip >= args.steps:
        parser.error(f"--skip ({args.skip}) must be below --steps ({args.steps})")
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    from _env import RESULTS, write_summary

    from stragglerkit.testbed import EmulatedCluster

    ok, why = EmulatedCluster.available()
    if not ok:
        raise SystemExit(f"bench_hook_overhead needs the emulated cluster: {why}")
    copies = [name.strip() for name in args.copies.split(",") if name.strip()]
    unknown = sorted(set(copies) - set(COPIES))
    if unknown or "plain" not in copies:
        parser.error(f"--copies: unknown {unknown} or no 'plain' (the baseline); choose from {', '.join(COPIES)}")
    runs = []
    for run in range(args.runs):
        slowest, events = _run_once(args, ",".join(copies))
        for name, copy_events in events.items():
            for event in copy_events:
                reason = event["evidence"].get("reason", "")
                print(f"run {run + 1}: {name}: step {event['step']}: {event['kind']} {reason}")
        rows = _rows(slowest, copies)
        for row in rows:
            print(
                f"run {run + 1}/{args.runs}: {row['copy']:24s} median {row['median_ms']:7.1f} ms  "
                f"mean {row['mean_ms']:7.1f} ms  plain/this: {row['plain_over_copy_median']:.3f} (median), "
                f"{row['plain_over_copy_mean']:.3f} (mean)"
            )
        runs.append({"rows": rows, "events": events})
    summary = [
        {
            "copy": name,
            "plain_over_copy_median": round(statistics.median(r["rows"][i]["plain_over_copy_median"] for r in runs), 4),
            "plain_over_copy_mean": round(statistics.median(r["rows"][i]["plain_over_copy_mean"] for r in runs), 4),
        }
        for i, name in enumerate(copies)
    ]
    if args.runs > 1:
        print(f"median over {args.runs} runs:")
        for row in summary:
            print(
                f"{row['copy']:24s} plain/this: {row['plain_over_copy_median']:.3f} (median step), "
                f"{row['plain_over_copy_mean']:.3f} (mean step)"
            )
    record = {
        "world_size": args.world_size,
        "bandwidth_Bps": args.bandwidth,
        "model_bytes": args.model_bytes,
        "gradient_as_bucket_view": args.gradient_as_bucket_view,
        "steps_measured": args.steps - args.skip,
        "runs": args.runs,
        "rows": summary if args.runs > 1 else runs[0]["rows"],
        "per_run": runs,
    }
    write_summary(args.json or RESULTS / "bench_hook_overhead.json", "hook_overhead", record)


def _run_once(args: argparse.Namespace, copies: str) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """One launch of the emulated cluster: every rank trains the copies; the slowest rank's step times."""
    from stragglerkit.testbed import EmulatedCluster

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        argv = [sys.executable, __file__, "--worker", "--out", out, "--steps", str(args.steps)]
        argv += ["--skip", str(args.skip), "--model-bytes", str(args.model_bytes), "--copies", copies]
        if args.gradient_as_bucket_view:
            argv.append("--gradient-as-bucket-view")
        config = EmulatedCluster.Config(hosts=args.world_size, bandwidth=args.bandwidth)
        with EmulatedCluster(config) as cluster:
            procs = [cluster.popen(h, argv, env=cluster.torch_env(h, port=29580)) for h in range(args.world_size)]
            codes = [p.wait(timeout=1800) for p in procs]
            if any(codes):
                raise SystemExit(f"ranks exited with {codes}")
        written = json.loads(Path(out).read_text(encoding="utf-8"))
    return written["times"], written["events"]


def _rows(slowest: dict[str, list[float]], copies: list[str]) -> list[dict[str, Any]]:
    plain_median = statistics.median(slowest["plain"])
    plain_mean = statistics.mean(slowest["plain"])
    rows = []
    for name in copies:
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
    return rows


if __name__ == "__main__":
    main()

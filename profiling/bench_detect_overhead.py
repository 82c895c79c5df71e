"""What the detection loop costs per step: the DDP hook's own work next to the step it rides on.

Spawns ``--world-size`` gloo ranks on 127.0.0.1 training a small MLP with DDP twice per step: plain
DDP, then the same model with ``stragglerkit.ddp_hook`` (default ControllerConfig: ring after the
warm-up; no straggler). It times, per rank and step, the hooked backward, and inside the hook:

* ``begin_step``: the step's first-bucket work -- wait for the previous stats exchange (issued a
  step earlier), rank 0's controller (cost-model fit, detector, plan), pack and issue the next one;
* ``hook``: each hook call up to handing the bucket to the runtime (the rest runs asynchronously);
* ``finish``: the bookkeeping when a bucket's AllReduce completes (span, the ring-link messages);
* per exchange, inside ``begin_step``: ``receive`` (wait, unpack, adopt the decision; rank 0 also
  hands the statistics to the controller's thread) and ``join`` (rank 0 collects the decision
  before issuing the next exchange: the controller's time not hidden behind the step).

Reports medians and 90th percentiles over the steps after warm-up, the sum per step, and the
plain and hooked backward times (the latter include our ring, not gloo's: a different algorithm,
see docs/executor.md for that comparison).

Example::

    python profiling/bench_detect_overhead.py --world-size 4 --steps 200 --json profiling/results/detect_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]


def _timed(table: dict[str, list[float]], name: str, fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            table[name].append(time.perf_counter() - start)

    return wrapper


def _rank_main(rank: int, n: int, store_path: str, args: argparse.Namespace, queue: Any) -> None:
    try:
        _rank_body(rank, n, store_path, args, queue)
    except BaseException:
        queue.put({"rank": rank, "error": traceback.format_exc()})


def _rank_body(rank: int, n: int, store_path: str, args: argparse.Namespace, queue: Any) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, n), rank=rank, world_size=n)
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import stragglerkit
    from stragglerkit.integrations import ddp as ddp_module

    timers: dict[str, list[float]] = {"begin_step": [], "hook": [], "finish": [], "receive": [], "join": []}
    ddp_module.DDPState._begin_step = _timed(timers, "begin_step", ddp_module.DDPState._begin_step)  # type: ignore[method-assign]
    ddp_module.DDPState._finish = _timed(timers, "finish", ddp_module.DDPState._finish)  # type: ignore[method-assign]
    ddp_module.DDPState._receive = _timed(timers, "receive", ddp_module.DDPState._receive)  # type: ignore[method-assign]
    ddp_module.DDPState._decision_to_ship = _timed(timers, "join", ddp_module.DDPState._decision_to_ship)  # type: ignore[method-assign]
    inner = stragglerkit.ddp_hook

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        start = time.perf_counter()
        try:
            return inner(state, bucket)
        finally:
            timers["hook"].append(time.perf_counter() - start)

    hook.__annotations__ = dict(inner.__annotations__)

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Linear(256, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, args.hidden),
            nn.ReLU(),
            nn.Linear(args.hidden, 8),
        )

    plain, hooked = DDP(model()), DDP(model(), bucket_cap_mb=args.bucket_mb)
    state = stragglerkit.DDPState(None)
    hooked.register_comm_hook(state, hook)
    backward: dict[str, list[float]] = {"plain": [], "hooked": []}
    marks: list[tuple[int, int, int]] = []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 256, generator=g), torch.randn(16, 8, generator=g)
        for name, m in (("plain", plain), ("hooked", hooked)):
            loss = nn.functional.mse_loss(m(x), y)
            start = time.perf_counter()
            loss.backward()
            backward[name].append(time.perf_counter() - start)
            m.zero_grad()
        marks.append((len(timers["begin_step"]), len(timers["hook"]), len(timers["finish"])))
    state.close()
    skip = state.config.warmup_steps + 5
    first = marks[skip - 1]
    steps = args.steps - skip
    out = {
        "rank": rank,
        "steps_measured": steps,
        "buckets_per_step": (len(timers["hook"]) - first[1]) / steps,
        "algorithm": state.algorithm,
        "events": len(state.events),
    }
    for name in ("receive", "join"):  # per exchange (every K steps), after warm-up
        values = timers[name][len(timers[name]) * skip // args.steps :]
        out[f"{name}_median_us"] = 1e6 * statistics.median(values)
        out[f"{name}_p90_us"] = 1e6 * statistics.quantiles(values, n=10)[-1]
    for i, name in enumerate(("begin_step", "hook", "finish")):
        values = timers[name][first[i] :]
        out[f"{name}_median_us"] = 1e6 * statistics.median(values)
        out[f"{name}_p90_us"] = 1e6 * statistics.quantiles(values, n=10)[-1]
        out[f"{name}_per_step_us"] = 1e6 * sum(values) / steps
    for name, values in backward.items():
        out[f"backward_{name}_median_ms"] = 1e3 * statistics.median(values[skip:])
    queue.put(out)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--bucket-mb", type=float, default=0.5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _meta import provenance

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_rank_main, args=(r, args.world_size, store, args, queue))
            for r in range(args.world_size)
        ]
        for p in procs:
            p.start()
        ranks = sorted((queue.get(timeout=300) for _ in procs), key=lambda r: r["rank"])
        for p in procs:
            p.join(timeout=60)
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        raise SystemExit("a rank failed:\n" + errors[0])
    result = {**provenance(), "config": vars(args) | {"json": str(args.json)}, "ranks": ranks}
    for r in ranks:
        print(
            f"rank {r['rank']}: begin_step {r['begin_step_median_us']:.0f} us (p90 {r['begin_step_p90_us']:.0f}), "
            f"hook {r['hook_median_us']:.0f} us x {r['buckets_per_step']:.0f}, finish {r['finish_median_us']:.0f} us; "
            f"per step {r['begin_step_per_step_us'] + r['hook_per_step_us'] + r['finish_per_step_us']:.0f} us; "
            f"backward plain {r['backward_plain_median_ms']:.1f} ms, hooked {r['backward_hooked_median_ms']:.1f} ms; "
            f"per exchange: receive {r['receive_median_us']:.0f} us, controller join {r['join_median_us']:.0f} us"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

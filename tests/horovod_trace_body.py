"""One rank of the Horovod trace test, run under ``horovodrun --gloo`` by tests/test_profiler_trace.py:
``python tests/horovod_trace_body.py OUT_DIR STEPS``. Trains a small model with stragglerkit's Horovod
optimizer under torch.profiler (CPU) and writes ``OUT_DIR/rank<r>.json`` (the chrome trace) and,
on rank 0 once every rank is done, ``OUT_DIR/done``."""

from __future__ import annotations

import os
import sys

import horovod.torch as hvd
import torch
from torch import nn


def main() -> None:
    out_dir, steps = sys.argv[1], int(sys.argv[2])
    hvd.init()
    torch.set_num_threads(1)
    import stragglerkit
    import stragglerkit.horovod

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    config = stragglerkit.Config().replace(detection={"warmup_steps": 2, "degraded_threshold": 1e9})
    opt = stragglerkit.horovod.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters(), config=config
    )
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for step in range(steps):
            g = torch.Generator().manual_seed(100 * step + hvd.rank())
            x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    prof.export_chrome_trace(os.path.join(out_dir, f"rank{hvd.rank()}.json"))
    hvd.allreduce(torch.zeros(1), name="done")
    if hvd.rank() == 0:
        open(os.path.join(out_dir, "done"), "w").close()


if __name__ == "__main__":
    main()

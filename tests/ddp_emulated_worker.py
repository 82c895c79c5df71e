"""One rank of the degraded-NIC DDP run on the emulated cluster (started by test_detect_emulated.py).

Usage: python ddp_emulated_worker.py OUT_DIR STEPS   (rank and rendezvous from the environment)
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import stragglerkit


def main() -> None:
    out_dir, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stragglerkit.init()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 8)))  # ~8 MB of gradients
    state = stragglerkit.DDPState(None)
    model.register_comm_hook(state, stragglerkit.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    algorithms = []
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 1024, generator=g), torch.randn(8, 8, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        algorithms.append(state.algorithm)
    state.close()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        record = {
            "events": state.events,
            "algorithms": algorithms,
            "checksum": float(params.double().sum()),
            "detector": state.loop.controller.detector.last_evidence,
            "model": state.loop.controller.model.fit_info,
        }
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

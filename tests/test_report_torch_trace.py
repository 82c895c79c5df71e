"""A real torch.profiler trace into ``stragglerkit report``: 2 gloo ranks on loopback, rank 1 late.

Each rank records ``stragglerkit.all_reduce`` calls under ``torch.profiler.profile`` and exports its
chrome trace; rank 1 sleeps before every call. The report must find the ``stragglerkit/``
ranges that the runtime opens (docs/report.md, "Range names"), align the two traces and see rank
1 arrive last by about its sleep, and draw the figures from them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from _dist import run_group

from stragglerkit.cli import main
from stragglerkit.report.inputs import load
from stragglerkit.report.torch_trace import read_torch_trace

CALLS = 4
LATE_S = 0.15


def _profiled_rank(rank: int, world_size: int, folder: str) -> int:
    from torch.profiler import ProfilerActivity, profile

    import stragglerkit

    stragglerkit.init()
    x = torch.ones(1 << 16)
    stragglerkit.all_reduce(x, algorithm="ring")  # connections made outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.distributed.barrier()  # the ranks start the profiler at different times
        for _ in range(CALLS):
            if rank == 1:
                time.sleep(LATE_S)
            x = torch.full((1 << 16,), float(rank + 1))
            stragglerkit.all_reduce(x, algorithm="ring")
            assert x[0].item() == 3.0
    prof.export_chrome_trace(str(Path(folder) / f"trace.rank{rank}.json"))
    return 0


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("traces")
    run_group(2, _profiled_rank, str(folder), timeout=300.0)
    return folder


def test_a_real_trace_has_the_ranges_and_its_rank(traces: Path) -> None:
    for rank in (0, 1):
        ranks = read_torch_trace(traces / f"trace.rank{rank}.json")
        assert ranks.rank == rank and ranks.world_size == 2, "from the trace's distributedInfo"
        names = {r.name for r in ranks.ranges}
        assert "stragglerkit/all_reduce ring" in names, sorted(names)[:20]
        assert len([r for r in ranks.ranges if r.name == "stragglerkit/all_reduce ring"]) == CALLS


def test_the_report_sees_rank_1_late(traces: Path, tmp_path: Path) -> None:
    loaded = load([str(traces)])
    run = loaded.run
    assert run is not None and run.kind == "torch.profiler" and run.world_size == 2
    assert loaded.problems == []
    assert len(run.steps) == CALLS, "one step per AllReduce without step ranges"
    for record in run.steps:
        assert record.lateness_s is not None and record.lateness_s[0] == 0.0
        assert record.lateness_s[1] == pytest.approx(LATE_S, abs=0.06)
        assert record.allreduce_s is not None and 0 < record.allreduce_s < 5.0  # a loaded machine is slow
        assert record.algorithm == "ring"
    out = tmp_path / "report.html"
    assert main(["report", str(traces), "-o", str(out)]) == 0
    page = out.read_text()
    assert page.count('src="data:image/png;base64,') == 3  # AllReduce time, arrival CDF, last rank
    assert "NIC rate per rank: omitted — no NIC rates in a torch.profiler input." in page

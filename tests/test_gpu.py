"""The GPU path: the CUDA reduction kernel, CUDA tensors through the executor, the DDP hook with CUDA
buckets and stragglerkit on an NCCL group. Needs a CUDA GPU and a build with the kernel;
scripts/gpu_check.sh builds the extension on a GPU machine and runs this file with the bandwidth
measurement (profiling/bench_cuda_reduce.py).

All ranks share the one GPU over a gloo group (NCCL refuses two ranks on one device), so the
executor's messages take its host-staged path (csrc/executor.cpp, "CUDA tensors over gloo"); the
executor's NCCL transport runs only with one GPU per rank, which these checks cannot give.
"""

from __future__ import annotations

import gpu_bodies
import pytest
import torch
from _dist import run_group
from correctness_body import sweep
from test_executor_correctness import check_results


def _why_no_gpu() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU here: run scripts/gpu_check.sh on a GPU machine"
    from stragglerkit.runtime.executor import native

    if not native().cuda_kernel:
        return "stragglerkit was built without its CUDA kernel: scripts/gpu_check.sh builds it on a GPU machine"
    return None


pytestmark = pytest.mark.skipif(_why_no_gpu() is not None, reason=str(_why_no_gpu()))

KERNEL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64)
KERNEL_SIZES = (0, 1, 7, 1000, (1 << 24) + 5)


def _random(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        values = torch.randn(numel, generator=gen, dtype=torch.float32) * 100
    else:
        values = torch.randint(-(1 << 20), 1 << 20, (numel,), generator=gen)
    return values.to(dtype).cuda()


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_cuda_reduction_equals_torch_add_bit_for_bit(dtype: torch.dtype) -> None:
    """dst += src by the kernel has the bits of torch's ``dst + src``, for every size and for spans
    at every offset pair (aligned, equally misaligned, differently misaligned)."""
    from stragglerkit.runtime.executor import native

    for numel in KERNEL_SIZES:
        for dst_offset, src_offset in ((0, 0), (1, 1), (3, 3), (1, 2), (0, 5)):
            dst_full = _random(numel + dst_offset, dtype, seed=numel + 7 * dst_offset)
            src_full = _random(numel + src_offset, dtype, seed=numel + 11 * src_offset + 1)
            dst = dst_full.narrow(0, dst_offset, numel)
            src = src_full.narrow(0, src_offset, numel)
            expected = dst + src
            before = dst_full[:dst_offset].clone()
            native().reduce_add_(dst, src)
            torch.cuda.synchronize()
            assert torch.equal(dst, expected), (dtype, numel, dst_offset, src_offset)
            assert torch.equal(dst_full[:dst_offset], before), "the kernel wrote before its span"


def test_executor_on_cuda_tensors_matches_torch_on_every_rank() -> None:
    """4 ranks on the GPU, every algorithm, sizes 0/1/odd/64 MiB (odd), float32/bfloat16/float16:
    within the dtype's rounding bound of the exact sum and of torch's, identical on every rank, and
    op AVG has the bits of the sum followed by the division."""
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    results = run_group(4, sweep, (0, 1, 7, 1000), dtypes, (), None, None, "cuda", 64 << 20, timeout=240.0)
    check_results(4, results)
    assert len(results[0]["algorithms"]) >= 5, results[0]["algorithms"]


def test_ddp_hook_with_cuda_buckets_trains_like_plain_ddp() -> None:
    """4 ranks, 48 steps, rank 3 late from step 5: the hooked model's parameters equal plain DDP's
    at every step (within float32 rounding of another addition order) and are bit-identical on every
    rank, while stragglerkit's executor reduces CUDA buckets (the probes' ring every 8th step, and
    StragglAR once the loop acts on the late rank). Four ranks, not two: under three ranks the loop
    neither probes nor has a straggler plan, so every bucket would keep the group's own all_reduce."""
    n, steps = 4, 48
    results = run_group(n, gpu_bodies.hook_vs_plain_ddp_on_cuda, steps, 3, 0.03, timeout=300.0)
    for out in results.values():
        assert out["step"] == steps and out["device"] == "cuda:0", out
        assert max(out["diffs"]) <= 1e-5 * max(out["scale"], 1.0), max(out["diffs"])
        assert "ring" in out["ran"], f"stragglerkit's executor never ran a CUDA bucket: {out['ran']}"
    assert all(results[r]["checksums"] == results[0]["checksums"] for r in range(n))
    print(f"algorithms that reduced CUDA buckets: {results[0]['ran']}")


def test_stragglerkit_on_an_nccl_group_of_one_rank() -> None:
    checks = run_group(1, gpu_bodies.nccl_world_of_one, backend="nccl")[0]
    failed = sorted(check for check, ok in checks.items() if not ok)
    assert checks and not failed, failed

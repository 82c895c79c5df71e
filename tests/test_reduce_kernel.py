"""The CPU reduction kernels the executor runs: the sum, and the sum divided by n of an average.

An averaging plan divides inside the reductions that finish a chunk (planner/lowering.py); its result
must have the bits of the sum followed by torch's own division, for every dtype it accepts.
"""

from __future__ import annotations

import pytest
import torch

from stragglerkit.runtime.executor import native

FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", (*FLOATS, torch.int32, torch.int64))
@pytest.mark.parametrize("numel", [0, 1, 7, 1000, 65_537])
def test_sum_matches_torch_add(dtype: torch.dtype, numel: int) -> None:
    gen = torch.Generator().manual_seed(numel)
    a = (torch.randn(numel, generator=gen) * 100).to(dtype)
    b = (torch.randn(numel, generator=gen) * 100).to(dtype)
    expected = a + b
    native().reduce_add_(a, b)
    assert torch.equal(a, expected)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("numel", [0, 1, 7, 1000, 65_537])
@pytest.mark.parametrize("divisor", [2, 3, 7, 8])
def test_sum_then_divide_matches_torch(dtype: torch.dtype, numel: int, divisor: int) -> None:
    gen = torch.Generator().manual_seed(numel + divisor)
    a = torch.randn(numel, generator=gen).to(dtype)
    b = torch.randn(numel, generator=gen).to(dtype)
    expected = (a + b).div_(divisor)
    native().reduce_add_(a, b, divisor)
    assert torch.equal(a, expected)


def test_divide_refuses_integers_and_negative_divisors() -> None:
    a, b = torch.ones(4, dtype=torch.int32), torch.ones(4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="averaging reduction needs a floating dtype"):
        native().reduce_add_(a, b, 2)
    with pytest.raises(RuntimeError, match="negative divisor"):
        native().reduce_add_(torch.ones(4), torch.ones(4), -1)

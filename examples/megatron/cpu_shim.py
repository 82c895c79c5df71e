"""Run megatron-core on a machine without CUDA: for tests, examples and benchmarks only.

megatron-core's data-parallel path itself runs on CPU over gloo, but a few places ask CUDA where
they only need a device: ``DistributedDataParallel`` places its gradient buffers with
``torch.cuda.current_device()`` while it is built, ``GPTModel``'s attention takes its scratch
buffer from the same call at every forward, and the optimizer, the gradient-norm code and the
pipeline schedule create small tensors with ``device="cuda"``. :func:`cuda_calls_on_cpu`
substitutes the CPU for both while it is active; nothing else changes. The integration
(:mod:`stragglerkit.megatron.adapter`) never imports this module: on GPUs nothing is substituted.

What still needs CUDA with the shim active: megatron-core's gradient clipping
(``clip_grad_by_total_norm_fp32`` asserts that gradients are ``torch.cuda.FloatTensor``: run with
``OptimizerConfig(clip_grad=0.0)`` on CPU), the mixed-precision optimizer for fp16/bf16 parameters
(``Float16OptimizerWithFloat16Params`` accepts only ``torch.cuda`` tensors), NCCL, Transformer
Engine and Apex.

Example::

    with cuda_calls_on_cpu():                         # only while DDP is built: enough for DDP itself
        model = DistributedDataParallel(config, ddp_config, module)
    with cuda_calls_on_cpu():                         # around training: GPTModel, the optimizer, the schedule
        train()
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["cuda_calls_on_cpu", "needs_shim"]


def needs_shim() -> bool:
    """True where torch has no usable CUDA device (the shim is then needed; never on GPUs)."""
    return not torch.cuda.is_available()


class _CudaTensorsOnCpu(TorchFunctionMode):
    """Tensors created with ``device="cuda"`` (a CUDA ``torch.device``, or a device index) are
    created on the CPU."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and (isinstance(device, int) or torch.device(device).type == "cuda"):
            kwargs = dict(kwargs, device="cpu")
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_calls_on_cpu() -> Iterator[None]:
    """While active: ``torch.cuda.current_device()`` returns the CPU device and tensors created
    with ``device="cuda"`` are created on the CPU. Does nothing where CUDA is available, so code
    that uses it runs unchanged on GPUs. Not thread-safe (it swaps a module attribute).

    Example::

        with cuda_calls_on_cpu():
            model = DistributedDataParallel(config, ddp_config, module)
    """
    if not needs_shim():
        yield
        return
    original = torch.cuda.current_device
    torch.cuda.current_device = _cpu_device  # type: ignore[assignment]
    try:
        with _CudaTensorsOnCpu():
            yield
    finally:
        torch.cuda.current_device = original


def _cpu_device() -> torch.device:
    return torch.device("cpu")

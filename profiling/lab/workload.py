"""A training workload other than the bench's MLP: what a fine-tuning example plugs into the bench.

The training bench (:mod:`profiling.lab.train_worker`) trains two copies of a model side by
side, plain framework against stragglerkit, in alternating blocks of steps, with the faults
injected and the links reshaped by the launcher. By default the model is its MLP on random data.
A :class:`Workload` replaces the model, the batches, the loss, the optimizer and adds a held-out
evaluation; everything else (launching the ranks on the emulated cluster, loopback or under
torchrun, the blocks, the reshaping, the event logs, the JSON) stays the bench's.

A workload is named in :class:`~profiling.lab.train_config.TrainConfig` as text, so that it
travels to the ranks with the rest of the configuration: ``"path/to/file.py:factory"`` or
``"package.module:factory"``, where ``factory(options)`` returns the :class:`Workload` and
``options`` is ``TrainConfig.workload_options`` (plain JSON values). Every rank calls the factory.

**The straggler as a slow GPU** (:class:`ComputeSlowdown`, ``TrainConfig.slowdown="backward"``).
The bench's MLP straggler sleeps its whole delay between forward and backward, so that it reaches
the AllReduce late. A throttled GPU is slower everywhere instead: each kernel of the backward takes
longer, so DDP's buckets become ready one after the other, each later than on the other ranks, the
last one by the whole delay. The model of that here: the delay D of a step is spread over the
backward passes of the model's weight matrices in proportion to their size (a matrix multiply's
FLOPs are its weight's size times the tokens, the same tokens for every layer), by a hook on each
weight that runs when its gradient has been computed, before DDP or Horovod see it. The hook
sleeps until D times the share of the weights done so far has been slept in this backward (the
sleeps do not add up rounding errors; ``time.sleep``, so the slow rank does not take CPU from the
others as a spin would). Embedding tables (their backward is a scatter, not a matrix multiply),
biases and norms get none of it. The first bucket is therefore late by the share of the layers
in it, the last by D: an arrival the detector has to find from the buckets' hand-over times, as
on a real slow GPU.

Example::

    from profiling.lab.workload import load_workload
    workload = load_workload("examples/bert/finetune.py:workload", {"max_length": 64})
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["ComputeSlowdown", "MegatronWorkload", "Workload", "load_workload", "spec_of"]


@runtime_checkable
class Workload(Protocol):
    """What the bench's worker asks of a training workload (every rank has one, built alike).

    Example::

        class Tiny:
            def describe(self) -> str: return "linear 4 -> 2"
            def build_model(self) -> nn.Module: torch.manual_seed(0); return nn.Linear(4, 2)
            def optimizer(self, parameters): return torch.optim.SGD(parameters, lr=0.1)
            def batch(self, step, rank, world_size): return torch.randn(8, 4), torch.randn(8, 2)
            def loss(self, model, batch): return nn.functional.mse_loss(model(batch[0]), batch[1])
            def evaluate(self, model, rank, world_size): return {"count": 0.0}
            def metrics(self, sums): return {}
    """

    def describe(self) -> str:
        """The model in a few words (the summary's ``model.layers``)."""
        ...

    def build_model(self) -> nn.Module:
        """A new copy of the model, with the same initial parameters at every call and on every rank."""
        ...

    def optimizer(self, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The optimizer of one copy (Horovod wraps it, DDP uses it as it is)."""
        ...

    def batch(self, step: int, rank: int, world_size: int) -> Any:
        """``rank``'s batch at ``step``: the same for both copies, on the CPU (the worker moves
        tensors and dicts of tensors to its device). Deterministic in (step, rank)."""
        ...

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The scalar training loss of ``model`` (the DDP or plain module) on ``batch``."""
        ...

    def evaluate(self, model: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        """Sums over this rank's share of the held-out split (e.g. ``correct``, ``count``,
        ``loss_sum``), with the model in eval mode; the worker adds them up over the ranks."""
        ...

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """The evaluation's figures (accuracy, perplexity, ...) from the sums over every rank."""
        ...


@runtime_checkable
class MegatronWorkload(Workload, Protocol):
    """A workload that also trains under megatron-core (``--framework megatron``): the same model
    as megatron-core's ``GPTModel`` with the same parameters, the same batches as token windows
    and the same loss (the mean next-token cross-entropy over every predicted token).

    The bench wraps the module in megatron-core's ``DistributedDataParallel`` and trains it with
    megatron-core's schedule and optimizer (:mod:`profiling.lab.train_megatron`); everything
    megatron-core is called inside :func:`examples.megatron.cpu_shim.cuda_calls_on_cpu`.
    """

    def megatron_model(self) -> tuple[Any, nn.Module]:
        """A new copy as (``TransformerConfig``, ``GPTModel``): the same parameters as
        :meth:`build_model`'s, at every call and on every rank. megatron-core's parallel state
        (tensor and pipeline size 1) is initialised before the call."""
        ...

    def megatron_batch(self, step: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
        """:meth:`batch` as ``GPTModel`` takes it: ``tokens``, ``labels`` (the next tokens) and
        ``position_ids``, each ``[batch, sequence]``."""
        ...

    def megatron_optimizer(self) -> dict[str, Any]:
        """The fields of megatron-core's ``OptimizerConfig`` that give :meth:`optimizer`'s update."""
        ...

    def megatron_evaluate(self, module: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        """:meth:`evaluate` with the ``GPTModel`` (eval mode, no gradients)."""
        ...


def spec_of(path: str | Path, factory: str = "workload") -> str:
    """The workload name of ``factory`` in the Python file ``path``, absolute (ranks may start elsewhere).

    Example::

        spec_of("examples/bert/finetune.py")    # "/.../examples/bert/finetune.py:workload"
    """
    return f"{Path(path).resolve()}:{factory}"


def load_workload(spec: str, options: dict[str, Any]) -> Workload:
    """Import the factory that ``spec`` names (``FILE.py:NAME`` or ``module:NAME``) and call it
    with ``options``; ``ValueError`` saying what is wrong with the name."""
    source, _, name = spec.rpartition(":")
    if not source or not name:
        raise ValueError(f"a workload is named FILE.py:FACTORY or module:FACTORY, got {spec!r}")
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"workload {spec!r}: no file {path}")
        module_name = f"stragglerkit_workload_{path.stem}"
        module = sys.modules.get(module_name)
        if module is None or getattr(module, "__file__", None) != str(path):
            loader = importlib.util.spec_from_file_location(module_name, path)
            assert loader is not None and loader.loader is not None
            module = importlib.util.module_from_spec(loader)
            sys.modules[module_name] = module
            loader.loader.exec_module(module)
    else:
        module = importlib.import_module(source)
    factory = getattr(module, name, None)
    if factory is None:
        raise ValueError(f"workload {spec!r}: {source} has no {name}")
    workload = factory(dict(options))
    if not isinstance(workload, Workload):
        raise ValueError(f"workload {spec!r}: {name}() returned a {type(workload).__name__}, not a Workload")
    return workload


class ComputeSlowdown:
    """Spreads a delay over the backward of ``model``'s weight matrices (see the module docstring).

    Set :attr:`delay` before each backward (0: no slowdown); :meth:`reset` starts a new backward.

    Example::

        slow = ComputeSlowdown(model)
        slow.reset(0.2)          # this backward takes 200 ms longer, spread over the layers
        loss.backward()
    """

    def __init__(self, model: nn.Module) -> None:
        embeddings = {id(p) for m in model.modules() if _is_embedding(m) for p in m.parameters()}
        weights = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2 and id(p) not in embeddings]
        if not weights:
            raise ValueError("the model has no weight matrices to slow down (only embeddings, biases, norms)")
        total = float(sum(p.numel() for p in weights))
        self.shares = [p.numel() / total for p in weights]
        """Each weight's share of the delay, in the order of ``model.parameters()``."""
        self.delay = 0.0
        self._done = 0.0
        self._slept = 0.0
        self._handles = [p.register_hook(self._hook_for(share)) for p, share in zip(weights, self.shares, strict=True)]

    def reset(self, delay: float) -> None:
        """A new backward, ``delay`` seconds longer than the model's own."""
        self.delay = max(0.0, delay)
        self._done = 0.0
        self._slept = 0.0

    @property
    def slept(self) -> float:
        """Seconds slept in the current backward so far."""
        return self._slept

    def _hook_for(self, share: float) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if self.delay <= 0:
                return
            self._done += share
            owed = self.delay * min(self._done, 1.0) - self._slept
            if owed > 0:
                start = time.perf_counter()
                time.sleep(owed)
                self._slept += time.perf_counter() - start

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _is_embedding(module: nn.Module) -> bool:
    """torch's ``nn.Embedding``, or another framework's table (megatron-core's
    ``VocabParallelEmbedding`` and ``LanguageModelEmbedding``), by its class name."""
    return isinstance(module, nn.Embedding) or type(module).__name__.endswith("Embedding")

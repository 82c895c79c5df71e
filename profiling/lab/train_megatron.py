"""``python -m profiling.lab.train --framework megatron``: a small GPT on megatron-core, side by side.

Every rank builds two copies of the same GPT with megatron-core (``GPTModel`` with the local layer
spec, tensor- and pipeline-parallel size 1: data-parallel only), each wrapped in megatron-core's
``DistributedDataParallel`` with ``overlap_grad_reduce`` and trained with megatron-core's schedule
(``get_forward_backward_func``, one micro-batch per step, ``finalize_model_grads``) and optimizer
(``get_megatron_optimizer``). The *plain* copy runs megatron-core unchanged; the *hooked* copy
has ``stragglerkit.megatron.install(model, MegatronConfig(straggler_aware_allreduce=True, ...))``,
the one switch a megatron-core user turns on. Both start from the same parameters (the same seed,
then ``broadcast_params`` from data-parallel rank 0) and train on the same batches.

The choices, and why:

* **Size.** Two layers, vocabulary 512 (the byte-level tokenizer's ids fit), 32 positions, head
  size 16; the hidden size H, a multiple of 16, is chosen so that the float32 gradient is about
  ``model_bytes`` (:func:`gpt_hidden_size`; within 2.5 % from 2 MiB up; 32 MiB: H = 576, 36
  heads, 8.6M parameters). Few wide layers keep the number of kernels per step, and with it the
  Python overhead on a CPU, small for a given gradient size.
* **Batch.** One sequence of 32 tokens per rank and step (``TrainConfig.batch`` defaults to 1
  here). On one core of a 2-core x86_64 machine, one thread, the 32 MiB GPT takes about 55 ms a
  step (forward 20, backward 25, optimizer 10); 16 tokens take barely less (the weights are read
  once per pass whatever the batch: the floor is about 45 ms), 64 tokens about 95 ms. With 8 ranks
  sharing 2 cores that is about 220 ms of compute per step against about 470 ms for a ring
  AllReduce of 32 MiB at 1 Gbit/s, so the step is paced by the network, as in the DDP bench (whose
  MLP takes 25 ms a step with 16 rows).
* **Buckets.** ``bucket_size`` of 25 MiB of float32 gradients, torch DDP's default bucket cap, so a
  gradient of a given size is cut as the DDP bench cuts it (32 MiB: 26.5 and 6.3 MiB): the first
  bucket (the output layer, the second layer and part of the first) is reduced while the backward
  of the rest of the first layer and of the embeddings still runs. (Megatron-LM's own default, at
  least 40M parameters a bucket, would make one bucket of these models.)
* **Optimizer.** megatron-core's, with ``optimizer="sgd"``, no momentum, no weight decay, no
  gradient clipping (``clip_grad`` asserts CUDA tensors; it stays off on GPUs too so that both
  settings train the same way). SGD keeps the parameter comparison meaningful: a parameter's
  difference between the copies is the learning rate times the sum of its gradients' differences
  (float32 summation order), while Adam divides by the gradients' running magnitude and can
  magnify a rounding difference in a gradient near zero by up to ``lr / eps``.
* **Lateness.** Between forward and backward, as in the DDP bench: megatron-core's schedule calls
  the loss function right after the forward pass and before the backward, so the injected
  lateness is slept there (after the loss is computed), and the backward is timed from then to
  the schedule's return, that is to the end of ``finish_grad_sync`` (``finalize_model_grads``).
* **Data.** The Python language reference that CPython ships (``pydoc_data.topics``, 466k
  tokens), tokenised by megatron-core's ``ByteLevelTokenizer``: nothing is downloaded. Each rank
  and step reads windows at offsets drawn from a generator seeded by (seed, step, rank), as the
  MLP's batches are.
* **No dropout**, so both copies compute the same forward pass from the same parameters and
  differ only by the AllReduce.

**A fine-tuning workload** (:class:`~profiling.lab.workload.MegatronWorkload`, e.g.
``examples/llama`` with ``--framework megatron``) replaces the GPT, its batches and its optimizer
settings with its own; the DDP wrapping, the buckets, the schedule, the loss (the mean of the
``GPTModel``'s per-token losses) and the install are the same.

On a machine without CUDA, megatron-core's few CUDA-only calls go to the CPU
(:func:`examples.megatron.cpu_shim.cuda_calls_on_cpu`, active around model building and each
call into the model, the schedule and the optimizer); where CUDA is available the shim does
nothing. ``parallel_state.initialize_model_parallel(1, 1)`` runs once per process.

Example::

    from profiling.lab.train_megatron import gpt_hidden_size, gpt_parameters
    gpt_parameters(gpt_hidden_size(32 * 2**20))    # 8587008
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from typing import Any

import torch

from examples.megatron.cpu_shim import cuda_calls_on_cpu
from profiling.lab.copies import Run, batch_generator
from profiling.lab.train_config import TrainConfig
from profiling.lab.workload import MegatronWorkload
from stragglerkit.config import Config
from stragglerkit.megatron import MegatronConfig, MegatronState, install
from stragglerkit.testbed.inject import sleep_precisely

__all__ = [
    "BUCKET_PARAMETERS",
    "HEAD_SIZE",
    "LAYERS",
    "SEQ_LENGTH",
    "VOCAB",
    "MegatronRun",
    "describe",
    "gpt_batch",
    "gpt_hidden_size",
    "gpt_parameters",
    "megatron_runs",
    "text_tokens",
]

LAYERS = 2
"""Transformer layers of the GPT."""
VOCAB = 512
"""Vocabulary size (the byte-level tokenizer's ids are below 256; 512 as in examples/megatron)."""
SEQ_LENGTH = 32
"""Tokens per sequence (and learned positions)."""
HEAD_SIZE = 16
"""Channels per attention head: the hidden size is a multiple of it."""
BUCKET_PARAMETERS = 25 * 2**20 // 4
"""megatron-core's ``bucket_size`` (parameters): 25 MiB of float32 gradients, torch DDP's bucket cap."""
_QUIET = ".*(Transformer Engine|Apex|full scope is deprecated).*"
"""megatron-core's notes on a machine without Transformer Engine and Apex."""


def gpt_parameters(hidden: int) -> int:
    """Parameters of the GPT with hidden size ``hidden``: per layer 12 H^2 + 13 H (QKV, projection
    and the two MLP matrices with biases, two layer norms), the final layer norm, the word and
    position embeddings and the (untied) output layer.

    Example::

        gpt_parameters(576)    # 8587008
    """
    per_layer = 12 * hidden * hidden + 13 * hidden
    return LAYERS * per_layer + 2 * hidden + (2 * VOCAB + SEQ_LENGTH) * hidden


def gpt_hidden_size(model_bytes: int) -> int:
    """The hidden size (a multiple of :data:`HEAD_SIZE`) whose float32 gradient is about ``model_bytes``.

    Example::

        gpt_hidden_size(32 * 2**20)    # 576: 8.6M parameters, 32.8 MiB
    """
    a = 12 * LAYERS
    b = 13 * LAYERS + 2 + 2 * VOCAB + SEQ_LENGTH
    hidden = (-b + math.sqrt(b * b + 4 * a * model_bytes / 4)) / (2 * a)
    return max(HEAD_SIZE, round(hidden / HEAD_SIZE) * HEAD_SIZE)


def describe(hidden: int) -> str:
    """The model, in a few words (the summary's ``model.layers``)."""
    return (
        f"GPT {LAYERS} layers x {hidden} ({hidden // HEAD_SIZE} heads), vocab {VOCAB}, {SEQ_LENGTH} tokens "
        "(megatron-core)"
    )


@functools.cache
def text_tokens() -> torch.Tensor:
    """The Python language reference that CPython ships, as megatron-core's byte-level tokens."""
    from pydoc_data.topics import topics

    from megatron.core.tokenizers.text.libraries.bytelevel_tokenizer import ByteLevelTokenizer

    text = "\n\n".join(topics[name] for name in sorted(topics))
    return torch.tensor(ByteLevelTokenizer().text_to_ids(text), dtype=torch.long)


def gpt_batch(config: TrainConfig, step: int, rank: int, device: torch.device) -> dict[str, torch.Tensor]:
    """``config.batch`` windows of the text for ``rank`` at ``step``: tokens, next tokens, positions."""
    tokens = text_tokens()
    starts = torch.randint(
        0, len(tokens) - SEQ_LENGTH - 1, (config.batch,), generator=batch_generator(config, step, rank)
    )
    window = torch.stack([tokens[s : s + SEQ_LENGTH + 1] for s in starts.tolist()])
    positions = torch.arange(SEQ_LENGTH).unsqueeze(0).expand(config.batch, -1)
    return {
        "tokens": window[:, :-1].to(device),
        "labels": window[:, 1:].to(device),
        "position_ids": positions.to(device),
    }


class MegatronRun(Run):
    """One GPT copy: megatron-core's DDP model, schedule and optimizer (see the module docstring)."""

    def __init__(self, name: str, model: Any, opt: Any) -> None:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        super().__init__(name, model, opt, "megatron", views=True)
        self.schedule = get_forward_backward_func()

    def zero_grad(self) -> None:
        with cuda_calls_on_cpu():
            self.model.zero_grad_buffer()  # type: ignore[operator]
            self.opt.zero_grad()

    def forward_backward(self, batch: Any, late: float) -> tuple[torch.Tensor, float]:
        """megatron-core's schedule, one micro-batch; the lateness is slept in the loss function,
        between the forward pass and the backward. Returns when ``finish_grad_sync`` has."""
        arrived = [0.0]

        def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            loss = output.float().mean()
            if late > 0:
                sleep_precisely(late)
            arrived[0] = time.perf_counter()
            return loss, {"lm loss": loss.detach()}

        def forward_step(data: Any, model: Any) -> tuple[torch.Tensor, Any]:
            sample = next(data)
            return model(sample["tokens"], sample["position_ids"], None, labels=sample["labels"]), loss_func

        with cuda_calls_on_cpu():
            reported = self.schedule(
                forward_step_func=forward_step,
                data_iterator=iter([batch]),
                model=[self.model],
                num_microbatches=1,
                seq_length=int(batch["tokens"].shape[1]),
                micro_batch_size=int(batch["tokens"].shape[0]),
                forward_only=False,
            )
        return reported[0]["lm loss"], arrived[0]

    def step(self) -> None:
        with cuda_calls_on_cpu():
            self.opt.step()


def _initialize(seed: int, device: torch.device) -> None:
    """Tensor- and pipeline-parallel size 1, once per process; the RNG tracker megatron-core's
    layers fork (on a CPU one that keeps no CUDA generator state)."""
    from megatron.core import parallel_state, tensor_parallel

    if parallel_state.model_parallel_is_initialized():
        return
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    if device.type == "cuda":
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)


def megatron_runs(
    config: TrainConfig, device: torch.device, hook_config: Config, workload: MegatronWorkload | None = None
) -> tuple[list[MegatronRun], MegatronState]:
    """The copies of ``config.copies`` on this rank (the bench's GPT, or ``workload``'s model; the
    control is a second plain copy), and the hooked copy's ``MegatronState``. Collective: every
    rank calls it at the same point."""
    warnings.filterwarnings("ignore", message=_QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # megatron-core's import-time notes
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer import TransformerConfig

    _initialize(config.seed, device)
    hidden = gpt_hidden_size(config.model_bytes)
    runs: list[MegatronRun] = []
    state: MegatronState | None = None
    for name in config.copies:
        with cuda_calls_on_cpu():
            if workload is not None:
                transformer, module = workload.megatron_model()
                module = module.to(device)
            else:
                transformer = TransformerConfig(
                    num_layers=LAYERS,
                    hidden_size=hidden,
                    num_attention_heads=hidden // HEAD_SIZE,
                    hidden_dropout=0.0,
                    attention_dropout=0.0,
                    use_cpu_initialization=True,  # the same initial parameters on CPUs and GPUs
                    pipeline_dtype=torch.float32,
                )
                torch.manual_seed(config.seed)
                module = GPTModel(
                    config=transformer,
                    transformer_layer_spec=get_gpt_layer_local_spec(),
                    vocab_size=VOCAB,
                    max_sequence_length=SEQ_LENGTH,
                ).to(device)
            ddp_config = DistributedDataParallelConfig(overlap_grad_reduce=True, bucket_size=BUCKET_PARAMETERS)
            model = DistributedDataParallel(transformer, ddp_config, module)
            model.broadcast_params()
            transformer.finalize_model_grads_func = finalize_model_grads
            transformer.no_sync_func = model.no_sync
            if name == "hooked":
                settings = MegatronConfig(straggler_aware_allreduce=True, config=hook_config)
                state = install(model, settings)
            if workload is not None:
                optimizer_config = OptimizerConfig(**{"clip_grad": 0.0, **workload.megatron_optimizer()})
            else:
                optimizer_config = OptimizerConfig(
                    optimizer="sgd", lr=config.lr, sgd_momentum=0.0, weight_decay=0.0, clip_grad=0.0
                )
            optimizer = get_megatron_optimizer(optimizer_config, [model])
        runs.append(MegatronRun(name, model, optimizer))
    if state is None or state.loop is None:
        raise RuntimeError("stragglerkit.megatron.install routed no bucket group of the hooked GPT copy")
    return runs, state

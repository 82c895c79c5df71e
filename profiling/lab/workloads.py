"""The examples as the training bench's workloads: the same model, data and loss, side by side.

``examples/bert/train.py`` and ``examples/llama/train.py`` are the scripts users run; this module
imports them (``examples.bert.train``, ``examples.llama.train``: the repository root is on the
path, :mod:`profiling`) and puts their :func:`build_model`, :func:`build_data`,
:func:`make_batches` and :func:`compute_loss` behind the :class:`~profiling.lab.workload.Workload`
protocol, so that :mod:`.finetune` trains copies of exactly that workload on the same ranks. The
bench's step is the example's own ``train_step`` (zero the gradients, the example's loss, backward,
the optimizer's step); a slowed straggler's delay is spread over that backward by hooks on its
weights (:class:`~profiling.lab.workload.ComputeSlowdown`). What the examples do not have is here:
the held-out sums added up over the ranks, and the Llama as megatron-core's ``GPTModel``
(``--framework megatron``) with the transformers weights converted.

Each example has an entry in :data:`EXAMPLES`: its options (:func:`bert_arguments`,
:func:`llama_arguments`), their values as the workload's options, and the factory the ranks call.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch import nn

__all__ = ["EXAMPLES", "BertTopics", "Example", "LlamaFortunes", "bert", "llama", "megatron_llama"]


def example(name: str) -> ModuleType:
    """``examples/<name>/train.py``, imported as ``examples.<name>.train``."""
    return importlib.import_module(f"examples.{name}.train")


class _Batches:
    """``batch(step)`` over an example's ``make_batches`` iterator: steps come in order (the bench
    asks for each block's batches once); a step out of order starts the iterator again."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self.make = make
        self.iterator: Iterator[Any] | None = None
        self.next_step = 0

    def __call__(self, step: int) -> Any:
        if self.iterator is None or step < self.next_step:
            self.iterator, self.next_step = self.make(), 0
        while self.next_step < step:
            next(self.iterator)
            self.next_step += 1
        self.next_step += 1
        return next(self.iterator)


class BertTopics:
    """examples/bert: all-MiniLM-L6-v2 + a 4-way head on the fortunes' topics."""

    def __init__(self, options: dict[str, Any]) -> None:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.bert = example("bert")
        self.seed = int(options.get("seed", 0))
        self.batch_size = int(options.get("batch", 8))
        self.max_length = int(options.get("max_length", 64))
        self.lr = float(options.get("lr", 1e-4))
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.bert.model_folder())
        self.train, self.held_out = self.bert.build_data(str(options.get("fortunes_dir", self.bert.FORTUNES_DIR)))
        if options.get("eval_limit"):
            self.held_out = self.held_out[: int(options["eval_limit"])]
        self.batches: dict[tuple[int, int], _Batches] = {}

    def describe(self) -> str:
        return (
            f"all-MiniLM-L6-v2 (6-layer BERT, 384 wide) + {len(self.bert.TOPICS)}-way head; fortunes: "
            f"{len(self.train)} train / {len(self.held_out)} held-out quotations, {self.max_length} tokens at most"
        )

    def build_model(self) -> nn.Module:
        model: nn.Module = self.bert.build_model(self.seed)
        return model

    def optimizer(self, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=self.lr, weight_decay=0.01)

    def batch(self, step: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
        if (rank, world_size) not in self.batches:
            args = (self.train, self.tokenizer, rank, world_size, self.batch_size, self.max_length, self.seed)
            self.batches[rank, world_size] = _Batches(lambda: self.bert.make_batches(*args))
        batch: dict[str, torch.Tensor] = self.batches[rank, world_size](step)
        return batch

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss: torch.Tensor = self.bert.compute_loss(model, batch)
        return loss

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> float:
        """The example's own step: zero the gradients, its loss, backward (the AllReduce), update."""
        loss: float = self.bert.train_step(model, optimizer, batch)
        return loss

    def evaluate(self, model: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        correct, count = self.bert.accuracy(model, self.tokenizer, self.held_out[rank::world_size], self.max_length)
        return {"correct": correct, "count": count}

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return {"accuracy": sums["correct"] / max(sums["count"], 1.0), "count": sums["count"]}


class LlamaFortunes:
    """examples/llama: the Llama it pretrains itself, fine-tuned on the fortunes."""

    def __init__(self, options: dict[str, Any]) -> None:
        import transformers

        transformers.logging.set_verbosity_error()
        self.llama = example("llama")
        self.options = options
        self.seed = int(options.get("seed", 0))
        self.batch_size = int(options["batch"])
        self.length = int(options["seq_length"])
        self.lr = float(options["lr"])
        self.train, self.held_out = self.llama.build_data(str(options.get("fortunes_dir", self.llama.FORTUNES_DIR)))
        self.eval_windows = int(options.get("eval_windows", 64))
        self.checkpoint = Path(options["checkpoint"]) if int(options["pretrain_steps"]) > 0 else None
        self.batches: dict[tuple[int, int], _Batches] = {}

    def prepare(self) -> None:
        """Pretrain once, as the example does (the first process to get the lock; the others wait)."""
        if self.checkpoint is None or self.checkpoint.exists():
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.checkpoint}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.checkpoint.exists():
                steps = self.options["pretrain_steps"]
                print(
                    f"examples/llama: pretraining {steps} steps on the Python language reference -> {self.checkpoint}",
                    file=sys.stderr,
                    flush=True,
                )
                self.llama.pretrain(argparse.Namespace(**self.options), self.checkpoint)

    def describe(self) -> str:
        o = self.options
        return (
            f"Llama {o['layers']} layers x {o['hidden']} ({o['heads']} heads), byte tokens, {self.length}-byte "
            f"windows; pretrained {o['pretrain_steps']} steps on the Python reference"
        )

    def build_model(self) -> nn.Module:
        self.prepare()
        o = self.options
        checkpoint = None if self.checkpoint is None else str(self.checkpoint)
        model: nn.Module = self.llama.build_model(o["hidden"], o["layers"], o["heads"], self.length, checkpoint)
        return model

    def optimizer(self, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=self.lr, weight_decay=0.01)

    def batch(self, step: int, rank: int, world_size: int) -> torch.Tensor:
        if (rank, world_size) not in self.batches:
            args = (self.train, rank, world_size, self.batch_size, self.length, self.seed)
            self.batches[rank, world_size] = _Batches(lambda: self.llama.make_batches(*args))
        batch: torch.Tensor = self.batches[rank, world_size](step)
        return batch

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.llama.compute_loss(model, batch)
        return loss

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
        """The example's own step: zero the gradients, its loss, backward (the AllReduce), update."""
        loss: float = self.llama.train_step(model, optimizer, batch)
        return loss

    def held_out_windows(self, rank: int, world_size: int) -> torch.Tensor:
        """``rank``'s share of the first ``eval_windows`` held-out windows: ``[count, seq_length]``."""
        held_out: torch.Tensor = self.llama.windows(self.held_out, self.length)[: self.eval_windows]
        return held_out[rank::world_size]

    def evaluate(self, model: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        windows = self.held_out_windows(rank, world_size)
        nll = sum(float(self.llama.compute_loss(model, w.unsqueeze(0))) for w in windows) * (self.length - 1)
        return {"nll_sum": nll, "tokens": float(len(windows) * (self.length - 1))}

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["nll_sum"] / max(sums["tokens"], 1.0)
        return {"perplexity": math.exp(loss), "eval_loss": loss, "tokens": sums["tokens"]}

    # -- the same under megatron-core (--framework megatron) -------------------------------------------
    def megatron_model(self) -> tuple[Any, nn.Module]:
        return megatron_llama(self.options, self.build_model().state_dict())

    def megatron_batch(self, step: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
        """:meth:`batch`'s windows: the first ``seq_length - 1`` bytes in, the next byte of each out
        (what transformers' shifted loss predicts)."""
        return _shifted(self.batch(step, rank, world_size))

    def megatron_optimizer(self) -> dict[str, Any]:
        """megatron-core's ``adam`` (torch's AdamW where Transformer Engine and Apex are missing).
        Its parameter groups leave the norms out of the weight decay, as Megatron-LM does: the one
        difference from :meth:`optimizer`."""
        return {"optimizer": "adam", "lr": self.lr, "weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.999}

    def megatron_evaluate(self, module: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        nll, tokens = 0.0, 0.0
        for held_out in self.held_out_windows(rank, world_size):
            window = _shifted(held_out.unsqueeze(0))
            losses = module(window["tokens"], window["position_ids"], None, labels=window["labels"])
            nll += float(losses.float().sum())
            tokens += losses.numel()
        return {"nll_sum": nll, "tokens": tokens}


def megatron_llama(options: dict[str, Any], state: dict[str, torch.Tensor]) -> tuple[Any, nn.Module]:
    """The model of ``options`` as megatron-core's ``GPTModel`` (local layer spec: RMSNorm, SwiGLU,
    rotary positions, no biases, untied output layer), holding the transformers state dict
    ``state``: (``TransformerConfig``, module). Called inside the CPU shim (megatron-core's
    parallel state initialised).

    The weights map one to one except two fused matrices: megatron-core's ``linear_qkv`` holds
    each head's query, key and value rows together (head 0's q, k, v, then head 1's, ...), and
    ``linear_fc1`` the gate rows above the up rows (its gated unit is ``silu(first half) * second
    half``). Rotary positions rotate the two halves of each head (not interleaved pairs), as
    transformers' Llama does, with the same base (10,000).
    """
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    hidden, heads, layers = int(options["hidden"]), int(options["heads"]), int(options["layers"])
    head_size = hidden // heads
    config = TransformerConfig(
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_query_groups=heads,
        kv_channels=head_size,
        ffn_hidden_size=intermediate_size(hidden),
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,  # transformers' LlamaConfig.rms_norm_eps
        gated_linear_unit=True,
        activation_func=F.silu,
        bias_activation_fusion=False,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=example("llama").VOCAB,
        max_sequence_length=int(options["seq_length"]),
        position_embedding_type="rope",
        rotary_base=10000,
        share_embeddings_and_output_weights=False,
    )
    converted = {
        "embedding.word_embeddings.weight": state["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": state["model.norm.weight"],
        "output_layer.weight": state["lm_head.weight"],
    }
    for i in range(layers):
        hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
        q, k, v = (state[f"{hf}self_attn.{x}_proj.weight"].view(heads, head_size, hidden) for x in "qkv")
        converted |= {
            f"{mc}input_layernorm.weight": state[f"{hf}input_layernorm.weight"],
            f"{mc}self_attention.linear_qkv.weight": torch.cat([q, k, v], dim=1).reshape(3 * hidden, hidden),
            f"{mc}self_attention.linear_proj.weight": state[f"{hf}self_attn.o_proj.weight"],
            f"{mc}pre_mlp_layernorm.weight": state[f"{hf}post_attention_layernorm.weight"],
            f"{mc}mlp.linear_fc1.weight": torch.cat(
                [state[f"{hf}mlp.gate_proj.weight"], state[f"{hf}mlp.up_proj.weight"]], dim=0
            ),
            f"{mc}mlp.linear_fc2.weight": state[f"{hf}mlp.down_proj.weight"],
        }
    own = {name for name, _ in model.named_parameters()}
    if own != set(converted):
        raise RuntimeError(
            "profiling.lab.workloads: megatron-core's GPTModel has other parameters than the conversion fills: "
            f"missing {sorted(own - set(converted))}, extra {sorted(set(converted) - own)}"
        )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(converted[name])
    return config, model


def intermediate_size(hidden: int) -> int:
    """The Llama example's MLP width for ``hidden`` (2.75x, rounded to 16)."""
    return round(2.75 * hidden / 16) * 16


def _shifted(windows: torch.Tensor) -> dict[str, torch.Tensor]:
    inputs = windows[:, :-1]
    positions = torch.arange(inputs.shape[1]).unsqueeze(0).expand(inputs.shape[0], -1)
    return {"tokens": inputs.contiguous(), "labels": windows[:, 1:].contiguous(), "position_ids": positions}


# --------------------------------------------------------------------------- the command line of each


def bert_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("BERT fine-tuning (examples/bert/train.py)")
    group.add_argument("--batch", type=int, default=8, help="quotations per rank and step (default 8)")
    group.add_argument("--max-length", type=int, default=64, help="tokens per quotation at most (default 64)")
    group.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    group.add_argument("--fortunes-dir", default="/usr/share/games/fortunes", help="the fortunes files")
    group.add_argument("--eval-limit", type=int, default=0, help="evaluate on this many held-out quotations (0: all)")


def bert_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.batch < 1 or args.max_length < 8:
        raise ValueError("--batch must be >= 1 and --max-length >= 8")
    keys = ("seed", "batch", "max_length", "lr", "fortunes_dir", "eval_limit")
    return {key: getattr(args, key) for key in keys}


def llama_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Llama fine-tuning (examples/llama/train.py)")
    group.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    group.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    group.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    group.add_argument("--seq-length", type=int, default=128, help="bytes per window (default 128)")
    group.add_argument("--batch", type=int, default=4, help="windows per rank and step (default 4)")
    group.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate of the fine-tuning (3e-4)")
    group.add_argument("--pretrain-steps", type=int, default=200, help="steps of the example's own pretraining")
    group.add_argument("--checkpoint", default=None, help="the pretrained model (made if missing)")
    group.add_argument("--fortunes-dir", default="/usr/share/games/fortunes", help="the fortunes files")
    group.add_argument("--eval-windows", type=int, default=64, help="held-out windows to evaluate (default 64)")


def llama_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.hidden % args.heads or min(args.hidden, args.layers, args.batch) < 1 or args.pretrain_steps < 0:
        raise ValueError("--hidden must be a multiple of --heads; sizes must be >= 1, --pretrain-steps >= 0")
    keys = ("seed", "hidden", "layers", "heads", "seq_length", "batch", "lr", "pretrain_steps", "fortunes_dir")
    options = {key: getattr(args, key) for key in keys}
    sizes = f"{args.hidden}x{args.layers}x{args.heads}-{args.seq_length}-{args.pretrain_steps}"
    default = Path.home() / ".cache" / "stragglerkit" / f"llama-{sizes}.pt"  # the example's own cache file
    options["checkpoint"] = str(Path(args.checkpoint or default).absolute())
    options["eval_windows"] = args.eval_windows
    return options


def bert(options: dict[str, Any]) -> BertTopics:
    """The factory that the ranks call (``TrainConfig.workload = "profiling.lab.workloads:bert"``)."""
    return BertTopics(options)


def llama(options: dict[str, Any]) -> LlamaFortunes:
    """The factory that the ranks call (``TrainConfig.workload = "profiling.lab.workloads:llama"``)."""
    return LlamaFortunes(options)


class Example(NamedTuple):
    """What :mod:`.finetune` needs of one example."""

    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    options: Callable[[argparse.Namespace], dict[str, Any]]
    frameworks: tuple[str, ...]


EXAMPLES = {
    "bert": Example(
        "fine-tune examples/bert (all-MiniLM-L6-v2 on the fortunes' topics), plain against stragglerkit",
        bert_arguments,
        bert_options,
        ("ddp", "horovod"),
    ),
    "llama": Example(
        "fine-tune examples/llama (a small Llama on the fortunes), plain against stragglerkit",
        llama_arguments,
        llama_options,
        ("ddp", "horovod", "megatron"),
    ),
}
"""The examples that the fine-tuning bench runs, by name; the factory is the function of that name."""

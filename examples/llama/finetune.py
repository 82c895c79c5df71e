"""Fine-tune a small Llama decoder on real text, plain data-parallel against stragglerkit.

The model is transformers' ``LlamaForCausalLM`` built from a config (default: 4 layers, hidden
size 512, 8 heads, MLP 1408, untied output layer: 13.1M parameters) over byte-level tokens
(vocabulary 256: a token is a byte of the UTF-8 text, so no tokenizer is needed).

No package ships small Llama weights, so this example makes its own: **it first pretrains the
model itself**, in one process on this machine, on the Python language reference that CPython
ships (``pydoc_data.topics``, 0.5 MB), for ``--pretrain-steps`` steps of AdamW, and saves the
checkpoint (``--checkpoint``, by default under ``~/.cache/stragglerkit/``; a later run with the
same settings reuses it). It then fine-tunes that checkpoint, data-parallel, on a second text:
the quotations of Debian's ``fortunes`` package (the fortune-mod collection, 2.7 MB). Every tenth
quotation is held out; the run reports the perplexity per byte on the held-out quotations.

Each rank reads windows of ``--seq-length`` bytes at offsets drawn from a generator seeded by
(seed, step, rank). Everything else is the training bench's: ``stragglerkit.bench.finetune``.

Example (8 ranks on the emulated cluster as root, rank 3's NIC at half rate)::

    python examples/llama/finetune.py --degrade 3:2 --steps 80 --target-loss 2.2
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

FORTUNES_DIR = "/usr/share/games/fortunes"
"""Where Debian's ``fortunes`` package puts its files: the fine-tuning text."""
VOCAB = 256
"""Byte-level tokens."""


def pretraining_text() -> bytes:
    """The Python language reference, as CPython's ``pydoc_data.topics`` ships it."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics)).encode("utf-8")


def fortunes_text(folder: str) -> tuple[bytes, bytes]:
    """(training text, held-out text): every quotation of the fortunes files; every tenth held out."""
    paths = sorted(p for p in Path(folder).glob("*") if p.is_file() and not p.suffix and not p.is_symlink())
    if not paths:
        raise FileNotFoundError(
            f"no fortune files in {folder}: the fine-tuning text is Debian's fortunes package (apt-get install "
            "fortunes; scripts/setup.sh does it as root), or give --fortunes-dir"
        )
    quotes = [
        chunk.strip()
        for path in paths
        for chunk in path.read_bytes().decode("utf-8", errors="replace").split("\n%\n")
        if chunk.strip()
    ]
    train = "\n\n".join(q for i, q in enumerate(quotes) if i % 10 != 9)
    held_out = "\n\n".join(q for i, q in enumerate(quotes) if i % 10 == 9)
    return train.encode("utf-8"), held_out.encode("utf-8")


def build_llama(options: dict[str, Any]) -> nn.Module:
    """The untrained model of ``options`` (hidden, layers, heads, intermediate, seq_length)."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise ImportError("examples/llama needs transformers: pip install transformers==5.23.0") from None
    hidden = int(options["hidden"])
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=int(options["intermediate"]),
        num_hidden_layers=int(options["layers"]),
        num_attention_heads=int(options["heads"]),
        num_key_value_heads=int(options["heads"]),
        max_position_embeddings=int(options["seq_length"]),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(int(options.get("pretrain_seed", 0)))
    return LlamaForCausalLM(config)


def windows(tokens: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` tokens at random offsets."""
    starts = torch.randint(0, len(tokens) - length, (count,), generator=generator)
    return torch.stack([tokens[s : s + length] for s in starts.tolist()])


def as_tokens(text: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


def checkpoint_path(options: dict[str, Any]) -> Path:
    """Where the pretrained model of these settings is kept (``--checkpoint``, or a cache file)."""
    if options.get("checkpoint"):
        return Path(options["checkpoint"])
    keys = ("hidden", "layers", "heads", "intermediate", "seq_length", "pretrain_steps", "pretrain_seed")
    digest = hashlib.sha256(json.dumps({k: options[k] for k in keys}).encode()).hexdigest()[:12]
    return Path.home() / ".cache" / "stragglerkit" / f"llama-pretrained-{digest}.pt"


def pretrain(options: dict[str, Any], path: Path) -> None:
    """Pretrain on the Python language reference and save the state dict to ``path`` (atomically)."""
    model = build_llama(options)
    model.train()
    steps, length = int(options["pretrain_steps"]), int(options["seq_length"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    tokens = as_tokens(pretraining_text())
    generator = torch.Generator().manual_seed(int(options.get("pretrain_seed", 0)))
    start = time.monotonic()
    print(f"examples/llama: pretraining {steps} steps on the Python language reference -> {path}", file=sys.stderr)
    for step in range(steps):
        batch = windows(tokens, 8, length, generator)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 25 == 0 or step == steps - 1:
            print(
                f"examples/llama: pretraining step {step}/{steps}: loss {loss.item():.3f} "
                f"({time.monotonic() - start:.0f} s)",
                file=sys.stderr,
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), str(path) + ".tmp")
    os.replace(str(path) + ".tmp", path)


class LlamaFortunes:
    """The workload (stragglerkit.bench.workload.Workload): the pretrained Llama on the fortunes."""

    def __init__(self, options: dict[str, Any]) -> None:
        import transformers

        transformers.logging.set_verbosity_error()
        self.options = options
        self.seed = int(options.get("seed", 0))
        self.batch_size = int(options["batch"])
        self.length = int(options["seq_length"])
        self.lr = float(options["lr"])
        train, held_out = fortunes_text(str(options.get("fortunes_dir", FORTUNES_DIR)))
        self.train, self.held_out = as_tokens(train), as_tokens(held_out)
        self.eval_windows = int(options.get("eval_windows", 64))
        self.checkpoint = checkpoint_path(options)

    def prepare(self) -> None:
        """Pretrain once (the first process to get the lock does; the others wait for its file)."""
        if self.checkpoint.exists():
            return
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        with open(str(self.checkpoint) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.checkpoint.exists():
                pretrain(self.options, self.checkpoint)

    def describe(self) -> str:
        o = self.options
        return (
            f"Llama {o['layers']} layers x {o['hidden']} ({o['heads']} heads, MLP {o['intermediate']}), byte tokens, "
            f"{self.length}-byte windows; pretrained {o['pretrain_steps']} steps on the Python reference"
        )

    def build_model(self) -> nn.Module:
        self.prepare()
        model = build_llama(self.options)
        model.load_state_dict(torch.load(self.checkpoint, weights_only=True))
        return model

    def optimizer(self, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=self.lr, weight_decay=0.01)

    def batch(self, step: int, rank: int, world_size: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 1009 + rank)
        return windows(self.train, self.batch_size, self.length, generator)

    def loss(self, model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = model(input_ids=batch, labels=batch).loss
        return loss

    def held_out_windows(self, rank: int, world_size: int) -> list[torch.Tensor]:
        """Non-overlapping windows of the held-out text (the first ``eval_windows``), dealt to the
        ranks: ``rank``'s, each ``[1, seq_length]``."""
        count = min(self.eval_windows, len(self.held_out) // self.length)
        return [
            self.held_out[index * self.length : (index + 1) * self.length].unsqueeze(0)
            for index in range(rank, count, world_size)
        ]

    def evaluate(self, model: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        nll, tokens = 0.0, 0.0
        for window in self.held_out_windows(rank, world_size):
            predicted = self.length - 1
            nll += float(model(input_ids=window, labels=window).loss) * predicted
            tokens += predicted
        return {"nll_sum": nll, "tokens": tokens}

    # -- the same under megatron-core (--framework megatron) -------------------------------------------
    def megatron_model(self) -> tuple[Any, nn.Module]:
        self.prepare()
        return megatron_llama(self.options, torch.load(self.checkpoint, weights_only=True))

    def megatron_batch(self, step: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
        """:meth:`batch`'s windows: the first ``seq_length - 1`` bytes in, the next byte of each
        out (what transformers' shifted loss predicts)."""
        return self._shifted(self.batch(step, rank, world_size))

    def megatron_optimizer(self) -> dict[str, Any]:
        """megatron-core's ``adam`` (torch's AdamW where Transformer Engine and Apex are missing;
        their fused Adams decouple the weight decay too). Its parameter groups leave the norms out
        of the weight decay, as Megatron-LM does: the one difference from :meth:`optimizer`."""
        return {"optimizer": "adam", "lr": self.lr, "weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.999}

    def megatron_evaluate(self, module: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        nll, tokens = 0.0, 0.0
        for held_out in self.held_out_windows(rank, world_size):
            window = self._shifted(held_out)
            losses = module(window["tokens"], window["position_ids"], None, labels=window["labels"])
            nll += float(losses.float().sum())
            tokens += losses.numel()
        return {"nll_sum": nll, "tokens": tokens}

    @staticmethod
    def _shifted(windows: torch.Tensor) -> dict[str, torch.Tensor]:
        inputs = windows[:, :-1]
        positions = torch.arange(inputs.shape[1]).unsqueeze(0).expand(inputs.shape[0], -1)
        return {"tokens": inputs.contiguous(), "labels": windows[:, 1:].contiguous(), "position_ids": positions}

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        loss = sums["nll_sum"] / max(sums["tokens"], 1.0)
        return {"perplexity": math.exp(loss), "eval_loss": loss, "tokens": sums["tokens"]}


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
        ffn_hidden_size=int(options["intermediate"]),
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
        vocab_size=VOCAB,
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
            "examples/llama: megatron-core's GPTModel has other parameters than the conversion fills: "
            f"missing {sorted(own - set(converted))}, extra {sorted(set(converted) - own)}"
        )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(converted[name])
    return config, model


def workload(options: dict[str, Any]) -> LlamaFortunes:
    """The factory that stragglerkit.bench calls on every rank."""
    return LlamaFortunes(options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Llama fine-tuning")
    group.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    group.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    group.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    group.add_argument("--intermediate", type=int, default=None, help="MLP width (default 2.75 x hidden, rounded)")
    group.add_argument("--seq-length", type=int, default=128, help="bytes per window (default 128)")
    group.add_argument("--batch", type=int, default=4, help="windows per rank and step (default 4)")
    group.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate of the fine-tuning (3e-4)")
    group.add_argument("--pretrain-steps", type=int, default=200, help="steps of the example's own pretraining")
    group.add_argument("--checkpoint", default=None, help="the pretrained model (made if missing)")
    group.add_argument("--fortunes-dir", default=FORTUNES_DIR, help=f"the fortunes files (default {FORTUNES_DIR})")
    group.add_argument("--eval-windows", type=int, default=64, help="held-out windows to evaluate (default 64)")


def options(args: argparse.Namespace) -> dict[str, Any]:
    if args.hidden % args.heads or min(args.hidden, args.layers, args.batch, args.pretrain_steps) < 1:
        raise ValueError("--hidden must be a multiple of --heads; sizes and steps must be >= 1")
    intermediate = args.intermediate or int(round(2.75 * args.hidden / 16) * 16)
    return {
        "seed": args.seed,
        "hidden": args.hidden,
        "layers": args.layers,
        "heads": args.heads,
        "intermediate": intermediate,
        "seq_length": args.seq_length,
        "batch": args.batch,
        "lr": args.lr,
        "pretrain_steps": args.pretrain_steps,
        "pretrain_seed": 0,
        "checkpoint": str(Path(args.checkpoint).absolute()) if args.checkpoint else None,
        "fortunes_dir": args.fortunes_dir,
        "eval_windows": args.eval_windows,
    }


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from stragglerkit.bench.finetune import example_main

    sys.exit(
        example_main(
            __file__,
            __doc__.split("\n\n")[0],
            add_arguments=add_arguments,
            options=options,
            frameworks=("ddp", "horovod", "megatron"),
        )
    )

"""Fine-tune a small Llama on text, data-parallel, with stragglerkit's straggler-aware AllReduce.

The model is transformers' ``LlamaForCausalLM`` built from a config (default: 4 layers, hidden
size 512, 8 heads, 13.1M parameters) over byte-level tokens (vocabulary 256: a token is a byte of
the UTF-8 text, so no tokenizer is needed). No package ships small Llama weights, so the script
first pretrains the model itself, on rank 0, on the Python language reference that CPython ships
(``pydoc_data.topics``), and keeps the checkpoint (``--checkpoint``; ``--pretrain-steps 0`` starts
from random weights). It then fine-tunes it on the quotations of Debian's ``fortunes`` package;
every tenth is held out, and rank 0 prints the held-out perplexity per byte at the end.

On one machine (gloo on CPUs, NCCL on GPUs, one GPU per rank)::

    torchrun --nproc_per_node 2 examples/llama/train.py --steps 100
    horovodrun -np 2 --gloo python examples/llama/train.py --framework horovod --steps 100

On a cluster, the same script on every node (``torchrun --nnodes N --rdzv-endpoint HOST:29500 ...``).
``--plain`` trains without stragglerkit, for a comparison. The benchmark
(``python -m profiling.lab.finetune llama``) imports :func:`build_model`, :func:`build_data`,
:func:`make_batches` and :func:`train_step` from here.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import stragglerkit

FORTUNES_DIR = "/usr/share/games/fortunes"
VOCAB = 256
"""Byte-level tokens."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("ddp", "horovod"), default="ddp")
    parser.add_argument("--plain", action="store_true", help="without stragglerkit (plain DDP or Horovod)")
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--batch-size", type=int, default=4, help="windows per rank and step")
    parser.add_argument("--seq-length", type=int, default=128, help="bytes per window")
    parser.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data order")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size (the MLP is 2.75x wider)")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--heads", type=int, default=8, help="attention heads")
    parser.add_argument("--pretrain-steps", type=int, default=200, help="rank 0's pretraining first (0: none)")
    parser.add_argument("--checkpoint", default=None, help="the pretrained model (default: under ~/.cache)")
    parser.add_argument("--fortunes-dir", default=FORTUNES_DIR, help="where the fortunes files are")
    parser.add_argument("--log-every", type=int, default=1, help="print the loss every N steps")
    return parser.parse_args()


def build_model(hidden: int, layers: int, heads: int, seq_length: int, checkpoint: str | None = None) -> nn.Module:
    """The Llama of these sizes: from ``checkpoint`` if given, else initialised from seed 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=round(2.75 * hidden / 16) * 16,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=seq_length,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if checkpoint is not None:
        model.load_state_dict(torch.load(checkpoint, weights_only=True))
    return model


def as_tokens(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def pretrain(args: argparse.Namespace, path: Path) -> None:
    """Pretrain on the Python language reference (one process) and save the weights to ``path``."""
    from pydoc_data.topics import topics

    model = build_model(args.hidden, args.layers, args.heads, args.seq_length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    tokens = as_tokens("\n\n".join(topics[name] for name in sorted(topics)))
    generator = torch.Generator().manual_seed(0)
    for step in range(args.pretrain_steps):
        starts = torch.randint(0, len(tokens) - args.seq_length, (8,), generator=generator).tolist()
        batch = torch.stack([tokens[s : s + args.seq_length] for s in starts])
        train_step(model, optimizer, batch)
        if step % 50 == 0:
            print(f"pretraining step {step}/{args.pretrain_steps}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), f"{path}.tmp")
    os.replace(f"{path}.tmp", path)


def build_data(folder: str = FORTUNES_DIR) -> tuple[torch.Tensor, torch.Tensor]:
    """(training, held-out) text as byte tokens: every quotation of the fortunes; each tenth held out."""
    paths = sorted(p for p in Path(folder).glob("*") if p.is_file() and not p.suffix and not p.is_symlink())
    if not paths:
        raise FileNotFoundError(f"no fortune files in {folder}: apt-get install fortunes, or give --fortunes-dir")
    quotes = [q.strip() for p in paths for q in p.read_bytes().decode("utf-8", "replace").split("\n%\n") if q.strip()]
    train = "\n\n".join(q for i, q in enumerate(quotes) if i % 10 != 9)
    held_out = "\n\n".join(q for i, q in enumerate(quotes) if i % 10 == 9)
    return as_tokens(train), as_tokens(held_out)


def windows(tokens: torch.Tensor, length: int) -> torch.Tensor:
    """The text cut into non-overlapping windows of ``length`` tokens: ``[count, length]``."""
    count = len(tokens) // length
    return tokens[: count * length].view(count, length)


def make_batches(
    tokens: torch.Tensor, rank: int, world_size: int, batch_size: int, seq_length: int, seed: int
) -> Iterator[torch.Tensor]:
    """This rank's batches of windows, epoch after epoch: its share of each shuffled epoch."""
    data = cast("Dataset[torch.Tensor]", windows(tokens, seq_length))  # a dataset of rows
    sampler: DistributedSampler[torch.Tensor] = DistributedSampler(
        data, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True)
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The mean next-byte cross-entropy (transformers shifts the labels itself)."""
    loss: torch.Tensor = model(input_ids=batch, labels=batch).loss
    return loss


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """One step: forward, backward (the gradients' AllReduce), update. The loss of this rank's batch."""
    model.zero_grad(set_to_none=False)  # in place: DDP's gradients stay views of its buckets
    loss = compute_loss(model, batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def main() -> None:
    args = parse_args()
    if args.framework == "horovod":
        import horovod.torch as hvd

        hvd.init()  # Horovod's ranks; stragglerkit makes its torch.distributed group from them
        rank, world_size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    else:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if not args.plain:
            stragglerkit.init()  # collective: every rank, once, after the process group
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    checkpoint = None
    if args.pretrain_steps > 0:
        sizes = f"{args.hidden}x{args.layers}x{args.heads}-{args.seq_length}-{args.pretrain_steps}"
        path = Path(args.checkpoint or Path.home() / ".cache" / "stragglerkit" / f"llama-{sizes}.pt")
        if rank == 0 and not path.exists():
            pretrain(args, path)
        if args.framework == "horovod":  # every rank waits for rank 0's checkpoint
            hvd.allreduce(torch.zeros(1), name="checkpoint")
        else:
            dist.barrier()
        checkpoint = str(path)
    model: nn.Module = build_model(args.hidden, args.layers, args.heads, args.seq_length, checkpoint).to(device)
    state: Any = None  # stragglerkit's: DDPState, or the Horovod optimizer; close() when done
    if args.framework == "ddp":
        model = DDP(model, gradient_as_bucket_view=True)
        if not args.plain:
            state = stragglerkit.DDPState(process_group=None)
            model.register_comm_hook(state, stragglerkit.ddp_hook)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    if args.framework == "horovod":
        named = model.named_parameters()
        if args.plain:
            optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=named)
        else:
            optimizer = state = stragglerkit.straggler_aware(optimizer, named_parameters=named)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    train, held_out = build_data(args.fortunes_dir)
    batches = make_batches(train, rank, world_size, args.batch_size, args.seq_length, args.seed)
    for step, batch in zip(range(args.steps), batches, strict=False):
        loss = train_step(model, optimizer, batch.to(device))
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step}: loss {loss:.4f}", flush=True)

    module = model.module if isinstance(model, DDP) else model
    module.eval()
    with torch.no_grad():  # this rank's share of the first 64 held-out windows
        mine = windows(held_out, args.seq_length)[:64][rank::world_size].to(device)
        losses = torch.stack([compute_loss(module, w.unsqueeze(0)) for w in mine]).double()
        sums = torch.stack([losses.sum(), torch.tensor(float(len(losses)), device=device).double()])
    checksum = torch.cat([p.detach().flatten() for p in module.parameters()]).double().sum().reshape(1)
    if args.framework == "horovod":
        sums, checksums = hvd.allreduce(sums, op=hvd.Sum), hvd.allgather(checksum)
    else:
        dist.all_reduce(sums)
        gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
        dist.all_gather(gathered, checksum)
        checksums = torch.cat(gathered)
    if rank == 0:  # the checksums: every rank ends with the same parameters
        print(f"held-out perplexity per byte {math.exp(sums[0] / sums[1]):.3f}", flush=True)
        print(f"parameter checksums: {' '.join(f'{c:.12e}' for c in checksums.tolist())}", flush=True)

    if state is not None:
        state.close()  # every rank, after the last step, before stragglerkit.destroy()
    if args.framework == "horovod":
        hvd.shutdown()
    elif not args.plain:
        stragglerkit.destroy()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

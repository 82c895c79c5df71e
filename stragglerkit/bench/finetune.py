"""Moved out of the installed package: the fine-tuning comparison is one of the repository's benchmarks."""

raise ImportError(
    "stragglerkit.bench.finetune left the installed package. To train with stragglerkit, run an example: "
    "torchrun --nproc_per_node 8 examples/bert/train.py (or examples/llama/train.py). To compare plain "
    "against stragglerkit side by side, from the root of a checkout: python -m profiling.lab.finetune "
    "bert|llama (docs/bench.md)."
)

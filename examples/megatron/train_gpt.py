"""Train a small GPT with megatron-core, data-parallel, with or without the straggler-aware AllReduce.

Everything is megatron-core's: ``GPTModel`` (the local layer spec, no Transformer Engine or Apex),
its ``DistributedDataParallel``, its optimizer (``get_megatron_optimizer``) and its schedule
(``get_forward_backward_func``), with tensor- and pipeline-parallel size 1. The text is the Python
language reference as the standard library ships it (``pydoc_data.topics``), tokenised by
megatron-core's byte-level tokenizer, so nothing is downloaded. Each data-parallel rank reads its
own windows of the text.

``--straggler-aware-allreduce`` (the options of ``stragglerkit.megatron.add_arguments``) routes the
gradient buckets through stragglerkit's closed loop; ``--late-rank R --late-ms D`` makes rank R
arrive D ms late every step, a persistent straggler the loop can act on (StragglAR needs an even
data-parallel size of 4 or more).

On a machine without CUDA it runs on CPU over gloo, with megatron-core's few CUDA-only calls sent
to the CPU (``cpu_shim.py`` beside this script; it does nothing where CUDA is available, and a
script for GPUs needs none of it) and gradient clipping off (megatron-core's clipping
asserts CUDA tensors); with GPUs the same command runs on NCCL, one GPU per rank
(``--backend gloo``: several ranks may share one GPU, as the GPU check does).

Example::

    torchrun --standalone --nproc-per-node 2 examples/megatron/train_gpt.py --straggler-aware-allreduce
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

# beside this script (torchrun puts the script's folder on the path): megatron-core on CPU
from cpu_shim import cuda_calls_on_cpu, needs_shim

import stragglerkit.megatron

warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|full scope is deprecated).*")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument("--seq-length", type=int, default=128, help="tokens per sample")
    parser.add_argument("--micro-batch-size", type=int, default=4, help="samples per micro-batch and rank")
    parser.add_argument(
        "--micro-batches", type=int, default=2, help="micro-batches per step (all but the last under no_sync)"
    )
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bucket-size", type=int, default=200_000, help="parameters per gradient bucket")
    parser.add_argument("--no-overlap-grad-reduce", action="store_true", help="reduce after the backward pass")
    parser.add_argument("--late-rank", type=int, default=-1, help="rank that arrives late every step (-1: none)")
    parser.add_argument("--late-ms", type=float, default=0.0, help="how late, in milliseconds")
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="auto: nccl with GPUs (one per rank), gloo on CPU; gloo with GPUs lets several ranks share one GPU",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--log-every", type=int, default=5, help="print the loss every N steps")
    parser.add_argument("--summary-json", default=None, help="write the run's figures here (rank 0)")
    # --straggler-aware-allreduce, --straggler-config, --straggler-event-log
    stragglerkit.megatron.add_arguments(parser)
    return parser.parse_args()


def text_tokens() -> torch.Tensor:
    """The Python language reference (shipped with CPython), as megatron-core's byte-level tokens."""
    from pydoc_data.topics import topics

    from megatron.core.tokenizers.text.libraries.bytelevel_tokenizer import ByteLevelTokenizer

    text = "\n\n".join(topics[name] for name in sorted(topics))
    return torch.tensor(ByteLevelTokenizer().text_to_ids(text), dtype=torch.long)


def batches(tokens: torch.Tensor, args: argparse.Namespace, dp_rank: int) -> Iterator[dict[str, torch.Tensor]]:
    """This data-parallel rank's micro-batches: random windows of the text, seeded per rank."""
    generator = torch.Generator().manual_seed(args.seed * 1000 + dp_rank)
    positions = torch.arange(args.seq_length).unsqueeze(0).expand(args.micro_batch_size, -1)
    while True:
        starts = torch.randint(0, len(tokens) - args.seq_length - 1, (args.micro_batch_size,), generator=generator)
        window = torch.stack([tokens[s : s + args.seq_length + 1] for s in starts.tolist()])
        yield {"tokens": window[:, :-1], "labels": window[:, 1:], "position_ids": positions}


def forward_step(data_iterator: Iterator[dict[str, torch.Tensor]], model: Any, device: torch.device) -> Any:
    batch = {name: value.to(device) for name, value in next(data_iterator).items()}
    losses = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])

    def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = output.float().mean()
        return loss, {"lm loss": loss.detach()}

    return losses, loss_func


def main() -> None:
    args = parse_args()
    on_cpu = needs_shim()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if on_cpu:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        device = torch.device("cpu")
    else:  # with gloo several ranks may share a GPU (NCCL refuses two ranks on one device)
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    backend = args.backend if args.backend != "auto" else ("gloo" if on_cpu else "nccl")
    if on_cpu and backend == "nccl":
        raise SystemExit("train_gpt.py: --backend nccl needs CUDA, and this machine has none; use gloo")
    dist.init_process_group(backend)
    with cuda_calls_on_cpu():  # does nothing where CUDA is available
        train(args, device, on_cpu)
    dist.destroy_process_group()


def train(args: argparse.Namespace, device: torch.device, on_cpu: bool) -> None:
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    torch.manual_seed(args.seed)
    if on_cpu:  # megatron-core's training RNG tracker keeps CUDA generator states; this one keeps none
        tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    config = TransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        use_cpu_initialization=on_cpu,
        pipeline_dtype=torch.float32,
    )
    tokens = text_tokens()
    model: Any = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=512,  # the byte-level tokenizer's
        max_sequence_length=args.seq_length,
    ).to(device)
    ddp_config = DistributedDataParallelConfig(
        overlap_grad_reduce=not args.no_overlap_grad_reduce, bucket_size=args.bucket_size
    )
    model = DistributedDataParallel(config, ddp_config, model)
    model.broadcast_params()
    state = stragglerkit.megatron.install(model, args)  # None without --straggler-aware-allreduce

    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = model.no_sync
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.01, clip_grad=0.0 if on_cpu else 1.0), [model]
    )
    forward_backward = get_forward_backward_func()
    dp_group = parallel_state.get_data_parallel_group()
    dp_rank, dp_size = dp_group.rank(), dp_group.size()
    data = batches(tokens, args, dp_rank)
    rank = dist.get_rank()
    if rank == 0:
        print(
            f"GPT {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(tokens) / 1e3:.0f}k tokens "
            f"of text; data-parallel size {dp_size} on {'CPU' if on_cpu else 'GPU'} ({dist.get_backend()}); "
            f"straggler-aware AllReduce {'on: ' + str(state.buckets) + ' bucket(s)' if state else 'off'}",
            flush=True,
        )
    step_times: list[float] = []
    losses: list[float] = []
    for step in range(args.steps):
        start = time.perf_counter()
        if rank == args.late_rank:
            time.sleep(args.late_ms / 1e3)
        model.zero_grad_buffer()
        optimizer.zero_grad()
        reported = forward_backward(
            forward_step_func=partial(forward_step, device=device),
            data_iterator=data,
            model=[model],
            num_microbatches=args.micro_batches,
            seq_length=args.seq_length,
            micro_batch_size=args.micro_batch_size,
            forward_only=False,
        )
        optimizer.step()
        loss = torch.stack([r["lm loss"] for r in reported]).mean().reshape(1).to(device)
        dist.all_reduce(loss, group=dp_group)
        losses.append(float(loss) / dp_size)
        step_times.append(time.perf_counter() - start)
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            algorithm = state.algorithm if state else "megatron-core"
            print(f"step {step:4d}  loss {losses[-1]:.3f}  {1e3 * step_times[-1]:7.1f} ms  {algorithm}", flush=True)
    # every data-parallel rank ends with the same parameters: rank 0 prints each one's checksum
    checksum = torch.cat([p.detach().flatten() for p in model.parameters()]).double().sum().reshape(1)
    gathered = [torch.zeros_like(checksum) for _ in range(dp_size)]
    dist.all_gather(gathered, checksum, group=dp_group)
    settled = step_times[len(step_times) // 4 :] or step_times
    summary = {
        "straggler_aware_allreduce": state is not None,
        "steps": args.steps,
        "data_parallel_size": dp_size,
        "losses": losses,
        "median_step_ms": 1e3 * statistics.median(settled),
        "loop_steps": state.step if state else 0,
        "bucket_groups": state.bucket_groups if state else 0,
        "algorithm": state.algorithm if state else "megatron-core",
        "events": state.events if state else [],
    }
    if rank == 0:
        print(
            f"done: loss {losses[0]:.3f} -> {losses[-1]:.3f}, median step {summary['median_step_ms']:.1f} ms "
            f"(last 3/4 of the steps), algorithm {summary['algorithm']}, {len(summary['events'])} loop event(s)",
            flush=True,
        )
        for event in summary["events"]:
            print(f"  event at step {event['step']}: {event['kind']} -> {event['algorithm']}", flush=True)
        print(f"parameter checksums: {' '.join(f'{float(c):.12e}' for c in gathered)}", flush=True)
        if args.summary_json:
            with open(args.summary_json, "w", encoding="utf-8") as out:
                json.dump(summary, out, indent=1, default=str)
    if state is not None:
        state.close()


if __name__ == "__main__":
    main()

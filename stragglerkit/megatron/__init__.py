"""Megatron: one flag makes megatron-core's data-parallel gradient AllReduce straggler-aware.

**Megatron-LM** (``pretrain``): give it the flag's parser and call :func:`install` once the model
is wrapped; in Megatron-LM's own loop the first place that sees the wrapped model is the forward
step, and a second call returns at once::

    import stragglerkit.megatron
    from megatron.training import get_args, pretrain

    def forward_step(data_iterator, model):
        stragglerkit.megatron.install(model, get_args())       # once; None without the flag
        ...

    pretrain(..., forward_step, extra_args_provider=stragglerkit.megatron.add_arguments)
    # launch line: ... --straggler-aware-allreduce [--straggler-config configs/megatron.yaml]
    #                  [--straggler-event-log stragglerkit-events.jsonl]

**megatron-core** (your own loop): set the field next to ``DistributedDataParallelConfig``, or
load both from one YAML file (``configs/megatron.yaml``)::

    ddp_config, straggler_config = stragglerkit.megatron.load_yaml("configs/megatron.yaml")
    model = DistributedDataParallel(transformer_config, ddp_config, model)
    state = stragglerkit.megatron.install(model, straggler_config)

What it changes and what it keeps: :mod:`stragglerkit.megatron.adapter`. Supported megatron-core
releases (0.16.x) and the checks made before anything changes: :mod:`stragglerkit.megatron.compat`.
Running megatron-core on a machine without CUDA (tests, examples): :mod:`stragglerkit.megatron.cpu_shim`,
which the integration itself never uses. docs/megatron.md has the whole story.
"""

from __future__ import annotations

from stragglerkit.megatron.adapter import GradSyncHandle, MegatronState, install, installed
from stragglerkit.megatron.compat import PIN, SUPPORTED, TESTED, check_megatron_core
from stragglerkit.megatron.config import FLAG, MegatronConfig, add_arguments, load_yaml

__all__ = [
    "FLAG",
    "PIN",
    "SUPPORTED",
    "TESTED",
    "GradSyncHandle",
    "MegatronConfig",
    "MegatronState",
    "add_arguments",
    "check_megatron_core",
    "install",
    "installed",
    "load_yaml",
]

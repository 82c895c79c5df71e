"""Moved out of the installed package: megatron-core on CPU is for the example and the tests only."""

raise ImportError(
    "stragglerkit.megatron.cpu_shim left the installed package: it is examples/megatron/cpu_shim.py now "
    "(copy it beside your script, or run examples/megatron/train_gpt.py, which uses it; docs/megatron.md)."
)

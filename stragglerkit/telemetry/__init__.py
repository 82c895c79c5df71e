"""stragglerkit.telemetry: what a run records as it goes.

* :mod:`~stragglerkit.telemetry.nvtx`: NVTX and torch.profiler ranges (it installs the runtime's
  range hooks, :mod:`stragglerkit.runtime.hooks`);
* :mod:`~stragglerkit.telemetry.records`: the event log's ``run`` and ``window`` records and the
  JSONL writer (docs/event_log.md is the schema);
* :mod:`~stragglerkit.telemetry.wandb`: the Weights & Biases logger.

Reading logs and traces back, figures and HTML are the offline report's (:mod:`stragglerkit.report`).
"""

"""The lab: what only the benchmarks need, outside the installed package.

* :mod:`.train` (``python -m profiling.lab.train``): the plain framework and stragglerkit trained
  side by side on the same ranks, with injected faults (:mod:`.train_config`, the ranks:
  :mod:`.train_worker` and :mod:`.copies`, the links: :mod:`.reshape`, the figures:
  :mod:`.train_report`; Horovod's ranks: :mod:`.horovod_launch`; megatron-core:
  :mod:`.train_megatron`; selective reduce: :mod:`.train_selective`).
* :mod:`.finetune` (``python -m profiling.lab.finetune bert|llama``): the same with the examples'
  models, data and loss (:mod:`.workloads` builds them from ``examples/bert/train.py`` and
  ``examples/llama/train.py``; :mod:`.workload` is what a workload provides).

Everything here runs from the repository root (:mod:`profiling` says why). The ranks that the lab
starts are new Python processes; they find ``profiling.lab`` and ``examples`` because the root is
added to ``PYTHONPATH`` here, once, when the lab is first imported.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository root."""

_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(ROOT) not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *_paths])

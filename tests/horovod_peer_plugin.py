"""A pytest plugin for Horovod's own test suite (../shared/peers/horovod/test_torch.py): with
``-p horovod_peer_plugin`` every ``hvd.DistributedOptimizer`` those tests make is stragglerkit's.
The peer files stay as published; tests/test_horovod_peers.py runs them both ways."""

from __future__ import annotations

import horovod.torch as hvd

import stragglerkit.horovod

hvd.DistributedOptimizer = stragglerkit.horovod.DistributedOptimizer

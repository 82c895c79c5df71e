"""Training-framework integrations.

``ddp``: the PyTorch DDP comm hook (``stragglerkit.DDPState``, ``stragglerkit.ddp_hook``).
``optimizer``: the distributed optimizer without Horovod (what ``stragglerkit.straggler_aware``
returns on a plain torch.distributed group), with Horovod's interface.
``optimizer_buckets``: the gradient buckets that both distributed optimizers (with Horovod and
without) hand to the closed loop, and the check that every rank's parameters agree.
"""

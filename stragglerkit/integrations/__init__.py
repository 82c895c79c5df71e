"""Training-framework integrations.

``ddp``: the PyTorch DDP comm hook (``stragglerkit.DDPState``, ``stragglerkit.ddp_hook``).
"""

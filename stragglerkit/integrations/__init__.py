"""Training-framework integrations: ``ddp`` (PyTorch DDP comm hook: ``stragglerkit.DDPState``, ``stragglerkit.ddp_hook``)."""

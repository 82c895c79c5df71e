"""stragglerkit.sim."""

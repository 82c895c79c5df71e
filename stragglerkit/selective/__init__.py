"""stragglerkit.selective."""

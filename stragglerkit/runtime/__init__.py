"""stragglerkit.runtime."""

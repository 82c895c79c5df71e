"""stragglerkit.report."""

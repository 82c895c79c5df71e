"""stragglerkit.testbed."""

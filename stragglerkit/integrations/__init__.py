"""stragglerkit.integrations."""

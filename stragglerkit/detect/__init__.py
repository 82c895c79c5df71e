"""stragglerkit.detect."""

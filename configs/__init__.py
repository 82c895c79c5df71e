"""Ready-made configurations (Python functions returning Config objects); see configs/README.md."""

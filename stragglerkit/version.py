"""The package's version (a leaf: the event log's header and the report read it)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.2.0"

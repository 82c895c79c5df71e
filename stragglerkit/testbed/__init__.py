"""stragglerkit.testbed: an emulated cluster on one machine and fault injection for benchmarks.

See docs/testbed.md. ``netns.EmulatedCluster`` builds n hosts as network namespaces with shaped
NICs (needs root and iproute2; ``EmulatedCluster.available()`` says whether it can run);
``inject`` delays ranks before the AllReduce and degrades NICs.
"""

from __future__ import annotations

from stragglerkit.testbed.inject import (
    CombinedInjector,
    JitterInjector,
    NicDegradation,
    StragglerInjector,
    parse_delay,
)
from stragglerkit.testbed.iproute import TestbedError, remove_leftovers
from stragglerkit.testbed.netns import EmulatedCluster
from stragglerkit.testbed.shaping import LinkRate, ShapingError, ShapingReport

__all__ = [
    "CombinedInjector",
    "EmulatedCluster",
    "JitterInjector",
    "LinkRate",
    "NicDegradation",
    "ShapingError",
    "ShapingReport",
    "StragglerInjector",
    "TestbedError",
    "parse_delay",
    "remove_leftovers",
]

"""Simulation and cost prediction of AllReduce schedules.

* :func:`simulate` (flow-level, per-NIC transmit/receive sharing) on a :class:`Network`;
  :func:`auto_delay` finds the straggler delay that hides a pre-phase.
* :class:`CostModel` (GenModel: alpha, beta, gamma, delta, epsilon) over :class:`CostTerms`
  computed from a schedule's IR by :func:`cost_terms`; :func:`fit` estimates its parameters.
"""

from __future__ import annotations

from stragglerkit.sim.cost_model import CostModel, CostTerms, FitResult, cost_terms, fit
from stragglerkit.sim.simulator import Flow, Network, SimResult, auto_delay, simulate, simulate_graph

__all__ = [
    "CostModel",
    "CostTerms",
    "FitResult",
    "Flow",
    "Network",
    "SimResult",
    "auto_delay",
    "cost_terms",
    "fit",
    "simulate",
    "simulate_graph",
]

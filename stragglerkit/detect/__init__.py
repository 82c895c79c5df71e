"""Online detection and the closed loop's decider (docs/detection.md).

``arrival`` (who arrives last, clock-free; clock offsets), ``nic_health`` (link rates, sysfs, l_i),
``detector`` (persistent straggler / degraded ranks, with hysteresis), ``model`` (the cost model
fitted online), ``probe_schedule`` (probe and exchange intervals), ``verification`` (measured
steps, verdicts on switches, rollback), ``choice`` (the plan for what is believed, and its
predicted step), ``controller`` (the decider that composes them), ``settings`` (``Config.detection``
plus the internal constants of :mod:`stragglerkit.defaults`), ``exchange`` (the stats vector:
figures gathered to rank 0, its decision broadcast) and ``legacy`` (what earlier checkpoints hold).
"""

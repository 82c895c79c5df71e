"""Online detection and the closed loop (docs/detection.md).

``arrival`` (who arrives last, clock-free; clock offsets), ``nic_health`` (link rates, sysfs, l_i),
``detector`` (persistent straggler / degraded ranks, with hysteresis), ``model`` (the cost model
fitted online), ``controller`` (the decider: plans per bucket, rank maps, events) with
``controller_config`` (its configuration), ``plans`` (plans, decisions, window statistics),
``probe_schedule`` (probe and exchange intervals) and ``verification`` (switch, verify, roll back),
and ``exchange`` (the periodic stats exchange: figures gathered to rank 0, its decision broadcast).
"""

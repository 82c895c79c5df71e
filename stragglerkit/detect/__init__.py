"""Online detection and the closed loop (docs/detection.md).

``arrival`` (who arrives last, clock-free; clock offsets), ``nic_health`` (link rates, sysfs, l_i),
``detector`` (persistent straggler / degraded ranks, with hysteresis), ``model`` (the cost model
fitted online), ``controller`` (plans, rank maps, verification, rollback, events) and ``exchange``
(the periodic stats exchange: figures gathered to rank 0, its decision broadcast).
"""

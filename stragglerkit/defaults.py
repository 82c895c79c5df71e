"""The library's internal constants, in one place, each with the reason for its value.

These are not configuration: a user sets :class:`stragglerkit.Config` (its ``detection`` section
holds what an operator may change); everything here was measured or derived once and is fixed.
The closed loop reads them through :class:`stragglerkit.detect.settings.Settings`, which is
where tests and the benchmark lab override one for a run. A leaf module: it imports nothing.
"""

from __future__ import annotations

__all__ = [
    "ALARM_STEPS",
    "BASELINE",
    "CLEAR_DEGRADED",
    "CLEAR_DELAY_RATIO",
    "CLEAR_FRACTION",
    "CLOCK_SYNC_EVERY",
    "FIT_SAMPLES",
    "HEALTHY_MEMORY_STEPS",
    "HOSTS_WAIT_S",
    "MAX_BUCKETS",
    "MIN_BUCKET_BYTES",
    "PLAN_PROBE_EVERY",
    "PRIOR_ALPHA",
    "PRIOR_BETA",
    "PROBE_ALARM",
    "QUIET_AFTER",
    "QUIET_PROBE_EVERY",
    "REPLAN_RATIO",
    "ROLLBACK_MARGIN",
    "SETTLE_STEPS",
]

# -- the detector's hysteresis -----------------------------------------------------------------
CLEAR_FRACTION = 0.4
"""A confirmed straggler is cleared when last in fewer than this share of the window: well below
``detection.late_fraction`` (0.75), so a rank on the edge does not flap in and out."""
CLEAR_DELAY_RATIO = 0.5
"""... or when its median delay falls below this times the critical delay (half: the same margin)."""
CLEAR_DEGRADED = 1.2
"""A degraded NIC is cleared below this ``l``: healthy links read up to about 1.15 (one NIC's
readings vary by some 15 %), so anything lower is noise, not a slow NIC."""

# -- the plan --------------------------------------------------------------------------------------
BASELINE = "allreduce"
"""The plan while nothing is wrong: the process group's own AllReduce, what plain DDP runs, so the
loop costs only its bookkeeping."""
MIN_BUCKET_BYTES = 64 * 1024
"""Smaller buckets keep the baseline: below this the AllReduce is latency-bound and no
straggler-aware plan paid in the measurements."""
MAX_BUCKETS = 32
"""Bucket indices tracked per step (later ones run the plan's default): DDP's 25 MB buckets give
a few dozen for the largest models measured; each tracked bucket costs the exchange 8 floats a step."""
REPLAN_RATIO = 1.25
"""An OptCC plan is rebuilt when every reading of a planned rank's ``l`` is this factor off the
plan's: single readings of one NIC vary by some 15 %, so a smaller factor rebuilds on noise."""

# -- verifying a switch ------------------------------------------------------------------------
SETTLE_STEPS = 2
"""Steps after a switch that are not measured: plan generation and the first use of new
connections make them slow whatever the plan."""
ROLLBACK_MARGIN = 0.0
"""A switch is kept when the step after it is faster at all: the verification steps' median is
steady enough (docs/detection.md) that any margin only rejects plans that pay."""

# -- probes and exchanges ------------------------------------------------------------------------
QUIET_PROBE_EVERY = 64
"""The probe interval once the links have proven healthy (rounded up to a multiple of
``detection.probe_every``): a probe's ring costs more than the group's AllReduce, so 8x fewer."""
PLAN_PROBE_EVERY = 64
"""The probe interval under a plan for degraded NICs, so that a NIC that recovers is noticed; each
probe costs what the ring loses to the plan on one bucket."""
QUIET_AFTER = 4
"""Probes that must read the links healthy before the probes back off: one probe on a loaded
host can read a healthy link as slow, the median of four did not in the measurements."""
PROBE_ALARM = 1.3
"""While backed off, the probes return when the AllReduce takes this times what it took when they
backed off: a NIC at half its rate slowed the AllReduce by 1.5x and more in the measurements."""
ALARM_STEPS = 4
"""Plain steps whose median AllReduce the alarm compares (one step alone is too noisy)."""
HEALTHY_MEMORY_STEPS = 256
"""The probes do not back off while the AllReduce is ``PROBE_ALARM`` times slower than its best of
this many steps; after that a lasting slowdown no probe can pin down is the new normal."""
CLOCK_SYNC_EVERY = 256
"""Steps between re-measurements of the clock offsets: clocks drift (and NTP steps them) by more
than a message's time within minutes, and one measurement costs a few ms on 8 hosts."""
HOSTS_WAIT_S = 30.0
"""How long a rank waits at its first step for every rank's host id for its log's header; they are
all there once every rank reached that step's AllReduce."""

# -- the online cost model -------------------------------------------------------------------------
PRIOR_ALPHA = 50e-6
"""The cost model's latency until the first fit: a TCP message between hosts (50 us)."""
PRIOR_BETA = 1 / 1.25e9
"""Its seconds per byte until the first fit: 10 Gbit/s; the first probe replaces it."""
FIT_SAMPLES = 256
"""Most recent AllReduces kept for the fit: enough for the alpha-beta fit over several bucket
sizes, few enough that a cluster whose network changed is relearned within a few hundred steps."""

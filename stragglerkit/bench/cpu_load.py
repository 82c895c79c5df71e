"""How busy a host's CPUs were while an AllReduce ran: is the link or the CPU the bottleneck?

A benchmark of links is only about the links while the CPUs have time to spare. Gloo on CPU
tensors, TCP and (on the emulated cluster) the kernel's shaping all run on the host's cores; when
they are all busy, every algorithm waits for a core, and what the table shows is the machine.
So every timed iteration of ``stragglerkit bench`` reads the kernel's CPU counters
(``/proc/stat``, all cores together) after the barrier that starts it and after its AllReduce,
and each row reports the busiest host's share of busy time over its iterations (``cpu_busy``)
and the share spent in soft interrupts (``cpu_softirq``, mostly network processing). Rows from
``cpu_busy`` = 0.9 on are flagged under the table.

Only Linux has ``/proc/stat``; elsewhere the fields are ``None``. Reading it costs about 50 us,
outside the timed part of an iteration.

Example::

    before = CpuTimes.read()
    run_the_allreduce()
    used = CpuTimes.read() - before        # None-safe: see busy_share
    print(busy_share(used))                # e.g. 0.97
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CPU_BOUND", "CpuTimes", "busy_share", "softirq_share"]

CPU_BOUND = 0.9
"""From this share of busy CPU time on, a row is flagged: the CPUs, not the links, may set its time."""

_STAT = "/proc/stat"


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Cumulative CPU time of all cores, in clock ticks (``USER_HZ``), from ``/proc/stat``'s ``cpu`` line."""

    busy: int
    """user + nice + system + irq + softirq + steal (guest time is counted in user)."""
    softirq: int
    total: int
    """busy + idle + iowait."""

    @staticmethod
    def read(path: str = _STAT) -> CpuTimes | None:
        """The counters now, or None where ``/proc/stat`` cannot be read (not Linux)."""
        try:
            with open(path, encoding="ascii") as stat:
                first = stat.readline().split()
        except OSError:
            return None
        if not first or first[0] != "cpu" or len(first) < 8:
            return None
        user, nice, system, idle, iowait, irq, softirq = (int(v) for v in first[1:8])
        steal = int(first[8]) if len(first) > 8 else 0
        busy = user + nice + system + irq + softirq + steal
        return CpuTimes(busy=busy, softirq=softirq, total=busy + idle + iowait)

    def __sub__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.busy - other.busy, self.softirq - other.softirq, self.total - other.total)

    def __add__(self, other: CpuTimes) -> CpuTimes:
        return CpuTimes(self.busy + other.busy, self.softirq + other.softirq, self.total + other.total)


def busy_share(times: CpuTimes | None) -> float | None:
    """Busy share of the CPU time in ``times`` (None: not measured, or no tick elapsed)."""
    if times is None or times.total <= 0:
        return None
    return times.busy / times.total


def softirq_share(times: CpuTimes | None) -> float | None:
    """Soft-interrupt share of the CPU time in ``times`` (None: not measured, or no tick elapsed)."""
    if times is None or times.total <= 0:
        return None
    return times.softirq / times.total

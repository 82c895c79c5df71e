"""How busy a host's CPUs were while an AllReduce ran: is the link or the CPU the bottleneck?

A benchmark of links is only about the links while the CPUs have time to spare. Gloo on CPU
tensors, TCP and (on the emulated cluster) the kernel's shaping all run on the host's cores; when
they are all busy, every algorithm waits for a core, and what the table shows is the machine.
So every timed iteration of ``stragglerkit bench`` reads the kernel's CPU counters
(``/proc/stat``, all cores together) after the barrier that starts it and after its AllReduce,
and each row reports the busiest host's share of busy time over its iterations (``cpu_busy``)
and the share spent in soft interrupts (``cpu_softirq``, mostly network processing). Rows from
``cpu_busy`` = 0.9 on are flagged under the table.

A busy share below 1 does not mean nobody waited for a core: the ranks wake in bursts. So every
rank also reads how long its own threads waited in the CPU's run queue (``run_delay`` of
``/proc/self/task/*/schedstat``, the scheduler's own account) over the same interval; each row
reports the median over iterations of the ranks' mean (``run_queue_wait_s``): CPU time a rank
was ready to use and did not get. Its threads are summed (gloo's, the executor's), so it can
exceed the iteration's time.

Only Linux has ``/proc/stat`` and schedstat; elsewhere the fields are ``None``. Reading them
costs about 50-200 us, outside the timed part of an iteration.

Example::

    before = CpuTimes.read()
    run_the_allreduce()
    used = CpuTimes.read() - before        # None-safe: see busy_share
    print(busy_share(used))                # e.g. 0.97
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["CPU_BOUND", "CpuTimes", "busy_share", "run_queue_wait_ns", "softirq_share"]

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


def run_queue_wait_ns(tasks: str = "/proc/self/task") -> int | None:
    """Nanoseconds this process's threads have waited in a run queue so far (the second field of
    each thread's ``schedstat``), or None where schedstat cannot be read. Threads that ended since
    the previous reading drop out, so compare readings around a span in which none ends."""
    try:
        names = os.listdir(tasks)
    except OSError:
        return None
    total, seen = 0, 0
    for name in names:
        try:
            with open(os.path.join(tasks, name, "schedstat"), encoding="ascii") as stat:
                fields = stat.read().split()
        except OSError:
            continue  # the thread ended meanwhile
        if len(fields) >= 2:
            total += int(fields[1])
            seen += 1
    return total if seen else None

"""CPU accounting shared by the benchmarks, from /proc (Linux).

The machines that run the benchmarks are small and often shared, so every
table says how much CPU the bench, the broker and everything else used.
"""

from __future__ import annotations

import os
from pathlib import Path


def host_cpu_seconds() -> float | None:
    """CPU seconds every process on the host has used (all CPUs), from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...: busy is everything but idle+iowait.
    ticks = [int(v) for v in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int | None) -> float | None:
    """User+system CPU seconds of ``pid`` (or this process), from /proc on Linux."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime and stime are fields 14 and 15 of stat; 12 and 13 after the ")".
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

"""How many CPUs this process may really use: its affinity mask and its cgroup CPU quota, not the
machine's core count (a container limited to 2 CPUs on a 64-core host, or a job pinned to a few
cores, would otherwise start one compute thread per host core and run several times slower)."""

from __future__ import annotations

import math
import os
from typing import Optional

#: the cgroup v2 file holding "QUOTA PERIOD" (or "max PERIOD") for this process's group
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def cgroup_cpu_limit(path: Optional[str] = None) -> Optional[float]:
    """The CPU quota of this process's cgroup in CPUs (quota / period) read from ``path`` (default
    :data:`CGROUP_CPU_MAX`), or ``None`` when there is none (no such file, ``max``, or anything
    unreadable or malformed)."""
    try:
        with open(path or CGROUP_CPU_MAX, encoding="ascii") as f:
            fields = f.read().split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    if not (quota > 0 and period > 0 and math.isfinite(quota) and math.isfinite(period)):
        return None
    return quota / period


def usable_cpus() -> int:
    """The CPUs this process may use, at least 1: those of its affinity mask
    (``os.sched_getaffinity``, else ``os.cpu_count()``), capped by the cgroup quota rounded up."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        n = min(n, math.ceil(limit))
    return max(1, n)


def default_threads(workers: int = 1) -> int:
    """Compute threads per worker when the user gave none: :func:`usable_cpus` shared out among
    ``workers`` processes, at least 1 each."""
    return max(1, usable_cpus() // max(1, int(workers)))

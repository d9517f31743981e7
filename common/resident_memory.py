"""The process's resident memory, for the `system/rss_mb` log key."""

from __future__ import annotations

import os
import resource


def rss_mb() -> float:
    """The process's current resident memory in MB (its peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

"""The process's resident memory, for the `system/rss_mb` log key."""

from __future__ import annotations

import os
import sys

try:
    import resource  # POSIX only
except ImportError:  # Windows
    resource = None


def rss_mb() -> float:
    """The process's current resident memory in MB (its peak where /proc is missing, NaN where
    neither is known)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        pass
    if resource is None:
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in bytes on macOS and in kilobytes on Linux and the BSDs.
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10

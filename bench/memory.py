"""The peak resident set of the running benchmark, in MB.

On Linux the figure is ``VmHWM`` of ``/proc/self/status``: the high-water mark of this process's own address
space since it was started. ``getrusage``'s ``ru_maxrss`` is not that there: it keeps the high-water mark of the
image the process was forked from, so a benchmark started by a large parent (a pytest worker that ran other tests
before) would report its parent's peak. Elsewhere ``ru_maxrss`` is the only figure there is.
"""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_mb"]


def peak_rss_mb() -> float:
    """This process's peak resident set in MB (2**20 bytes), imports included."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes on macOS, kB elsewhere

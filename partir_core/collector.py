"""Python's cyclic garbage collector, paused while partir_core partitions a program.

Partitioning makes no reference cycles worth collecting (the automatic search on the reference transformer
leaves none), but it makes many objects that live to its end (types, states, per-op choices, instructions), and
every allocation of that many objects triggers the collector's passes over all objects alive: at tens of
thousands of ops those passes are about a third of the time. :func:`collector_paused` turns the collector off
for a block and back to the caller's setting after it, whatever happens inside; the objects that reference
counting frees are freed as ever, and cycles made inside are collected by the collector's next pass after it.

Both paths pause it: :func:`partir_core.jit`'s lowering of a call (tracing, the tactics and propagation, the
per-op choice, lowering, and the pipelines tried around an automatic search), and
:func:`partir_core.automatic.search` when called alone.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off inside, and as it was before after (on or off: the caller's
    setting is restored, also when the block raises)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()

"""Python's cyclic garbage collector, paused for the length of a merge's or a diagnosis' work."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: reading traces, sidecars or Flight Recorder dumps makes
    millions of objects, none in a cycle, and every collection walks all that are still held and
    frees none. They go by reference counting; the collector resumes afterwards with the caller's
    own. Also a decorator (``@collector_paused()``), which resumes it once the function's own
    objects are gone: a collection on the way out would walk everything its frame still holds."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

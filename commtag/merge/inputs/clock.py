"""What a trace's times mean: its base time, an event's span in ns, a time as a user reads it."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from commtag.constants import TIME_NS_LIMIT
from commtag.merge.errors import MergeInputError


def checked_base_ns(path: Path, base: object) -> int:
    """A trace's baseTimeNanoseconds, which must be a time in int64 nanoseconds (an error naming the file)."""
    if base.__class__ is not int or not 0 <= base < TIME_NS_LIMIT:
        raise MergeInputError(path, f"baseTimeNanoseconds {base!r} is not a time in int64 nanoseconds")
    return base


def wall_clock(ns: int) -> str:
    """A CLOCK_REALTIME ns time as a user reads it in a message (UTC, to the second)."""
    return datetime.fromtimestamp(ns // 10**9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def base_ns(trace: dict) -> int:
    """What to add to ``ts * 1000`` for CLOCK_REALTIME ns (0 for old absolute traces)."""
    base = trace.get("baseTimeNanoseconds", 0)
    return base if isinstance(base, int) else 0


def event_ns(event: dict, base: int) -> tuple[int, int]:
    """Start and end of an X event in absolute ns (the writer's exact rounding: a float's own
    ``__round__``, which the builtin round() looks up on every call)."""
    t = event["ts"] * 1000
    start = (t if t.__class__ is int else t.__round__()) + base
    d = event.get("dur", 0) * 1000
    d = d if d.__class__ is int else d.__round__()
    return start, start + (d if d > 0 else 0)


#: How far before the earliest base time the origin lies: room for times a little before
#: their trace's start (a sidecar's recorded span). Events within 34 s of the origin take
#: 5-byte varints, and Kineto never records before its base time.
ORIGIN_MARGIN_NS = 10**9


def time_origin(files: Sequence[tuple[int, int]]) -> int:
    """The wall-clock ns every timestamp of the merged file counts from, given each file's
    ``(base time, its rank's clock offset)``.

    The same on every merge worker (from discovery and the offsets, which all
    workers share), so shards concatenate; 0 when a file's base time is not
    known from its first bytes.
    """
    if not files or any(base <= 0 for base, _ in files):
        return 0
    return max(0, min(base + offset for base, offset in files) - ORIGIN_MARGIN_NS)

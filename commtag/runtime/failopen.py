"""Fail-open bookkeeping: an error inside commtag is logged once per kind, then ignored.

A training job that runs for days must not drown in a warning per collective,
nor die because its profiling helper did; one log line per kind of failure
tells the user what went wrong while the job goes on as if commtag were absent.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("commtag")

_seen: set[tuple[str, str]] = set()
_lock = threading.Lock()


def log_once(where: str, exc: BaseException) -> None:
    """Log ``exc`` raised in ``where`` unless this (where, exception type) was logged before."""
    key = (where, type(exc).__name__)
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
    try:
        logger.warning("commtag: %s failed (%s: %s); continuing without it", where, type(exc).__name__, exc,
                       exc_info=exc)
    except Exception:  # noqa: BLE001 - a broken logging set-up must not break the job either
        pass


def reset() -> None:
    """Forget what was logged (tests)."""
    with _lock:
        _seen.clear()

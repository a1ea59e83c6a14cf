"""CUDA-graph capture bookkeeping (cuda-python is imported lazily).

The collective wrappers call :func:`before_collective` and
:func:`after_collective` around every call; both must cost next to nothing
when no capture is active, and must never raise.
"""

from __future__ import annotations

from typing import Optional

import torch

from commtag.schema import CollectiveAnnotation


def capture_active() -> bool:
    """True while the current CUDA stream is being captured into a graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def before_collective() -> Optional[object]:
    """Snapshot the capture graph before a collective; None when not capturing."""
    return None


def after_collective(token: Optional[object], annotation: CollectiveAnnotation) -> None:
    """Record the graph nodes the collective added since :func:`before_collective`."""

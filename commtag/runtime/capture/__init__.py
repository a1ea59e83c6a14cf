"""CUDA-graph capture bookkeeping: which graph nodes each collective created.

At replay a graphed NCCL kernel carries no metadata, so while a graph is
captured commtag notes, for every collective, the nodes it added to the
capture graph, and resolves them when the capture ends: creation index,
node type, kernel name, and the driver's tools id where it has one (13.1+).
Replays of the graph are logged (time, thread, replay index) so the merge
can tell which ``cudaGraphLaunch`` in a trace replayed which capture. The
bookkeeping itself is :class:`~commtag.runtime.capture.tracker.CaptureTracker`;
this module holds the process's one tracker, made at the first capture.

``torch.cuda.CUDAGraph.capture_begin``/``capture_end``/``replay`` are
hooked by :mod:`commtag.runtime.install.hooks`, which calls that tracker. While
a capture is open, collectives that never pass through the Python wrappers
are caught at the c10d operator level (:mod:`commtag.runtime.capture.c10d_ops`).

The collective wrappers call :func:`before_collective` and
:func:`after_collective` around every call made while a capture is open;
the idle path only tests :data:`OPEN_CAPTURES`. Nothing here raises into
the caller: without a GPU, a driver or cuda-python, everything is a no-op
(logged once).
"""

from __future__ import annotations

from typing import Any, Optional

from commtag.runtime.capture.graph_api import load_cuda_graph_api
from commtag.runtime.capture.torch_marks import load_torch_marks
from commtag.runtime.capture.tracker import OPEN_CAPTURES, CaptureTracker, CollectiveToken, OpenCapture
from commtag.runtime.failopen import log_once
from commtag.schema import CollectiveAnnotation, GraphCapture

_tracker: Optional[CaptureTracker] = None
_tracker_loaded = False


def get_tracker() -> Optional[CaptureTracker]:
    """The process's tracker, created on first capture (so install never touches CUDA)."""
    global _tracker, _tracker_loaded
    if not _tracker_loaded:
        _tracker_loaded = True
        api = load_cuda_graph_api()
        if api is not None:
            _tracker = CaptureTracker(api, marks=load_torch_marks())
    return _tracker


def tracker() -> Optional[CaptureTracker]:
    """The process's tracker if one was made (no loading: the hooks after the first capture)."""
    return _tracker


def use_tracker(tracker: Optional[CaptureTracker]) -> None:
    """Replace the process's tracker (tests inject one over a fake graph API)."""
    global _tracker, _tracker_loaded
    _tracker, _tracker_loaded = tracker, True


def reset_tracker() -> None:
    """Forget the tracker: the next capture loads the graph API again (tests)."""
    global _tracker, _tracker_loaded
    _tracker, _tracker_loaded = None, False


def abandon_all() -> list[OpenCapture]:
    """Forget every capture still open (commtag is being uninstalled); the captures forgotten."""
    opened = list(OPEN_CAPTURES.values())
    for capture in opened:
        if _tracker is not None:
            _tracker.abandon_capture(capture)
    OPEN_CAPTURES.clear()
    return opened


def current_stream() -> int:
    """The current CUDA stream as a cudaStream_t value.

    torch's raw-stream getter (what Inductor's generated code calls) where this torch has it:
    ``torch.cuda.current_stream()`` builds a Stream object on every captured collective."""
    import torch

    raw, device = getattr(torch._C, "_cuda_getCurrentRawStream", None), getattr(torch._C, "_cuda_getDevice", None)
    if raw is not None and device is not None:
        return int(raw(device()))
    return int(torch.cuda.current_stream().cuda_stream)


def capture_active() -> bool:
    """True while a capture commtag tracks is open in this process."""
    return bool(OPEN_CAPTURES)


def before_collective(marked: bool = True) -> Optional[CollectiveToken]:
    """Snapshot the capture graph before a collective; None when not capturing.

    The wrapper must pass the result to :func:`after_collective`. A non-None
    token means the call is being captured, not executed. ``marked``: hand the
    call to torch's mark_kernels too (False where several records share the
    token: one mark names one record, the node ids name all of them).
    """
    if not OPEN_CAPTURES:
        return None
    tracker = _tracker
    if tracker is None:
        return None
    try:
        token = tracker.begin_collective(current_stream(), marked=marked)
    except Exception as exc:  # noqa: BLE001 - fail open: this collective goes unrecorded, the capture proceeds
        log_once("snapshotting a capture graph", exc)
        return None
    if token is not None:
        tracker.set_wrapper_token(token)
    return token


def after_collective(token: Optional[CollectiveToken], annotation: CollectiveAnnotation | dict[str, Any]) -> None:
    """Record the graph nodes the collective added since :func:`before_collective`."""
    if token is None:
        return
    tracker = _tracker
    if tracker is None:
        return
    tracker.set_wrapper_token(None)
    try:
        tracker.end_collective(token, annotation)
    except Exception as exc:  # noqa: BLE001 - fail open: this collective goes unrecorded, the capture proceeds
        log_once("recording a captured collective", exc)


def captures_snapshot(since_ns: Optional[int] = None, until_ns: Optional[int] = None) -> list[GraphCapture]:
    """The rank's captures for its sidecar, with the replays inside the profiled window."""
    tracker = _tracker
    if tracker is None:
        return []
    try:
        return tracker.captures(since_ns, until_ns)
    except Exception as exc:  # noqa: BLE001 - fail open: the sidecar goes without captures
        log_once("listing CUDA-graph captures", exc)
        return []

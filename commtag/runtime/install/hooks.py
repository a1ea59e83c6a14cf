"""Everything commtag patches in torch, behind one install/uninstall pair and one lock.

Every hook is installed and removed together, under :data:`_lock`, so that
concurrent calls can never leave one part installed and another not:

* the ``torch.distributed`` collectives (both ``torch.distributed`` and
  ``distributed_c10d``, the same objects), wrapped by
  :func:`commtag.runtime.install.patch.wrapper_makers`;
* ``torch.cuda.CUDAGraph.capture_begin``/``capture_end``/``replay``, which
  open and close capture bookkeeping (:mod:`commtag.runtime.capture`) and log
  replays; every way of capturing that torch offers (``torch.cuda.graph``,
  ``make_graphed_callables``, Inductor's CUDA-graph trees) goes through them;
* while a capture is open, the dispatch mode that sees c10d operators called
  from C++ (:mod:`commtag.runtime.capture.c10d_ops`), pushed by the capture_begin
  hook and popped by the capture_end hook;
* c10d's ``_update_default_pg``, to count the lives of the world
  (:func:`commtag.runtime.describe.groups.watch_lives`);
* ``ProcessGroup.send``/``recv``/``recv_anysource``, to count the point-to-point
  ops that advance gloo's per-group count (:mod:`commtag.runtime.install.p2p_count`);
* on torch 2.15+, c10d's per-group pre/post hooks, for the calls no patched
  function sees (:mod:`commtag.runtime.install.c10d_hooks`).

On torch 2.14+ capture start and replays are told by torch's own
``torch.cuda.graphs.register_graph_*`` hooks instead of by wrapping
``CUDAGraph``; ``capture_end`` stays wrapped: torch runs its capture-end
hook only when ending the capture succeeded, and commtag must pop its
operator interception and forget the capture on the failing path too (else
every later collective of the thread would stay off the idle path).

The originals of the functions and CUDAGraph methods are kept here and put
back exactly (an inherited method is un-shadowed), and each replacement
carries ``__commtag_original__``; the default-group watcher keeps its own
(``__wrapped__``), and ProcessGroup's methods are put back by p2p_count. Nothing here touches CUDA at install: the capture tracker
is made on the first capture.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Optional

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commtag.runtime import capture
from commtag.runtime.capture import c10d_ops
from commtag.runtime.install import c10d_hooks, p2p_count, patch
from commtag.runtime.capture import CaptureTracker, CollectiveToken
from commtag.runtime.failopen import log_once
from commtag.runtime.install import inflight
from commtag.runtime.record import recorder, ring
from commtag.runtime.describe.groups import unwatch_lives, watch_lives
from commtag.runtime.describe.metadata import OPS
from commtag.schema import CollectiveAnnotation

#: Held by install and uninstall for their whole work (re-entrant: is_installed may be asked inside).
_lock = threading.RLock()
_installed = False
_MISSING = object()
#: name -> (object in distributed_c10d, object in torch.distributed or _MISSING) before install.
_functions: dict[str, tuple[Any, Any]] = {}
#: name -> (original, describer, wrapper or None: left in place) of the last install: installing
#: again over the same original and describer reuses the wrapper (no bytecode reading, no new
#: objects), so an install costs what an uninstall does.
_built: dict[str, tuple[Any, Any, Optional[Callable[..., Any]]]] = {}
#: CUDAGraph method name -> its own entry in the class dict before install (None: inherited).
_graph_methods: dict[str, Any] = {}
#: Handles of the torch.cuda.graphs hooks the current install registered (torch 2.14+).
_graph_handles: list[Any] = []
#: False once uninstalled: a registered graph hook that outlives its handle does nothing.
_graph_hooks_live = False
#: (id of a CUDAGraph, thread) -> when its replay started, between torch's replay hooks.
_replay_starts: dict[tuple[int, int], int] = {}


def install() -> None:
    """Patch the collectives and hook CUDA-graph capture (idempotent, thread-safe, before or after
    init_process_group)."""
    global _installed
    with _lock:
        if _installed:
            return
        watch_lives()
        _patch_functions()
        p2p_count.attach()
        _hook_cuda_graph()
        c10d_hooks.attach_all()
        _installed = True
        recorder.note_installed(True)


def uninstall() -> None:
    """Put back the exact original objects (idempotent, thread-safe).

    A capture still open loses its bookkeeping: its capture_end is torch's
    own from now on, so its operator interception is made inert here and
    the collectives' idle path is not held back by it.
    """
    global _installed
    with _lock:
        recorder.note_installed(False)
        _restore_functions()
        p2p_count.detach()
        c10d_hooks.detach_all()
        _unhook_cuda_graph()
        unwatch_lives()
        _installed = False


def is_installed() -> bool:
    """True between :func:`install` and :func:`uninstall` (never while either is half done)."""
    with _lock:
        return _installed


def patched_names() -> list[str]:
    """The torch.distributed functions the current install replaced (benchmarks swap them)."""
    with _lock:
        return sorted(_functions)


# ---------------------------------------------------------------------- collectives


def _patch_functions() -> None:
    for name, make in patch.wrapper_makers().items():
        original = getattr(c10d, name, None)
        if original is None:
            continue
        public = dist.__dict__.get(name, _MISSING)
        built = _built.get(name)
        if built is not None and built[0] is original and built[1] is OPS.get(name):
            wrapper = built[2]
        else:
            wrapper = make(original)
            _built[name] = (original, OPS.get(name), wrapper)
        if wrapper is None:
            continue
        _functions[name] = (original, public)
        setattr(c10d, name, wrapper)
        if public is original:
            setattr(dist, name, wrapper)


def _restore_functions() -> None:
    for name, (original, public) in _functions.items():
        setattr(c10d, name, original)
        if public is original:
            setattr(dist, name, original)
    _functions.clear()


# ---------------------------------------------------------------------- CUDA graphs


def _hook_cuda_graph() -> None:
    try:
        from torch.cuda import graphs
        from torch.cuda.graphs import CUDAGraph
    except Exception as exc:  # noqa: BLE001 - fail open: no CUDAGraph to hook, collectives still annotated
        log_once("hooking torch.cuda.CUDAGraph", exc)
        return
    wrapped: tuple[tuple[str, Callable[[Callable[..., Any]], Callable[..., Any]]], ...] = (("capture_end", capture_end_hook),)
    if not _register_graph_hooks(graphs):
        wrapped = (("capture_begin", capture_begin_hook), *wrapped, ("replay", replay_hook))
    for name, wrap in wrapped:
        own = CUDAGraph.__dict__.get(name)
        _graph_methods[name] = own
        hook = wrap(own if own is not None else getattr(CUDAGraph, name))
        hook.__commtag_original__ = own  # type: ignore[attr-defined]
        setattr(CUDAGraph, name, hook)


def _unhook_cuda_graph() -> None:
    """Restore CUDAGraph's methods exactly as they were (an inherited one is un-shadowed), remove
    torch's graph hooks commtag registered, and forget captures still open, their operator
    interception made inert."""
    global _graph_hooks_live
    _graph_hooks_live = False
    for handle in _graph_handles:
        try:
            handle.remove()
        except Exception as exc:  # noqa: BLE001 - a hook that cannot be removed stays, inert
            log_once("removing a CUDA-graph hook", exc)
    _graph_handles.clear()
    _replay_starts.clear()
    if not _graph_methods:
        return
    from torch.cuda.graphs import CUDAGraph

    for name, own in _graph_methods.items():
        if own is None:
            delattr(CUDAGraph, name)
        else:
            setattr(CUDAGraph, name, own)
    _graph_methods.clear()
    for opened in capture.abandon_all():
        if opened.interceptor is not None:
            opened.interceptor.enabled = False


def _register_graph_hooks(graphs: Any) -> bool:
    """Register capture-start and replay hooks with torch (2.14+); False where torch has none."""
    global _graph_hooks_live
    names = ("register_graph_capture_start_hook", "register_graph_replay_start_hook",
             "register_graph_replay_end_hook")
    registers: list[Any] = [getattr(graphs, name, None) for name in names]  # torch's functions, or None
    if not all(callable(register) for register in registers):
        return False
    _graph_hooks_live = True
    for register, hook in zip(registers, (_on_capture_start, _on_replay_start, _on_replay_end)):
        _graph_handles.append(register(hook))
    return True


def _open_capture(graph: Any) -> None:
    """A capture of ``graph`` has just begun on this thread: open its bookkeeping and push the c10d
    operator interception."""
    try:
        tracker = capture.get_tracker()
        if tracker is not None:
            tracker.forget_owner(graph)
            opened = tracker.begin_capture(graph, capture.current_stream())
            if opened is not None:
                opened.interceptor = c10d_ops.activate(TrackerSink(tracker))
    except Exception as exc:  # noqa: BLE001 - fail open: the capture goes on unannotated
        log_once("starting capture bookkeeping", exc)


def _on_capture_start(graph: Any) -> None:
    """torch's capture-start hook (the capture is live; nothing here issues CUDA work)."""
    if _graph_hooks_live:
        _open_capture(graph)


def _on_replay_start(graph: Any) -> None:
    tracker = capture.tracker()
    if _graph_hooks_live and tracker is not None and id(graph) in tracker.owner_captures:
        _keep_replay(tracker, graph)  # torch's replay-end hook cannot say whether the launch raised
        _replay_starts[(id(graph), threading.get_native_id())] = time.time_ns()


def _on_replay_end(graph: Any) -> None:
    """torch's replay-end hook: runs once the replay is enqueued, even if the launch raised."""
    start = _replay_starts.pop((id(graph), threading.get_native_id()), None) if _replay_starts else None
    tracker = capture.tracker()
    if start is None or tracker is None:
        return
    try:
        tracker.record_replay(graph, start, time.time_ns(), threading.get_native_id())
    except Exception as exc:  # noqa: BLE001 - fail open: this replay stays unlogged
        log_once("logging a graph replay", exc)


def _keep_replay(tracker: CaptureTracker, graph: Any) -> list[ring.Replayed]:
    """Where commtag's flight recorder is on: keep the captured collectives of the replay of ``graph``
    about to start, with their capture Seq and this replay's index (so a rank stuck in it says so)."""
    kept = ring.RING
    if kept is None:
        return []
    try:
        found = tracker.replayed_calls(graph)
        return [] if found is None else kept.replay_started(found[1], found[0], inflight.thread_state())
    except Exception as exc:  # noqa: BLE001 - fail open: this replay stays out of the ring
        log_once("keeping a graph replay in the flight recorder", exc)
        return []


def _replay_failed(kept: list[ring.Replayed], error: BaseException) -> None:
    """The launch of a replay whose calls the flight recorder keeps raised: they failed (dumped)."""
    if not kept:
        return
    try:
        ring.replay_failed(kept, inflight.error_text(error))
    except Exception as exc:  # noqa: BLE001 - fail open: the job's own exception goes on unchanged
        log_once("keeping a graph replay in the flight recorder", exc)


def capture_begin_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """CUDAGraph.capture_begin (torch before 2.14): after torch's own, open the capture's bookkeeping."""

    @functools.wraps(original)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        _open_capture(self)
        return result

    return capture_begin


def capture_end_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """CUDAGraph.capture_end: pop the interception, resolve the capture's nodes around torch's own
    capture_end (whose errors reach the caller unchanged)."""

    @functools.wraps(original)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = capture.tracker()
        opened = tracker.open_capture(self) if tracker is not None else None
        if opened is None or tracker is None:
            return original(self, *args, **kwargs)
        if opened.interceptor is not None:
            c10d_ops.deactivate(opened.interceptor)
        results: list[Any] = []
        tracker.end_capture(
            self,
            lambda: results.append(original(self, *args, **kwargs)),
            lambda: _exec_handle(self),
        )
        return results[0] if results else None

    return capture_end


def replay_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    """CUDAGraph.replay (torch before 2.14): log the replay (time, thread) of a graph whose capture
    commtag recorded."""

    @functools.wraps(original)
    def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker = capture.tracker()
        if tracker is None or id(self) not in tracker.owner_captures:
            return original(self, *args, **kwargs)
        kept = _keep_replay(tracker, self)
        start = time.time_ns()
        try:
            return original(self, *args, **kwargs)
        except Exception as exc:
            _replay_failed(kept, exc)
            raise
        finally:
            try:
                tracker.record_replay(self, start, time.time_ns(), threading.get_native_id())
            except Exception as exc:  # noqa: BLE001 - fail open: this replay stays unlogged
                log_once("logging a graph replay", exc)

    return replay


def _exec_handle(graph: Any) -> int:
    getter = getattr(graph, "raw_cuda_graph_exec", None)
    return int(getter()) if getter is not None else 0


class TrackerSink:
    """Connects operator-level interception to the tracker (see c10d_ops.OpSink)."""

    def __init__(self, tracker: CaptureTracker) -> None:
        self.tracker = tracker

    def wrapper_token(self) -> Optional[CollectiveToken]:
        return self.tracker.wrapper_token

    def begin(self) -> Optional[CollectiveToken]:
        return self.tracker.begin_collective(capture.current_stream(), source="c10d-op")

    def end(self, token: CollectiveToken, annotation: CollectiveAnnotation, reduce_op: Optional[str]) -> None:
        token.reduce_op = reduce_op
        self.tracker.end_collective(token, annotation)

"""A wrapped call between its numbering and its record: per-thread state, the pending call, and
the halves every wrapper shares (before the original: number and describe; after it: hand the
annotation to capture and the call to the recorder).

The wrappers (:mod:`commtag.runtime.install.patch`, :mod:`commtag.runtime.install.grouped`) and
c10d's own hooks (:mod:`commtag.runtime.install.c10d_hooks`) all end a call here, so a call is
recorded the same way whichever path saw it. Nothing here raises into the caller.
"""

from __future__ import annotations

import atexit
import functools
import threading
import time
from typing import Any, Callable, Optional

import torch

from commtag.runtime import capture
from commtag.runtime.describe.calls import CallRecord, OpCall, reduce_name
from commtag.runtime.describe.groups import GroupState
from commtag.runtime.failopen import log_once
from commtag.runtime.record import recorder, ring
from commtag.runtime.record.recorder import profiler_enabled
from commtag.vocab import RECV, SEND

_IN_FLIGHT = recorder.IN_FLIGHT
_now_ns = now_ns = time.time_ns

#: Completion callbacks commtag put on works' futures that have not run yet, under ``_callbacks_lock``.
_callbacks_waiting = 0
_callbacks_lock = threading.Lock()
#: The longest the interpreter's exit waits for them (torch's own exit waits for the same works).
EXIT_WAIT_S = 300.0
#: After the last callback counted itself done, how long its thread is given to leave it (return to
#: C++, drop its references) before the interpreter ends threads: only when a callback was pending.
EXIT_GRACE_S = 0.05


class ThreadState:
    """Per-thread bits, a plain object: one thread-local read per call, then slot reads and writes
    (attributes of a threading.local cost ~40 ns each to read and ~90 ns to write)."""

    __slots__ = ("depth", "blocks", "tid", "thread_name")

    def __init__(self) -> None:
        #: > 0 while this thread runs an original collective on the slow path: calls it
        #: makes itself (batch_isend_irecv -> _coalescing_manager, __torch_function__
        #: dispatch calling the op again) are torch's own and must not be counted twice.
        #: The fast path never reads it: it is only taken when no such inner call can
        #: follow (see commtag.runtime.install.idle.more_slow and commtag.runtime.install.reentry).
        self.depth = 0
        #: Open coalescing-manager blocks of this thread (None: never opened one).
        self.blocks: Optional[list[Block]] = None
        #: The thread id as Kineto writes it for CPU ops (gettid), cached: the call costs ~200 ns.
        self.tid = threading.get_native_id()
        self.thread_name = threading.current_thread().name


tls = threading.local()


def thread_state() -> ThreadState:
    try:
        return tls.state
    except AttributeError:
        state = tls.state = ThreadState()
        return state


class Pending(CallRecord):
    """A call commtag will annotate once the original returns."""

    __slots__ = ("recording", "token", "slot")

    def __init__(self, call: OpCall, seq: int, pair_seq: Optional[int], recording: bool, token: Any,
                 thread: ThreadState) -> None:
        # CallRecord.__init__ inlined: a frame fewer on every recorded call.
        self.call = call
        self.seq = seq
        self.pair_seq = pair_seq
        self.tid = thread.tid
        self.thread_name = thread.thread_name
        self.start_ns = _now_ns()
        self.error = None
        self.recording = recording
        self.token = token
        kept = ring.RING  # commtag's own flight recorder, where install(dump_dir=...) turned it on
        self.slot = None if kept is None else kept.start(self)
        if recording:  # until recorder.add: a window that ends first writes it as unfinished
            _IN_FLIGHT[id(self)] = self


class Block:
    """One open coalescing-manager block of this thread."""

    __slots__ = ("state", "device_given", "calls", "seq", "start_ns")

    def __init__(self, state: GroupState, device_given: bool) -> None:
        self.state = state
        self.device_given = device_given
        self.calls: list[OpCall] = []
        self.seq: Optional[int] = None
        self.start_ns = _now_ns()

    def block_seq(self) -> int:
        """The block's one collective Seq, taken when its first collective arrives."""
        if self.seq is None:
            self.seq = self.state.next_collective_seq(already_bumped=self.device_given)
        return self.seq


def open_block(state: GroupState, thread: ThreadState) -> Optional[Block]:
    for block in thread.blocks or ():
        if block.state is state:
            return block
    return None


# ---------------------------------------------------------------------------
# The shared before/after halves.


def start_call(call: OpCall, thread: ThreadState) -> Optional[Pending]:
    """Number a described call (p2p, or inside a coalescing block)."""
    state = call.state
    pair_seq = None
    if call.p2p is not None:
        seq = state.next_p2p_seq()
        if call.peer is not None:
            pair_seq = next_pair_seq(state, call)
    else:
        block = open_block(state, thread)
        if block is not None:
            seq = block.block_seq()
            if call.fusable:
                # Runs later as one fused collective: annotated when the block closes.
                block.calls.append(call)
                return None
        else:
            seq = state.next_collective_seq()
    recording = profiler_enabled()
    token = capture.before_collective()
    if (not recording and token is None and ring.RING is None
            and not (call.p2p is not None and call.peer is None)):
        return None  # (a recv from any source still counts its pair Seq once its source is known)
    return Pending(call, seq, pair_seq, recording, token, thread)


def next_pair_seq(state: GroupState, call: OpCall) -> int:
    assert call.peer is not None, "a recv from any source is numbered once its source is known"
    own = state.ranks[state.group_rank]
    src, dst = (own, call.peer) if call.p2p == SEND else (call.peer, own)
    return state.next_pair_seq(src, dst)


def finish_call(pending: Pending, work: Any) -> None:
    """Hand the annotation to capture and, while profiling, the call itself to the recorder
    (which builds its fields only when the sidecar is written)."""
    if pending.slot is not None:
        ring.finish(pending.slot, pending.error, future_of(work) if pending.call.async_op else None)
    if pending.token is not None:
        if pending.token.reduce_op is None:
            pending.token.reduce_op = reduce_name(pending.call.reduce_op)
        pending.token.kept = (pending.call, pending.seq)
        capture.after_collective(pending.token, pending.annotation_fields())
        pending.token = None  # its graph snapshot is not kept with the recorded call
    if not pending.recording:
        return
    record_when_done(pending, future_of(work) if pending.call.async_op else None)


def record_when_done(pending: Pending, future: Any) -> None:
    """Hand the call to the recorder when ``future`` completes, or now (no future)."""
    if future is not None:
        # The annotation covers the work until it completes, without touching the Work object.
        # The callback runs on the thread that completed the work (a gloo worker, inside its
        # work's event), or here if it completed already: that thread is the work's identity.
        def done(fut: Any, pending=pending) -> None:
            try:
                end_ns = _now_ns()
                try:
                    fut.value()
                except Exception as exc:  # noqa: BLE001 - the work failed (a timeout, a peer gone): say so
                    pending.error = error_text(exc)
                recorder.add(pending, end_ns, threading.get_native_id())
            finally:
                _callback_done(1)

        _callback_done(-1)
        try:
            future.add_done_callback(done)
        except BaseException:
            _callback_done(1)
            raise
    else:
        recorder.add(pending, _now_ns())


def _callback_done(ran: int) -> None:
    """One callback more waiting (-1) or one fewer (1)."""
    global _callbacks_waiting
    with _callbacks_lock:
        _callbacks_waiting -= ran


def wait_for_callbacks(limit_s: float = EXIT_WAIT_S) -> int:
    """Run at the interpreter's exit (atexit): wait, the GIL released, until every completion
    callback commtag registered has run, at most ``limit_s``; how many had not.

    A callback is Python, run on the thread that completes the work (a gloo
    worker), which must take the GIL. A work still running when the script
    returns (an async call never waited, or one whose callback runs just after
    ``wait()`` returned: a future wakes its waiters before it runs its
    callbacks) completes while the interpreter shuts down, when CPython ends a
    thread that asks for the GIL with ``pthread_exit``; unwinding a C++ worker
    that way aborts the process ("terminate called without an active
    exception"). torch's own exit waits for those works anyway (the gloo
    group's destructor drains its queue), so waiting here first costs no time.
    """
    deadline = time.monotonic() + limit_s
    waited = _callbacks_waiting > 0
    while _callbacks_waiting > 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    if waited:  # the count drops inside the callback: let its thread return out of it before shutdown
        time.sleep(EXIT_GRACE_S)
    return max(_callbacks_waiting, 0)


atexit.register(wait_for_callbacks)


def error_text(exc: BaseException) -> str:
    """"commtag error" of a failed call: the exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def record_failed(pending: Optional[Pending], exc: BaseException) -> None:
    """Record a call whose original raised, with what failed (the caller still gets the exception)."""
    if pending is None:
        return
    try:
        pending.error = error_text(exc)
        finish_call(pending, None)
    except Exception as inner:  # noqa: BLE001 - fail open
        log_once("annotating a failed collective", inner)


def ring_failed(kept: Optional[ring.Kept], exc: BaseException) -> None:
    """End a call only the ring keeps whose original raised, with what failed (which writes the dump)."""
    if kept is None:
        return
    try:
        ring.finish(kept, error_text(exc), None)
    except Exception as inner:  # noqa: BLE001 - fail open
        log_once("keeping a failed collective in the ring", inner)


def ring_ended(kept: ring.Kept, work: Any) -> None:
    """An async call only the ring keeps: it ends when its work's future completes."""
    try:
        ring.finish(kept, None, future_of(work))
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("keeping a collective in the ring", exc)


def future_of(work: Any) -> Any:
    """The work's completion future; None where the backend has none (gloo send/recv,
    reduce_scatter). all_reduce_coalesced returns the future itself."""
    if isinstance(work, torch._C.Future):
        return work
    if work is None or not hasattr(work, "get_future"):
        return None
    try:
        return work.get_future()
    except RuntimeError:
        return None


def after_call(pending: Optional[Pending], result: Any) -> None:
    if pending is None:
        return
    try:
        if pending.call.p2p == RECV and pending.call.peer is None and isinstance(result, int) and result >= 0:
            # recv from any source: the peer is only known now.
            pending.call.peer = result
            pending.call.rank = pending.call.state.ranks.index(result)
            pending.pair_seq = next_pair_seq(pending.call.state, pending.call)
        finish_call(pending, result if pending.call.async_op else None)
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("annotating a collective", exc)



def unseen(describe: Callable[..., Optional[OpCall]]) -> Callable[..., Optional[OpCall]]:
    """``describe`` run where no ``__torch_function__`` sees it: its reads of the caller's tensors
    (numel, dtype, is_complex) are no calls the job made, so a user's TorchFunctionMode or tensor
    subclass must not be handed them (a mode that acts on each call, e.g. stops the profiler,
    would act on commtag's reads)."""

    @functools.wraps(describe)
    def unseen(*args: Any, **kwargs: Any) -> Optional[OpCall]:
        with torch._C.DisableTorchFunction():
            return describe(*args, **kwargs)

    return unseen



# ---------------------------------------------------------------------------
# Calls c10d's own hooks saw (commtag.runtime.install.c10d_hooks).


def inside_wrapper() -> bool:
    """Is this thread inside a patched function or a coalescing block it opened? Then the call
    c10d is issuing is that wrapper's to record."""
    thread = thread_state()
    return bool(thread.depth or thread.blocks)


def pair_seq_of(call: OpCall) -> Optional[int]:
    """The pair Seq of a p2p call whose peer is known (takes one)."""
    return next_pair_seq(call.state, call) if call.peer is not None else None


def issuing(call: OpCall, seq: int, pair_seq: Optional[int]) -> Pending:
    """A call about to be issued outside every wrapper (its start is now)."""
    return Pending(call, seq, pair_seq, True, None, thread_state())


def record_issued(pending: Pending, work: Any) -> None:
    """Record a call :func:`issuing` began once it is issued: it ends when its work completes
    (where the work has a future, whether or not the caller waits on it), else now."""
    future = future_of(work)
    if pending.slot is not None:
        ring.finish(pending.slot, None, future)
    record_when_done(pending, future)


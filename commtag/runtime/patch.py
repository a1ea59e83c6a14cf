"""The collective wrappers (installed and removed by :mod:`commtag.runtime.hooks`).

Every wrapper follows one shape::

    pending = <number, and describe if annotated>   # commtag's work; never raises
    result = original(*args, **kwargs)   # exactly once, user's own arguments
    _after(pending, result)              # commtag's work; never raises
    return result                        # the original object, untouched

so an error inside commtag is logged once (see failopen) and the collective
runs as if commtag were absent, while an error raised by the collective
itself reaches the caller unchanged. A call commtag could not describe is
logged only if the original then accepts it: a call torch rejects is the
caller's mistake, and torch's own error is all the caller sees.

Patched: the functions in metadata.OPS plus ``batch_isend_irecv`` and
``_coalescing_manager``, in both ``torch.distributed`` and
``torch.distributed.distributed_c10d`` (the same objects), except an op whose
original only calls another patched op with the same describer
(``all_gather_into_tensor`` -> ``all_gather_single``): it stays as it is,
and the inner wrapper numbers and annotates the call. ``isend`` and
``irecv`` are never replaced: ``P2POp`` checks them by identity. Code that
imported a function by name before :func:`commtag.install` keeps the original
and is not annotated.

Two paths. The **idle fast path** runs while nothing could record: no
Python-started profiler (``torch.autograd.profiler._is_profiler_enabled``,
which torch.profiler and torch.autograd.profiler set for every session,
``profile_all_threads`` included), no capture open, no coalescing block open,
not compiling, and no slow-path call in flight whose original may call a
wrapper again (:func:`commtag.runtime.idle.more_slow`); that test is
:data:`commtag.runtime.idle.IDLE_GATE`, written once. It only numbers a
plain collective on its group's counter (no thread-local state, no
description) and calls the original; it is a function generated per op
from one template (:func:`commtag.runtime.idle.idle_entry`), with the
original's parameters where they can be copied, so no ``*args, **kwargs``
are packed, and it calls the body inside torch's ``_exception_logger``
positionally (a frame fewer).
That decorator reads ``group=`` from the keywords when a call fails, so the
entry keeps a group given by position apart from ``group=`` and hands every
failing or unusual call on with the caller's own split. A
profiler started from C++ alone (the legacy autograd profiler, Kineto
on-demand) is not noticed there: its trace never reaches
:func:`commtag.trace_handler`, so nothing commtag recorded could be written.
Everything else takes the **slow path**: per-thread depth (calls torch makes
from inside a collective are not numbered twice), description, recording and
capture bookkeeping. Which originals may call a wrapper again is read from
torch's code at install (:mod:`commtag.runtime.reentry`): ops that only
delegate to another patched op are left in place (above); ops whose
original cannot be read always take the slow path. Seq comes out the same on
either path.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Any, Callable, Optional

import torch
from torch.distributed import distributed_c10d as c10d

from commtag.runtime import c10d_ops, capture, recorder, reentry
from commtag.runtime.idle import (
    c10d_world,
    compiler,
    has_torch_function,
    idle_entry,
    is_dynamo_compiling,
    less_slow,
    more_slow,
)
from commtag.runtime.failopen import log_once
from commtag.runtime.calls import CallRecord, OpCall, reduce_name
from commtag.runtime.capture import OPEN_CAPTURES
from commtag.runtime.groups import GLOO_INNER_P2P, GROUP_STATES, GroupState, lookup, state_for
from commtag.runtime.recorder import autograd_profiler, thread_profiled
from commtag.runtime.metadata import COALESCED_NAMES, GROUP_INDEX, OPS, P2P_OPS
from commtag.runtime.metadata import p2p_call as _p2p_call
from commtag.identity import format_list
from commtag.vocab import NCCL2_BATCH_P2P, NCCL2_FORMAT, RECV, SEND

_profiler_enabled: Callable[[], bool] = recorder.profiler_enabled
_IN_FLIGHT = recorder.IN_FLIGHT
_now_ns = time.time_ns

class _ThreadState:
    """Per-thread bits, a plain object: one thread-local read per call, then slot reads and writes
    (attributes of a threading.local cost ~40 ns each to read and ~90 ns to write)."""

    __slots__ = ("depth", "blocks", "tid", "thread_name")

    def __init__(self) -> None:
        #: > 0 while this thread runs an original collective on the slow path: calls it
        #: makes itself (batch_isend_irecv -> _coalescing_manager, __torch_function__
        #: dispatch calling the op again) are torch's own and must not be counted twice.
        #: The fast path never reads it: it is only taken when no such inner call can
        #: follow (see commtag.runtime.idle.more_slow and commtag.runtime.reentry).
        self.depth = 0
        #: Open coalescing-manager blocks of this thread (None: never opened one).
        self.blocks: Optional[list[_Block]] = None
        #: The thread id as Kineto writes it for CPU ops (gettid), cached: the call costs ~200 ns.
        self.tid = threading.get_native_id()
        self.thread_name = threading.current_thread().name


_tls = threading.local()


def _thread_state() -> _ThreadState:
    try:
        return _tls.state
    except AttributeError:
        state = _tls.state = _ThreadState()
        return state


class _Pending(CallRecord):
    """A call commtag will annotate once the original returns."""

    __slots__ = ("recording", "token")

    def __init__(self, call: OpCall, seq: int, pair_seq: Optional[int], recording: bool, token: Any,
                 thread: _ThreadState) -> None:
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
        if recording:  # until recorder.add: a window that ends first writes it as unfinished
            _IN_FLIGHT[id(self)] = self


class _Block:
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


def _open_block(state: GroupState, thread: _ThreadState) -> Optional[_Block]:
    for block in thread.blocks or ():
        if block.state is state:
            return block
    return None


# ---------------------------------------------------------------------------
# The shared before/after halves.


def _start(call: OpCall, thread: _ThreadState) -> Optional[_Pending]:
    """Number a described call (p2p, or inside a coalescing block)."""
    state = call.state
    pair_seq = None
    if call.p2p is not None:
        seq = state.next_p2p_seq()
        if call.peer is not None:
            pair_seq = _pair_seq(state, call)
    else:
        block = _open_block(state, thread)
        if block is not None:
            seq = block.block_seq()
            if call.fusable:
                # Runs later as one fused collective: annotated when the block closes.
                block.calls.append(call)
                return None
        else:
            seq = state.next_collective_seq()
    recording = _profiler_enabled()
    token = capture.before_collective()
    if not recording and token is None and not (call.p2p is not None and call.peer is None):
        return None  # (a recv from any source still counts its pair Seq once its source is known)
    return _Pending(call, seq, pair_seq, recording, token, thread)


def _pair_seq(state: GroupState, call: OpCall) -> int:
    own = state.ranks[state.group_rank]
    src, dst = (own, call.peer) if call.p2p == SEND else (call.peer, own)
    return state.next_pair_seq(src, dst)


def _finish(pending: _Pending, work: Any) -> None:
    """Hand the annotation to capture and, while profiling, the call itself to the recorder
    (which builds its fields only when the sidecar is written)."""
    if pending.token is not None:
        if pending.token.reduce_op is None:
            pending.token.reduce_op = reduce_name(pending.call.reduce_op)
        capture.after_collective(pending.token, pending.annotation_fields())
        pending.token = None  # its graph snapshot is not kept with the recorded call
    if not pending.recording:
        return
    _record_when_done(pending, _future_of(work) if pending.call.async_op else None)


def _record_when_done(pending: _Pending, future: Any) -> None:
    """Hand the call to the recorder when ``future`` completes, or now (no future)."""
    if future is not None:
        # The annotation covers the work until it completes, without touching the Work object.
        # The callback runs on the thread that completed the work (a gloo worker, inside its
        # work's event), or here if it completed already: that thread is the work's identity.
        def done(fut: Any, pending=pending) -> None:
            end_ns = _now_ns()
            try:
                fut.value()
            except Exception as exc:  # noqa: BLE001 - the work failed (a timeout, a peer gone): say so
                pending.error = _error_text(exc)
            recorder.add(pending, end_ns, threading.get_native_id())

        future.add_done_callback(done)
    else:
        recorder.add(pending, _now_ns())


def _error_text(exc: BaseException) -> str:
    """"commtag error" of a failed call: the exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _failed(pending: Optional[_Pending], exc: BaseException) -> None:
    """Record a call whose original raised, with what failed (the caller still gets the exception)."""
    if pending is None:
        return
    try:
        pending.error = _error_text(exc)
        _finish(pending, None)
    except Exception as inner:  # noqa: BLE001 - fail open
        log_once("annotating a failed collective", inner)


def _future_of(work: Any) -> Any:
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


def _after(pending: Optional[_Pending], result: Any) -> None:
    if pending is None:
        return
    try:
        if pending.call.p2p == RECV and pending.call.peer is None and isinstance(result, int) and result >= 0:
            # recv from any source: the peer is only known now.
            pending.call.peer = result
            pending.call.rank = pending.call.state.ranks.index(result)
            pending.pair_seq = _pair_seq(pending.call.state, pending.call)
        _finish(pending, result if pending.call.async_op else None)
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("annotating a collective", exc)


# ---------------------------------------------------------------------------
# Wrappers.


def _unseen(describe: Callable[..., Optional[OpCall]]) -> Callable[..., Optional[OpCall]]:
    """``describe`` run where no ``__torch_function__`` sees it: its reads of the caller's tensors
    (numel, dtype, is_complex) are no calls the job made, so a user's TorchFunctionMode or tensor
    subclass must not be handed them (a mode that acts on each call, e.g. stops the profiler,
    would act on commtag's reads)."""

    @functools.wraps(describe)
    def unseen(*args: Any, **kwargs: Any) -> Optional[OpCall]:
        with torch._C.DisableTorchFunction():
            return describe(*args, **kwargs)

    return unseen


p2p_call = _unseen(_p2p_call)


def _wrap(original: Callable[..., Any], name: str, shape: reentry.Shape) -> Optional[Callable[..., Any]]:
    """The wrapper of op ``name``, or None where the original is better left in place."""
    describe = _unseen(OPS[name])
    group_index = GROUP_INDEX[name]
    p2p = name in P2P_OPS
    #: May take the idle fast path (a plain collective: p2p, unreadable ops and those whose gloo
    #: count is measured never do).
    measured = name in GLOO_INNER_P2P
    fast = not p2p and not measured and shape.kind == reentry.PLAIN
    #: The original's code could not be read: any call may re-enter a wrapper.
    unknown = shape.kind == reentry.UNKNOWN
    #: The original dispatches to __torch_function__ on its positional argument tf_index.
    tf_index = shape.tf_index if shape.tf_index is not None else 0
    dispatch = shape.tf_index is not None
    if shape.kind == reentry.NESTING:
        # The original is one call of another patched op (all_gather_into_tensor ->
        # all_gather_single) with the same describer: that inner wrapper numbers, describes,
        # records and steps aside under compile, on every path. A wrapper here could only
        # pass the call through, at a frame's cost on every call: the original stays.
        return None

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # The slow path (an op's idle entry hands every call here that it does not run itself):
        # depth, numbering, description, recording, capture bookkeeping. Dynamo folds
        # is_dynamo_compiling() to True, so a traced call reads no other flag (each would
        # become a guard). The original is always called with the caller's own split.
        if is_dynamo_compiling() or compiler._is_compiling_flag:
            return original(*args, **kwargs)
        try:
            thread = _tls.state
        except AttributeError:
            thread = _thread_state()
        if thread.depth:
            return original(*args, **kwargs)
        pending = None
        reentrant = True
        #: The group of a p2p call (its gloo count advances once), and of a call whose advance is
        #: measured, with the count before it.
        p2p_state: Optional[GroupState] = None
        before: Optional[tuple[GroupState, int]] = None
        #: What went wrong describing the call: logged only if the original accepts the call
        #: (a call torch rejects is the caller's mistake, and torch's error says so).
        failure = None
        try:
            if p2p or thread.blocks:
                call = describe(*args, **kwargs)
                pending = None if call is None else _start(call, thread)
                if p2p and call is not None:
                    p2p_state = call.state
            else:
                # A plain collective needs only its group to be numbered; it is described
                # only when it will be annotated.
                group = kwargs["group"] if "group" in kwargs else (args[group_index] if len(args) > group_index else None)
                state = GROUP_STATES.get(c10d_world._default_pg if group is None else group) or lookup(group)
                if state is not None:
                    if measured and state.gloo is not None:
                        before = (state, state.gloo_count())
                    seq = state.next_collective_seq()
                    recording = thread_profiled() or autograd_profiler._is_profiler_enabled
                    token = capture.before_collective() if OPEN_CAPTURES else None
                    if recording or token is not None:
                        call = describe(*args, **kwargs)
                        if call is not None:
                            pending = _Pending(call, seq, None, recording, token, thread)
            # Can the original call a wrapper again? Then every thread's calls take this
            # path until it returns, so the inner call meets this thread's depth (and is
            # skipped) even if the profiler stops in between.
            reentrant = unknown or (dispatch and (len(args) <= tf_index or has_torch_function(args[tf_index])))
        except Exception as exc:  # noqa: BLE001 - fail open
            failure = exc
        if reentrant:
            more_slow()
        thread.depth += 1
        try:
            if pending is not None and pending.token is not None:  # captured: this wrapper records it
                with c10d_ops.bypassed():
                    result = original(*args, **kwargs)
            else:
                result = original(*args, **kwargs)
        except Exception as exc:
            _failed(pending, exc)
            raise
        finally:
            thread.depth -= 1
            if reentrant:
                less_slow()
            if before is not None:
                _measure_gloo(*before)
        if p2p_state is not None:
            p2p_state.gloo_advanced(1)
        if failure is not None:
            log_once("describing a collective", failure)
        if pending is not None:
            _after(pending, result)
        return result

    functools.update_wrapper(wrapper, original)
    if fast:
        wrapper = idle_entry(original, wrapper, name, group_index, tf_index if dispatch else None)
    wrapper.__commtag_original__ = original  # type: ignore[attr-defined]
    wrapper.__commtag_shape__ = shape  # type: ignore[attr-defined]
    return wrapper


def _measure_gloo(state: GroupState, before: int) -> None:
    """Keep how far a call that gloo runs as p2p ops of its own moved the group's count beyond
    one (none if it never reached the backend)."""
    try:
        state.gloo_advanced(max(state.gloo_count() - before - 1, 0))
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("reading gloo's sequence number", exc)


def _wrap_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    """batch_isend_irecv: one p2p Seq for the whole batch, one annotation per op."""

    @functools.wraps(original)
    def wrapper(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return original(p2p_op_list, *args, **kwargs)
        thread = _thread_state()
        if thread.depth:
            return original(p2p_op_list, *args, **kwargs)
        pendings, failure = _before_batch(p2p_op_list, thread)
        thread.depth += 1
        try:
            works = original(p2p_op_list, *args, **kwargs)
        except Exception as exc:
            for pending in pendings:
                _failed(pending, exc)
            raise
        finally:
            thread.depth -= 1
        if failure is not None:  # logged only for a batch torch accepted (else the caller's mistake)
            log_once("describing batch_isend_irecv", failure)
        _batch_counted(p2p_op_list)
        _after_batch(pendings, works)
        return works

    wrapper.__commtag_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _before_batch(p2p_op_list: Any, thread: _ThreadState) -> tuple[list[_Pending], Optional[Exception]]:
    """The batch's pending annotations, and what failed while numbering it (None: nothing)."""
    try:
        calls = []
        for op in p2p_op_list:
            kind = SEND if op.op is c10d.isend else RECV
            call = p2p_call(kind, op.tensor, op.peer, op.group, getattr(op, "group_peer", None))
            if call is not None:
                call.async_op = True
                calls.append(call)
        if not calls:
            return [], None
        batch_seq: dict[int, int] = {}
        for call in calls:
            key = id(call.state)
            if key not in batch_seq:
                batch_seq[key] = call.state.next_p2p_seq()
        pair_seqs = [_pair_seq(call.state, call) for call in calls]
        recording = _profiler_enabled()
        if not recording:
            return [], None
        if calls[0].state.record_format == NCCL2_FORMAT:
            return [_Pending(_nccl2_batch(calls), batch_seq[id(calls[0].state)], None, recording, None, thread)], None
        return [
            _Pending(call, batch_seq[id(call.state)], pair, recording, None, thread)
            for call, pair in zip(calls, pair_seqs)
        ], None
    except Exception as exc:  # noqa: BLE001 - fail open
        return [], exc


def _batch_counted(p2p_op_list: Any) -> None:
    """Each op of an issued batch advanced its gloo group's count once."""
    try:
        for op in p2p_op_list:
            state = lookup(op.group)
            if state is not None:
                state.gloo_advanced(1)
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("counting batch_isend_irecv", exc)


def _nccl2_batch(calls: list[OpCall]) -> OpCall:
    """nccl2's one record of a whole batch (vocab.NCCL2_BATCH_P2P): the sends' and receives'
    totals, a split per send and per receive, the own group rank."""
    sends = [c.in_nelems for c in calls if c.p2p == SEND]
    recvs = [c.out_nelems for c in calls if c.p2p == RECV]
    state = calls[0].state
    return OpCall(NCCL2_BATCH_P2P, state, sum(sends), sum(recvs), calls[0].dtype, state.group_rank,
                  in_split=format_list(sends), out_split=format_list(recvs), p2p=NCCL2_BATCH_P2P, async_op=True)


def _after_batch(pendings: list[_Pending], works: Any) -> None:
    if not pendings:
        return
    try:
        works = list(works or [])
        for index, pending in enumerate(pendings):
            # One work per op (gloo) or one for the whole batch (NCCL coalescing).
            work = works[index] if len(works) == len(pendings) else (works[-1] if works else None)
            _finish(pending, work)
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("annotating batch_isend_irecv", exc)


def _wrap_coalescing(original: Callable[..., Any]) -> Callable[..., Any]:
    """_coalescing_manager: ops inside it that the backend fuses become one '<op>_coalesced' annotation."""

    @functools.wraps(original)
    @contextlib.contextmanager
    def wrapper(group: Any = None, device: Any = None, async_ops: bool = False) -> Any:
        thread = None if torch.compiler.is_compiling() else _thread_state()
        if thread is None or thread.depth:
            with original(group, device, async_ops) as cm:
                yield cm
            return
        block, failure = _push_block(group, device is not None, thread)
        #: The caller's block ran: an error from here on is the fused collective's own.
        issued = False
        try:
            with original(group, device, async_ops) as cm:
                yield cm
                issued = True
        except Exception as exc:
            if issued:
                _close_block(block, None, thread, exc)
            raise
        finally:
            _pop_block(block, thread)
        if failure is not None:  # logged only for a block torch ran (else the caller's mistake)
            log_once("opening a coalescing block", failure)
        _close_block(block, cm if async_ops else None, thread)

    wrapper.__commtag_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _push_block(group: Any, device_given: bool, thread: _ThreadState) -> tuple[Optional[_Block], Optional[Exception]]:
    """The block opened for ``group``, and what failed while opening it (None: nothing)."""
    try:
        if group is not None and not isinstance(group, c10d.ProcessGroup):
            return None, None
        block = _Block(state_for(group), device_given)
        if thread.blocks is None:
            thread.blocks = []
        thread.blocks.append(block)
    except Exception as exc:  # noqa: BLE001 - fail open
        return None, exc
    more_slow()  # calls in the block are numbered by it: no fast path until it closes
    return block, None


def _pop_block(block: Optional[_Block], thread: _ThreadState) -> None:
    if block is None:
        return
    try:
        if thread.blocks and block in thread.blocks:
            thread.blocks.remove(block)
    finally:
        less_slow()


def _close_block(block: Optional[_Block], cm: Any, thread: _ThreadState, error: Optional[Exception] = None) -> None:
    """Annotate the block's fused collective (``error``: what it raised, for "commtag error")."""
    if block is None or not block.calls:
        return
    try:
        first = block.calls[0]
        if block.state.record_format == NCCL2_FORMAT:
            # nccl2 writes one record per tensor, all with the block's Seq (vocab.NCCL2_PER_TENSOR).
            parts = block.calls
            for part in parts:
                part.async_op = cm is not None
        else:
            parts = [OpCall(
                COALESCED_NAMES.get(first.collective, first.collective + "_coalesced"),
                block.state,
                sum(c.in_nelems for c in block.calls),
                sum(c.out_nelems for c in block.calls),
                first.dtype,
                block.state.group_rank,
                async_op=cm is not None,
            )]
        recording = _profiler_enabled()
        if not recording:
            return
        works = list(getattr(cm, "works", []) or []) if cm is not None else []
        for call in parts:
            pending = _Pending(call, block.block_seq(), None, recording, None, thread)
            pending.start_ns = block.start_ns
            if error is not None:
                pending.error = _error_text(error)
            _finish(pending, works[-1] if works else None)
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("annotating a coalesced collective", exc)


# ---------------------------------------------------------------------------
# Calls c10d's own hooks saw (commtag.runtime.c10d_hooks).


def inside_wrapper() -> bool:
    """Is this thread inside a patched function or a coalescing block it opened? Then the call
    c10d is issuing is that wrapper's to record."""
    thread = _thread_state()
    return bool(thread.depth or thread.blocks)


def pair_seq_of(call: OpCall) -> Optional[int]:
    """The pair Seq of a p2p call whose peer is known (takes one)."""
    return _pair_seq(call.state, call) if call.peer is not None else None


def issuing(call: OpCall, seq: int, pair_seq: Optional[int]) -> _Pending:
    """A call about to be issued outside every wrapper (its start is now)."""
    return _Pending(call, seq, pair_seq, True, None, _thread_state())


def record_issued(pending: _Pending, work: Any) -> None:
    """Record a call :func:`issuing` began once it is issued: it ends when its work completes
    (where the work has a future, whether or not the caller waits on it), else now."""
    _record_when_done(pending, _future_of(work))


# ---------------------------------------------------------------------------
# install / uninstall.


def wrapper_makers() -> dict[str, Callable[[Callable[..., Any]], Optional[Callable[..., Any]]]]:
    """torch.distributed function name -> what makes its wrapper from the original (None: the
    original is better left in place); :mod:`commtag.runtime.hooks` installs them."""
    makers: dict[str, Callable[[Callable[..., Any]], Optional[Callable[..., Any]]]] = {
        name: functools.partial(_wrap_op, name=name) for name in OPS
    }
    makers["batch_isend_irecv"] = _wrap_batch
    makers["_coalescing_manager"] = _wrap_coalescing
    return makers


def shape_of(original: Callable[..., Any], name: str) -> reentry.Shape:
    """How ``name``'s original may call wrappers again (UNKNOWN, the always-correct slow path, if unreadable)."""
    present = {n for n in wrapper_makers() if getattr(c10d, n, None) is not None}
    try:
        return reentry.classify(original, name, present, present & (set(OPS) - P2P_OPS))
    except Exception as exc:  # noqa: BLE001 - a bytecode we cannot read costs speed, not correctness
        log_once("reading a collective's code at install", exc)
        return reentry.Shape(reentry.UNKNOWN, reason=f"unreadable: {exc!r}")


def _wrap_op(original: Callable[..., Any], name: str) -> Optional[Callable[..., Any]]:
    return _wrap(original, name, shape_of(original, name))

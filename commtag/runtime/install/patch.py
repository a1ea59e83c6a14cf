"""The collective wrappers (installed and removed by :mod:`commtag.runtime.install.hooks`).

Every wrapper follows one shape::

    pending = <number, and describe if annotated>   # commtag's work; never raises
    result = original(*args, **kwargs)   # exactly once, user's own arguments
    after_call(pending, result)          # commtag's work; never raises
    return result                        # the original object, untouched

so an error inside commtag is logged once (see failopen) and the collective
runs as if commtag were absent, while an error raised by the collective
itself reaches the caller unchanged. A call commtag could not describe is
logged only if the original then accepts it: a call torch rejects is the
caller's mistake, and torch's own error is all the caller sees.

Patched: the functions in metadata.OPS plus ``batch_isend_irecv`` and
``_coalescing_manager`` (wrapped in :mod:`commtag.runtime.install.grouped`), in both ``torch.distributed`` and
``torch.distributed.distributed_c10d`` (the same objects), except an op whose
original only calls another patched op with the same describer
(``all_gather_into_tensor`` -> ``all_gather_single``): it stays as it is,
and the inner wrapper numbers and annotates the call. ``isend`` and
``irecv`` are never replaced: ``P2POp`` checks them by identity. Code that
imported a function by name before :func:`commtag.install` keeps the original
and is not annotated.

Two paths. The **idle fast path** runs while nothing could record: no
Python-started profiler (``torch.autograd.profiler._is_profiler_enabled``,
which torch.profiler and torch.autograd.profiler set while any profile records,
``profile_all_threads`` included), no capture open, no coalescing block open,
not compiling, and no slow-path call in flight whose original may call a
wrapper again (:func:`commtag.runtime.install.idle.more_slow`); that test is
:data:`commtag.runtime.install.idle.IDLE_GATE`, written once. It only numbers a
plain collective on its group's counter (no thread-local state, no
description) and calls the original; it is a function generated per op
from one template (:func:`commtag.runtime.install.idle.idle_entry`), with the
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
torch's code at install (:mod:`commtag.runtime.install.reentry`): ops that only
delegate to another patched op are left in place (above); ops whose
original cannot be read always take the slow path. Seq comes out the same on
either path.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from torch._C import DisableTorchFunction
from torch.distributed import distributed_c10d as c10d

from commtag.runtime import capture
from commtag.runtime.capture import OPEN_CAPTURES, c10d_ops
from commtag.runtime.describe.groups import GLOO_INNER_P2P, GROUP_STATES, GroupState, lookup
from commtag.runtime.describe.metadata import GROUP_INDEX, ONE_TENSOR_OPS, OPS, P2P_OPS
from commtag.runtime.failopen import log_once
from commtag.runtime.install import reentry
from commtag.runtime.install.grouped import wrap_batch, wrap_coalescing
from commtag.runtime.install.idle import (
    c10d_world,
    compiler,
    has_torch_function,
    idle_entry,
    is_dynamo_compiling,
    less_slow,
    logged_body,
    more_slow,
    raise_as_logged,
)
from commtag.runtime.install.inflight import (
    Pending,
    after_call,
    now_ns,
    record_failed,
    ring_ended,
    ring_failed,
    start_call,
    thread_state,
    tls,
    unseen,
)
from commtag.runtime.record import ring
from commtag.runtime.record.ring import KEPT_CALL, KEPT_END
from commtag.runtime.record.recorder import autograd_profiler, thread_profiled


def _wrap(original: Callable[..., Any], name: str, shape: reentry.Shape) -> Optional[Callable[..., Any]]:
    """The wrapper of op ``name``, or None where the original is better left in place."""
    described = OPS[name]
    describe = unseen(described)
    group_index = GROUP_INDEX[name]
    p2p = name in P2P_OPS
    #: Describing a call whose one tensor has no __torch_function__ needs no DisableTorchFunction.
    one_tensor = name in ONE_TENSOR_OPS and shape.tf_index == 0
    #: May take the idle fast path (a plain collective: p2p, unreadable ops and those whose gloo
    #: count is measured never do).
    measured = name in GLOO_INNER_P2P
    fast = not p2p and not measured and shape.kind == reentry.PLAIN
    #: The original's code could not be read: any call may re-enter a wrapper.
    unknown = shape.kind == reentry.UNKNOWN
    #: The original dispatches to __torch_function__ on its positional argument tf_index.
    tf_index = shape.tf_index if shape.tf_index is not None else 0
    dispatch = shape.tf_index is not None
    #: What runs the call: the body inside torch's ``_exception_logger``, as on the idle path (a
    #: frame and a repacking fewer), its failures handed to that logger as the original would.
    body = logged_body(original)
    run = original if body is None else body
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
            thread = tls.state
        except AttributeError:
            thread = thread_state()
        if thread.depth:
            return original(*args, **kwargs)
        pending = None
        #: A call only the ring keeps (see ring.Kept).
        kept: Optional[ring.Kept] = None
        reentrant = True
        #: The group of a call whose advance of gloo's count is measured, with the count before it.
        before: Optional[tuple[GroupState, int]] = None
        #: What went wrong describing the call: logged only if the original accepts the call
        #: (a call torch rejects is the caller's mistake, and torch's error says so).
        failure = None
        try:
            if p2p or thread.blocks:
                call = describe(*args, **kwargs)
                pending = None if call is None else start_call(call, thread)
            else:
                # A plain collective needs only its group to be numbered; it is described
                # only when it will be annotated.
                group = kwargs["group"] if "group" in kwargs else (args[group_index] if len(args) > group_index else None)
                state = GROUP_STATES.get(c10d_world._default_pg if group is None else group) or lookup(group)
                if state is not None:
                    if measured and state.gloo is not None:
                        before = (state, state.gloo_count())
                    # gloo's count read inline (GroupState.next_collective_seq, a frame fewer per call).
                    gloo_seq = state.gloo_seq
                    seq = state.next_collective_seq() if gloo_seq is None else gloo_seq() + 1 - state.gloo_extra
                    recording = thread_profiled() or autograd_profiler._is_profiler_enabled
                    token = capture.before_collective() if OPEN_CAPTURES else None
                    if recording or token is not None:
                        call = describe(*args, **kwargs)
                        if call is not None:
                            pending = Pending(call, seq, None, recording, token, thread)
                    elif ring.RING is not None:
                        # Only the ring keeps it: one object, no annotation, its end written below.
                        keeping = ring.RING
                        if one_tensor and args and not has_torch_function(args[0]):
                            call = described(*args, **kwargs)  # nothing its reads could reach (ONE_TENSOR_OPS)
                        else:
                            with DisableTorchFunction():  # as unseen(): the caller's modes see no reads of ours
                                call = described(*args, **kwargs)
                        if call is not None:  # Ring.keep inlined (ring.Kept: a list, no class to call)
                            kept = [next(keeping.ids), call, seq, thread, now_ns(), None, None]
                            keeping.slots.append(kept)
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
                    result = run(*args, **kwargs)
            else:
                result = run(*args, **kwargs)
        except Exception as exc:
            record_failed(pending, exc)
            ring_failed(kept, exc)
            if body is not None:
                raise_as_logged(body, exc, args, kwargs)  # raises exc, logged as torch's own wrapper would
            raise
        finally:
            thread.depth -= 1
            if reentrant:
                less_slow()
            if before is not None:
                _measure_gloo(*before)
        if failure is not None:
            log_once("describing a collective", failure)
        if pending is not None:
            after_call(pending, result)
        elif kept is not None:
            if kept[KEPT_CALL].async_op:
                ring_ended(kept, result)
            else:
                kept[KEPT_END] = now_ns()
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



# ---------------------------------------------------------------------------
# install / uninstall.


def wrapper_makers() -> dict[str, Callable[[Callable[..., Any]], Optional[Callable[..., Any]]]]:
    """torch.distributed function name -> what makes its wrapper from the original (None: the
    original is better left in place); :mod:`commtag.runtime.install.hooks` installs them."""
    makers: dict[str, Callable[[Callable[..., Any]], Optional[Callable[..., Any]]]] = {
        name: functools.partial(_wrap_op, name=name) for name in OPS
    }
    makers["batch_isend_irecv"] = wrap_batch
    makers["_coalescing_manager"] = wrap_coalescing
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

"""The wrappers of the calls a caller groups: ``batch_isend_irecv`` (one p2p Seq for the batch, one
annotation per op, one capture snapshot their records share when captured in a CUDA graph) and
``_coalescing_manager`` (ops the backend fuses become one annotation).

Both take the shape of every wrapper (:mod:`commtag.runtime.install.patch`) and end their calls
through :mod:`commtag.runtime.install.inflight`.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Optional

import torch
from torch.distributed import distributed_c10d as c10d

from commtag.identity import format_list
from commtag.runtime import capture
from commtag.runtime.capture import OPEN_CAPTURES, c10d_ops
from commtag.runtime.describe.groups import state_for
from commtag.runtime.describe.metadata import COALESCED_NAMES
from commtag.runtime.describe.metadata import p2p_call as describe_p2p
from commtag.runtime.describe.calls import OpCall
from commtag.runtime.failopen import log_once
from commtag.runtime.install.idle import less_slow, more_slow
from commtag.runtime.install.inflight import (
    Block,
    Pending,
    ThreadState,
    error_text,
    finish_call,
    next_pair_seq,
    record_failed,
    thread_state,
    unseen,
)
from commtag.runtime.record.recorder import profiler_enabled
from commtag.vocab import NCCL2_BATCH_P2P, NCCL2_FORMAT, RECV, SEND

#: The describer of one op of a batch, run unseen by __torch_function__.
p2p_call = unseen(describe_p2p)


def wrap_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    """batch_isend_irecv: one p2p Seq for the whole batch, one annotation per op."""

    @functools.wraps(original)
    def wrapper(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return original(p2p_op_list, *args, **kwargs)
        thread = thread_state()
        if thread.depth:
            return original(p2p_op_list, *args, **kwargs)
        pendings, failure = _before_batch(p2p_op_list, thread)
        thread.depth += 1
        try:
            if pendings and pendings[0].token is not None:  # captured: this wrapper records it
                with c10d_ops.bypassed():
                    works = original(p2p_op_list, *args, **kwargs)
            else:
                works = original(p2p_op_list, *args, **kwargs)
        except Exception as exc:
            for pending in pendings:
                record_failed(pending, exc)
            raise
        finally:
            thread.depth -= 1
        if failure is not None:  # logged only for a batch torch accepted (else the caller's mistake)
            log_once("describing batch_isend_irecv", failure)
        _after_batch(pendings, works)
        return works

    wrapper.__commtag_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _before_batch(p2p_op_list: Any, thread: ThreadState) -> tuple[list[Pending], Optional[Exception]]:
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
        pair_seqs = [next_pair_seq(call.state, call) for call in calls]
        recording = profiler_enabled()
        if not recording and not OPEN_CAPTURES:
            return [], None
        if calls[0].state.record_format == NCCL2_FORMAT:
            pendings = [Pending(_nccl2_batch(calls), batch_seq[id(calls[0].state)], None, recording, None, thread)]
        else:
            pendings = [Pending(call, batch_seq[id(call.state)], pair, recording, None, thread)
                        for call, pair in zip(calls, pair_seqs)]
        _captured(pendings)
        if not recording and pendings[0].token is None:
            return [], None
        return pendings, None
    except Exception as exc:  # noqa: BLE001 - fail open
        return [], exc


def _captured(pendings: list[Pending]) -> None:
    """A batch issued inside a capture: one snapshot of the graph, taken last before the batch runs,
    which every record of it shares (legacy launches the batch's kernels together at the group's
    end, so its ops' records share the nodes the batch added; nccl2 writes one record). Where
    several records share it, torch's mark_kernels is not asked for one: a mark names one record,
    the nodes name them all."""
    if not OPEN_CAPTURES:
        return
    token = capture.before_collective(marked=len(pendings) == 1)
    for pending in pendings:
        pending.token = token


def _nccl2_batch(calls: list[OpCall]) -> OpCall:
    """nccl2's one record of a whole batch (vocab.NCCL2_BATCH_P2P): the sends' and receives'
    totals, a split per send and per receive, the own group rank; and commtag's keys naming the
    peer of each send and receive, which nccl2 writes nowhere (what pairs the batch across ranks)."""
    sends = [c for c in calls if c.p2p == SEND]
    recvs = [c for c in calls if c.p2p == RECV]
    state = calls[0].state
    peers = None
    if all(c.peer is not None for c in calls):
        peers = (format_list([c.peer for c in sends if c.peer is not None]),
                 format_list([c.peer for c in recvs if c.peer is not None]))
    return OpCall(NCCL2_BATCH_P2P, state, sum(c.in_nelems for c in sends), sum(c.out_nelems for c in recvs),
                  calls[0].dtype, state.group_rank, in_split=format_list([c.in_nelems for c in sends]),
                  out_split=format_list([c.out_nelems for c in recvs]), p2p=NCCL2_BATCH_P2P, async_op=True,
                  peers=peers)


def _after_batch(pendings: list[Pending], works: Any) -> None:
    if not pendings:
        return
    try:
        works = list(works or [])
        for index, pending in enumerate(pendings):
            # One work per op (gloo) or one for the whole batch (NCCL coalescing).
            work = works[index] if len(works) == len(pendings) else (works[-1] if works else None)
            finish_call(pending, work)
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("annotating batch_isend_irecv", exc)


def wrap_coalescing(original: Callable[..., Any]) -> Callable[..., Any]:
    """_coalescing_manager: ops inside it that the backend fuses become one '<op>_coalesced' annotation."""

    @functools.wraps(original)
    @contextlib.contextmanager
    def wrapper(group: Any = None, device: Any = None, async_ops: bool = False) -> Any:
        thread = None if torch.compiler.is_compiling() else thread_state()
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


def _push_block(group: Any, device_given: bool, thread: ThreadState) -> tuple[Optional[Block], Optional[Exception]]:
    """The block opened for ``group``, and what failed while opening it (None: nothing)."""
    try:
        if group is not None and not isinstance(group, c10d.ProcessGroup):
            return None, None
        block = Block(state_for(group), device_given)
        if thread.blocks is None:
            thread.blocks = []
        thread.blocks.append(block)
    except Exception as exc:  # noqa: BLE001 - fail open
        return None, exc
    more_slow()  # calls in the block are numbered by it: no fast path until it closes
    return block, None


def _pop_block(block: Optional[Block], thread: ThreadState) -> None:
    if block is None:
        return
    try:
        if thread.blocks and block in thread.blocks:
            thread.blocks.remove(block)
    finally:
        less_slow()


def _close_block(block: Optional[Block], cm: Any, thread: ThreadState, error: Optional[Exception] = None) -> None:
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
        recording = profiler_enabled()
        if not recording:
            return
        works = list(getattr(cm, "works", []) or []) if cm is not None else []
        for call in parts:
            pending = Pending(call, block.block_seq(), None, recording, None, thread)
            pending.start_ns = block.start_ns
            if error is not None:
                pending.error = error_text(error)
            finish_call(pending, works[-1] if works else None)
    except Exception as exc:  # noqa: BLE001 - fail open
        log_once("annotating a coalesced collective", exc)


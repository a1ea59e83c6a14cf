"""c10d's own per-group pre/post hooks (torch 2.15+): the calls the patched functions never see.

Functional collectives (DTensor, torch.compile) and direct backend calls
(``pg.allreduce([t])``) run c10d's operators from C++; outside a capture no
patched Python function sees them. torch 2.15 fires ``ProcessGroup`` pre- and
post-hooks for every call its dispatcher issues (docs/nccl2.md §7a), so
commtag registers one pair on every group and records the calls nothing
else recorded:

* a call issued from inside a patched function (or a coalescing block it
  opened) is that wrapper's: the hooks step aside, so no call is recorded
  twice;
* while a capture is open, the capture's operator interception
  (:mod:`commtag.runtime.capture.c10d_ops`) owns the calls; replays fire no hook;
* only while the profiler records (the hooks cost one check otherwise).

A group made after install gets its hooks where torch attaches its own
(``_maybe_attach_flight_recorder``, called for every new and split group).
A group keeps its hooks, once registered, for its life: :func:`detach_all`
makes them inert (one check per call) and a later install wakes them. torch's
hook table is not safe to change while another thread issues a call on the
group: unregistering them at uninstall, with install and uninstall run from
one thread while another issued collectives, crashed the process (a
segmentation fault in the call's dispatch, torch 2.15.0, gloo).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Optional

import torch
from torch.distributed import distributed_c10d as c10d

from commtag.identity import format_list
from commtag.runtime import capture
from commtag.runtime.install import inflight
from commtag.runtime.record import recorder
from commtag.runtime.describe.calls import OpCall, dtype_name, nelems
from commtag.runtime.failopen import log_once
from commtag.runtime.describe.groups import GroupState, lookup
from commtag.vocab import (
    BARRIER_DTYPE, HOOK_OP_COLLECTIVES, NCCL2_FORMAT, NCCL2_PER_TENSOR, RECV, SEND, SPLITS_UNSEEN_HOOK_OP,
)

#: The id commtag registers its hooks under (hooks run in id order; torch's FlightRecorder and
#: NanCheck hooks use their own ids, which docs/nccl2.md §8.7 leaves unverified: a high id
#: keeps clear of small ones and runs last).
HOOK_ID = 0x636F6D74

_lock = threading.RLock()
#: True while installed: a hook reads it, and does nothing while commtag is not installed.
_live = False
#: Groups that carry commtag's hooks (weakly: a destroyed group is not kept alive by commtag).
_attached: "weakref.WeakSet[Any]" = weakref.WeakSet()
#: The wrapper over torch's per-group hook attachment while installed.
_watcher: Optional[Callable[..., Any]] = None


def available() -> bool:
    """Does this torch fire c10d pre/post hooks that name every op apart (2.15+)? torch 2.14 has
    the hooks, but its HookOpName has no *_BASE or *_COALESCED members (docs/nccl2.md §7a),
    so a tensor-form call would be described under its list form's name."""
    names = getattr(getattr(torch._C._distributed_c10d, "HookOpName", None), "__members__", {})
    return (hasattr(c10d.ProcessGroup, "register_pre_hook") and hasattr(c10d.ProcessGroup, "register_post_hook")
            and set(HOOK_OP_COLLECTIVES) | {SPLITS_UNSEEN_HOOK_OP} <= set(names))


def _sum(tensors: Any) -> int:
    return sum(nelems(t) for t in tensors)


def describe(name: str, inputs: list[Any], outputs: list[Any], root: int, async_op: bool,
             state: GroupState) -> Optional[OpCall]:
    """The legacy description of one hooked call (torch 2.15's hook arguments, checked on gloo:
    in-place ops pass only inputs, list ops the whole lists, rooted ops the group-local root,
    send/recv the peer as root). None: the hook does not say enough (see HOOK_OP_COLLECTIVES)."""
    if name == SPLITS_UNSEEN_HOOK_OP:
        # all_to_all_single: the hook gives its two tensors, not the split lists legacy records
        # (nor whether any were given): the sizes, and "commtag splits": "not recorded".
        return OpCall("all_to_allv", state, _sum(inputs), _sum(outputs), dtype_name((inputs or outputs)[0]),
                      state.group_rank, async_op=async_op, splits_unknown=True)
    collective = HOOK_OP_COLLECTIVES.get(name)
    if collective is None:
        return None
    tensors = inputs or outputs
    if collective == "barrier":
        return OpCall(collective, state, 0, 0, BARRIER_DTYPE, state.group_rank, async_op=async_op)
    if collective in (SEND, RECV):
        n = nelems(tensors[0])
        return OpCall(collective, state, n, n, dtype_name(tensors[0]), root, p2p=collective,
                      peer=state.ranks[root], async_op=async_op)
    rank = root if collective in ("broadcast", "reduce", "gather", "scatter") else state.group_rank
    n_in = _sum(inputs)
    if collective in ("allreduce", "allreduce_coalesced", "broadcast", "reduce"):
        return OpCall(collective, state, n_in, n_in, dtype_name(tensors[0]), rank, async_op=async_op)
    if collective in ("all_gather", "gather"):
        return OpCall(collective, state, n_in, n_in * state.size, dtype_name(inputs[0]), rank, async_op=async_op)
    if collective in ("reduce_scatter", "scatter"):
        n_out = _sum(outputs)
        return OpCall(collective, state, n_out * state.size, n_out, dtype_name(outputs[0]), rank, async_op=async_op)
    if collective == "all_to_all":
        ins, outs = [nelems(t) for t in inputs], [nelems(t) for t in outputs]
        return OpCall(collective, state, sum(ins), sum(outs), dtype_name(inputs[0]), rank,
                      in_split=format_list(ins), out_split=format_list(outs), async_op=async_op)
    # The tensor forms and their coalesced variants: what each side holds, the output's dtype.
    return OpCall(collective, state, n_in, _sum(outputs), dtype_name((outputs or inputs)[0]), rank,
                  async_op=async_op)


def per_tensor(call: OpCall, inputs: list[Any], outputs: list[Any]) -> list[OpCall]:
    """The call as its group's backend records it: a coalesced call on an nccl2 group is one
    record per tensor (pair), all with the call's Seq (vocab.NCCL2_PER_TENSOR); else itself."""
    part = NCCL2_PER_TENSOR.get(call.collective) if call.state.record_format == NCCL2_FORMAT else None
    if part is None:
        return [call]
    size = call.state.size
    if part == "allreduce":
        return [OpCall(part, call.state, nelems(t), nelems(t), dtype_name(t), call.rank, async_op=call.async_op)
                for t in inputs]
    if part == "all_gather":  # the list form: an input and its N outputs per part
        return [OpCall(part, call.state, nelems(t), nelems(t) * size, dtype_name(t), call.rank,
                       async_op=call.async_op) for t in inputs]
    return [OpCall(part, call.state, nelems(i), nelems(o), dtype_name(o), call.rank, async_op=call.async_op)
            for i, o in zip(inputs, outputs)]


class _GroupHooks:
    """The pre/post pair of one group: a call's description and Seq are taken before it is
    issued (as the wrappers take them), its record is handed on once it is issued."""

    def __init__(self, pg: Any) -> None:
        self.group = weakref.ref(pg)
        #: op_id -> the call being issued on this group (pre and post fire on the issuing thread).
        self.issuing: dict[int, Any] = {}

    def pre(self, args: Any) -> None:
        if not _live or not recorder.profiler_enabled() or inflight.inside_wrapper() or capture.OPEN_CAPTURES:
            return
        try:
            state = lookup(self.group())
            if state is None:
                return
            name = args.name.name
            call = describe(name, list(args.input_tensors), list(args.output_tensors), int(args.root),
                            bool(args.async_op), state)
            if call is None:
                return
            if call.p2p is not None:
                seq, pair_seq = state.next_p2p_seq(), inflight.pair_seq_of(call)
            else:
                seq, pair_seq = state.next_collective_seq(), None
            parts = per_tensor(call, list(args.input_tensors), list(args.output_tensors))
            self.issuing[int(args.op_id)] = [inflight.issuing(part, seq, pair_seq) for part in parts]
        except Exception as exc:  # noqa: BLE001 - fail open: the call runs unannotated
            log_once("describing a call c10d's hook saw", exc)

    def post(self, args: Any) -> None:
        pendings = self.issuing.pop(int(args.op_id), None) if self.issuing else None
        if pendings is None:
            return
        try:
            for pending in pendings:
                inflight.record_issued(pending, args.work)
        except Exception as exc:  # noqa: BLE001 - fail open
            log_once("recording a call c10d's hook saw", exc)


def attach(pg: Any) -> None:
    """Register commtag's hooks on ``pg`` once (while installed)."""
    with _lock:
        if not _live or pg in _attached or not isinstance(pg, c10d.ProcessGroup):
            return
        hooks = _GroupHooks(pg)
        # Untyped: the hook methods are torch 2.15+ (available()), which older torch stubs lack.
        group: Any = pg
        try:
            group.register_pre_hook(HOOK_ID, hooks.pre)
            group.register_post_hook(HOOK_ID, hooks.post)
        except Exception as exc:  # noqa: BLE001 - fail open: this group's hook-only calls go unannotated
            log_once("registering c10d hooks on a process group", exc)
            return
        _attached.add(pg)


def attach_all() -> None:
    """Hooks on every group there is now and every group made from now on (idempotent)."""
    global _live, _watcher
    if not available():
        return
    with _lock:
        _live = True
        for pg in list(c10d._world.pg_map):
            attach(pg)
        original = getattr(c10d, "_maybe_attach_flight_recorder", None)
        if original is None or original is _watcher:
            return

        def attaching(pg: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(pg, *args, **kwargs)
            attach(pg)
            return result

        attaching.__wrapped__ = original  # type: ignore[attr-defined]
        # setattr: a private torch function, which some torch versions' stubs do not list.
        _watcher = attaching
        setattr(c10d, "_maybe_attach_flight_recorder", attaching)


def detach_all() -> None:
    """Make every hook commtag registered inert (they stay registered: see the module docstring) and
    put torch's attachment back (idempotent)."""
    global _live, _watcher
    with _lock:
        _live = False
        if getattr(c10d, "_maybe_attach_flight_recorder", None) is _watcher and _watcher is not None:
            setattr(c10d, "_maybe_attach_flight_recorder", _watcher.__wrapped__)
        _watcher = None

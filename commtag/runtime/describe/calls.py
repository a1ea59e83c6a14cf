"""One collective call in the eager profiler's terms, and the one way it becomes an annotation.

Both ways a call reaches commtag describe it as an :class:`OpCall`: the
patched ``torch.distributed`` functions (:mod:`commtag.runtime.describe.metadata`)
and, while a CUDA graph is captured, the c10d operators that bypass them
(:mod:`commtag.runtime.capture.c10d_ops`). A :class:`CallRecord` adds what only the
moment of the call knows (its Seq, its thread, whether it failed) and
builds the annotation's fields (:meth:`CallRecord.annotation_fields`), so
the two paths cannot describe the same call differently.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed

from commtag.runtime.describe.nccl2 import nccl2_sizes
from commtag.runtime.describe.groups import GroupState
from commtag.vocab import DTYPES, NCCL2_ALLTOALL_SPLIT, NCCL2_FORMAT, RECORDED_AS_REAL, RECV, SEND, SPLITS_NOT_RECORDED

_now_ns = time.time_ns

#: torch dtype -> the name recorded for it, complex already as its real view: built once from
#: :data:`commtag.vocab.DTYPES` (the dtypes this torch has), one lookup per call.
_RECORDED_NAMES: dict[torch.dtype, str] = {
    getattr(torch, d.attr): RECORDED_AS_REAL.get(d.scalar_type, d.scalar_type)
    for d in DTYPES
    if isinstance(getattr(torch, d.attr, None), torch.dtype)
}


#: torch dtype -> (the name recorded for it, elements recorded per element: 2 for complex, counted
#: as its real view): what :func:`dtype_name` and :func:`nelems` read, in one lookup per call.
RECORDED_SIZES: dict[torch.dtype, tuple[str, int]] = {
    dtype: (name, 2 if dtype.is_complex else 1) for dtype, name in _RECORDED_NAMES.items()
}


def reduce_name(value: Any) -> Optional[str]:
    """"sum", "avg", ... from a ReduceOp ScriptObject (the c10d operators'), a ReduceOp, or funcol's string."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.lower()
    if isinstance(value, torch.ScriptObject):
        value = value.op()  # type: ignore[attr-defined]  # a TorchScript method: torch's stub lists none
    if isinstance(value, torch.distributed.ReduceOp.RedOpType):  # ReduceOp.AVG and the like
        return value.name.lower()
    if isinstance(value, torch.distributed.ReduceOp):
        value = value.op  # type: ignore[attr-defined]  # bound by c10d's pybind; torch's stub omits it
    try:
        return torch.distributed.ReduceOp.RedOpType(int(value)).name.lower()
    except (TypeError, ValueError):
        return None


def dtype_name(tensor: torch.Tensor) -> str:
    """c10 ScalarType name of a tensor as recorded ("Float", not "float32"); complex as real.

    A dtype the table does not know raises KeyError: the call is then left
    unannotated and the failure logged once, rather than recorded under a
    name the profiler would not write.
    """
    return _RECORDED_NAMES[tensor.dtype]


def nelems(tensor: torch.Tensor) -> int:
    """Element count as recorded: complex tensors count their real view (2x)."""
    return tensor.numel() * (2 if tensor.is_complex() else 1)


@dataclass(slots=True)
class OpCall:
    """What one call will run, in the profiler's terms."""

    collective: str
    state: GroupState
    in_nelems: int
    out_nelems: int
    dtype: str
    #: Group rank written as "Rank" (own rank, root, or peer).
    rank: int
    in_split: str = "[]"
    out_split: str = "[]"
    #: vocab.SEND or vocab.RECV for point-to-point (vocab.NCCL2_BATCH_P2P: nccl2's one record of a
    #: batch), else None.
    p2p: Optional[str] = None
    #: Global rank of the p2p peer; None for a recv from any source (filled from its result).
    peer: Optional[int] = None
    async_op: bool = False
    #: Ops the coalescing manager can fuse into one "<x>_coalesced" collective.
    fusable: bool = False
    #: The reduction as the call gave it (a name, a ReduceOp or its script object): capture
    #: bookkeeping reads it through :func:`reduce_name`, so a recorded call pays nothing for it.
    reduce_op: Any = None
    #: nccl2's batch_op_issue: the global peer of each send and of each receive, as list strings
    #: ("commtag send peers" / "commtag recv peers": what pairs the batch across ranks).
    peers: Optional[tuple[str, str]] = None
    #: An all-to-all whose split sizes were not seen (a call only c10d's hook saw): "commtag splits".
    splits_unknown: bool = False


class CallRecord:
    """One numbered call on its way to an annotation: the recorder keeps it as it is and asks
    for its fields only when the sidecar is written (a dict of two dozen fields per call cost
    more than the rest of the recording path)."""

    __slots__ = ("call", "seq", "pair_seq", "start_ns", "tid", "thread_name", "error")

    def __init__(self, call: OpCall, seq: int, pair_seq: Optional[int], tid: int, thread_name: str) -> None:
        self.call = call
        self.seq = seq
        self.pair_seq = pair_seq
        self.tid = tid
        self.thread_name = thread_name
        self.start_ns = _now_ns()
        #: What failed, as "commtag error" writes it; None while nothing did.
        self.error: Optional[str] = None

    def annotation_fields(self) -> dict[str, Any]:
        """The annotation's fields by name (validated by whoever builds the model), in the format
        of the group's backend (see :func:`as_nccl2`)."""
        call = self.call
        fields = {
            **call.state.annotation_fields,
            "collective_name": call.collective,
            "in_msg_nelems": call.in_nelems,
            "out_msg_nelems": call.out_nelems,
            "dtype": call.dtype,
            "in_split_size": call.in_split,
            "out_split_size": call.out_split,
            "rank": call.rank,
            "dst_rank": call.peer if call.p2p == SEND else None,
            "src_rank": call.peer if call.p2p == RECV else None,
            "seq": self.seq,
            "is_p2p": call.p2p is not None,
            "p2p_pair_seq": self.pair_seq,
            "async_op": call.async_op,
            "thread": self.tid,
            "error": self.error,
            "send_peers": call.peers[0] if call.peers else None,
            "recv_peers": call.peers[1] if call.peers else None,
            "splits": SPLITS_NOT_RECORDED if call.splits_unknown else None,
        }
        if call.state.record_format == NCCL2_FORMAT:
            as_nccl2(fields, call)
        return fields


def as_nccl2(fields: dict[str, Any], call: OpCall) -> None:
    """Rewrite a call's fields as nccl2 writes its record (commtag.runtime.describe.nccl2): its engine name,
    nelems and per-tensor splits, no Dst / Src Rank (the group-level keys it omits are left out
    by GroupState). A name nccl2 has no record for keeps the legacy values."""
    sizes = nccl2_sizes(call.collective, call.in_nelems, call.out_nelems, call.in_split, call.out_split,
                        call.state.size, call.rank, call.state.group_rank)
    if sizes is not None:
        # A call whose split lists were not seen: not the even engine (nccl2 runs it only without
        # split lists, which nothing says here), the one whose record keeps no split lists either.
        name = NCCL2_ALLTOALL_SPLIT if call.splits_unknown else sizes.collective
        fields.update(collective_name=name, in_msg_nelems=sizes.in_nelems,
                      out_msg_nelems=sizes.out_nelems, in_split_size=sizes.in_split, out_split_size=sizes.out_split)
    fields["dst_rank"] = fields["src_rank"] = None


def numbered_now(call: OpCall) -> CallRecord:
    """A plain collective numbered now, on the calling thread (this consumes a Seq: call once,
    before the op runs)."""
    thread = threading.current_thread()
    return CallRecord(call, call.state.next_collective_seq(), None, threading.get_native_id(), thread.name)

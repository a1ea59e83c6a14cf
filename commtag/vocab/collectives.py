"""Every collective torch names: its family, busbw factor and message sizes."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, NamedTuple, Optional


#: Collective families, tried in order on a name with everything but letters removed
#: ("gloo:all_reduce" -> "allreduce"); the order matters ("sendrecv" before "send").
FAMILIES: tuple[str, ...] = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "barrier",
                             "gather", "scatter", "reduce", "sendrecv", "send", "recv")


#: Names whose family their letters do not say: nccl2's record of a whole batch of sends and
#: receives (docs/nccl2.md §3 ``batch_op_issue``), carried out by SendRecv kernels.
NAMED_FAMILIES: dict[str, str] = {"batch_op_issue": "sendrecv"}


@lru_cache(maxsize=4096)
def family(name: str) -> str:
    """Collective family of an eager, c10d, gloo or NCCL-kernel name: "gloo:all_reduce" -> "allreduce"
    (cached: names repeat)."""
    if name in NAMED_FAMILIES:
        return NAMED_FAMILIES[name]
    flat = re.sub(r"[^a-z]", "", name.lower().split("::")[-1].split(":")[-1])
    for fam in FAMILIES:
        if fam in flat:
            return fam
    return flat


#: The eager "Collective name" of a point-to-point send and of a receive (the rows below); the
#: runtime's OpCall.p2p says which of the two a call is with these.
SEND, RECV = "send", "recv"

#: nccl-tests' bus-bandwidth factors of a group of n ranks, by name (see :class:`Collective`).
BUSBW_FACTORS: dict[str, Callable[[int], float]] = {
    "2(n-1)/n": lambda n: 2 * (n - 1) / n,
    "(n-1)/n": lambda n: (n - 1) / n,
    "1": lambda n: 1.0,
}


class Collective(NamedTuple):
    """What commtag knows of one eager "Collective name"."""

    name: str
    #: :func:`family` of the name (what its gloo works and NCCL kernels are called).
    family: str
    #: No member can end it before the last has joined, so its ends are one instant
    #: on every clock (clock alignment reads only these).
    synchronizing: bool
    #: The NCCL kernel collective that carries it out (a replayed kernel must say this).
    nccl_kernel: str
    #: nccl-tests' size S: "in" or "out" msg nelems; None: it moves no data (no bandwidth).
    busbw_size: Optional[str]
    #: nccl-tests' bus-bandwidth factor (a key of :data:`BUSBW_FACTORS`).
    busbw_factor: Optional[str]
    #: Whether every member's In / Out msg nelems must be equal (a difference is a desync).
    equal_in: bool
    equal_out: bool
    #: How one rank's in and out sizes relate on n ranks: "out = in x n" (gathers into
    #: all), "in = out x n" (reduce-scatters), "sum in = sum out" (all-to-all), or None.
    shape: Optional[str]
    #: "all" (every member contributes alike), "rooted" (Rank is the root) or "p2p" (Rank is the peer).
    kind: str
    #: The name the coalescing manager gives a fused block of this op (None: not fusable).
    coalesced: Optional[str] = None


def collective_row(name: str, fam: str, sync: bool, kernel: str, size: Optional[str], factor: Optional[str],
         equal: str, shape: Optional[str], kind: str, coalesced: Optional[str] = None) -> Collective:
    return Collective(name, fam, sync, kernel, size, factor, "i" in equal, "o" in equal, shape, kind, coalesced)


#: One row per eager "Collective name" (see :class:`Collective`). Sizes follow nccl-tests:
#: all_reduce/broadcast/reduce/send/recv use the buffer (in == out); all_gather and gather
#: the gathered total (out); reduce_scatter and scatter the total before splitting (in);
#: all_to_all a rank's whole send buffer (in). Rooted gathers and scatters and all-to-all
#: move their data as NCCL SendRecv kernels; a barrier is a one-element all-reduce.
COLLECTIVES: dict[str, Collective] = {row.name: row for row in (
    collective_row("allreduce", "allreduce", True, "AllReduce", "in", "2(n-1)/n", "io", None, "all", "allreduce_coalesced"),
    collective_row("allreduce_coalesced", "allreduce", True, "AllReduce", "in", "2(n-1)/n", "io", None, "all"),
    collective_row("broadcast", "broadcast", False, "Broadcast", "in", "1", "io", None, "rooted"),
    collective_row("reduce", "reduce", False, "Reduce", "in", "1", "io", None, "rooted"),
    collective_row("all_gather", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all"),
    collective_row("_allgather_base", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all",
         "allgather_into_tensor_coalesced"),
    collective_row("allgather_coalesced", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all"),
    collective_row("allgather_into_tensor_coalesced", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n",
         "all"),
    collective_row("reduce_scatter", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io", "in = out x n", "all"),
    collective_row("_reduce_scatter_base", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io", "in = out x n", "all",
         "reduce_scatter_tensor_coalesced"),
    collective_row("reduce_scatter_tensor_coalesced", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io",
         "in = out x n", "all"),
    collective_row("all_to_all", "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    collective_row("all_to_allv", "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    collective_row("gather", "gather", False, "SendRecv", "out", "(n-1)/n", "i", None, "rooted"),
    collective_row("scatter", "scatter", False, "SendRecv", "in", "(n-1)/n", "o", None, "rooted"),
    collective_row("barrier", "barrier", True, "AllReduce", None, None, "io", None, "all"),
    collective_row(SEND, "send", False, "SendRecv", "in", "1", "io", None, "p2p"),
    collective_row(RECV, "recv", False, "SendRecv", "out", "1", "io", None, "p2p"),
)}
#: Eager names of the all-to-all collectives, whose "In split size" lists what each peer was sent.
ALL_TO_ALL_NAMES = frozenset({"all_to_all", "all_to_allv"})
#: Families whose collectives synchronise their members (see :attr:`Collective.synchronizing`).
SYNCHRONIZING_FAMILIES = frozenset(row.family for row in COLLECTIVES.values() if row.synchronizing)
#: Eager names numbered on a group's point-to-point Seq counter.
P2P_COLLECTIVES = frozenset(row.name for row in COLLECTIVES.values() if row.kind == "p2p")
#: Families (:func:`family`) of point-to-point work: gloo's send/recv and NCCL's Send, Recv and
#: SendRecv kernels.
P2P_FAMILIES = frozenset({"sendrecv", "send", "recv"})
#: The "dtype" ProcessGroupNCCL records for a barrier (0 / 0 elements: it moves none of the caller's data).
BARRIER_DTYPE = "Byte"
#: Op -> the name of its fused block under the coalescing manager.
COALESCED_NAMES: dict[str, str] = {row.name: row.coalesced for row in COLLECTIVES.values() if row.coalesced}

#: Each torch.distributed function commtag patches -> the eager "Collective name" ProcessGroupNCCL
#: records for it (a key of :data:`COLLECTIVES`): the tensor forms record the c10d base op's name.
FUNCTION_COLLECTIVES: dict[str, str] = {
    "all_reduce": "allreduce", "all_reduce_coalesced": "allreduce_coalesced", "broadcast": "broadcast",
    "reduce": "reduce", "all_gather": "all_gather", "all_gather_single": "_allgather_base",
    "all_gather_into_tensor": "_allgather_base", "_all_gather_base": "_allgather_base",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_single": "_reduce_scatter_base",
    "reduce_scatter_tensor": "_reduce_scatter_base", "_reduce_scatter_base": "_reduce_scatter_base",
    "all_to_all_single": "all_to_allv", "all_to_all": "all_to_all", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "monitored_barrier": "barrier", "send": SEND, "recv": RECV,
}
#: Each c10d operator commtag describes while a graph is captured, as (namespace, name without
#: overload) -> the eager "Collective name" the same call made eagerly records (a key of :data:`COLLECTIVES`).
#: Functional collectives (``_c10d_functional``) record as the c10d op they lower to.
OPERATOR_COLLECTIVES: dict[tuple[str, str], str] = {
    ("c10d", "allreduce_"): "allreduce",
    ("c10d", "allreduce_coalesced_"): "allreduce_coalesced",
    ("c10d", "broadcast_"): "broadcast",
    ("c10d", "reduce_"): "reduce",
    ("c10d", "allgather_"): "all_gather",
    ("c10d", "_allgather_base_"): "_allgather_base",
    ("c10d", "allgather_into_tensor_coalesced_"): "allgather_into_tensor_coalesced",
    ("c10d", "allgather_coalesced_"): "allgather_coalesced",
    ("c10d", "reduce_scatter_"): "reduce_scatter",
    ("c10d", "_reduce_scatter_base_"): "_reduce_scatter_base",
    ("c10d", "reduce_scatter_tensor_coalesced_"): "reduce_scatter_tensor_coalesced",
    ("c10d", "alltoall_base_"): "all_to_allv",
    ("c10d", "alltoall_"): "all_to_all",
    ("c10d", "gather_"): "gather",
    ("c10d", "scatter_"): "scatter",
    ("c10d", "barrier"): "barrier",
    ("_c10d_functional", "all_reduce"): "allreduce",
    ("_c10d_functional", "all_reduce_"): "allreduce",
    ("_c10d_functional", "all_reduce_coalesced"): "allreduce_coalesced",
    ("_c10d_functional", "all_reduce_coalesced_"): "allreduce_coalesced",
    ("_c10d_functional", "all_gather_into_tensor"): "_allgather_base",
    ("_c10d_functional", "all_gather_into_tensor_out"): "_allgather_base",
    ("_c10d_functional", "all_gather_into_tensor_coalesced"): "allgather_into_tensor_coalesced",
    ("_c10d_functional", "reduce_scatter_tensor"): "_reduce_scatter_base",
    ("_c10d_functional", "reduce_scatter_tensor_out"): "_reduce_scatter_base",
    ("_c10d_functional", "reduce_scatter_tensor_coalesced"): "reduce_scatter_tensor_coalesced",
    ("_c10d_functional", "all_to_all_single"): "all_to_allv",
    ("_c10d_functional", "broadcast"): "broadcast",
    ("_c10d_functional", "broadcast_"): "broadcast",
}

#: Names torch added after 2.13 for calls already in the tables above. ``dist.gather_single``
#: (2.14+; ``gather_into_tensor`` is its alias) records as c10d's gather (docs/nccl2.md §3:
#: "gather (and gather_single / gather_into_tensor) | gather"); the coalesced c10d ops record
#: under their own names (rows above).
FUNCTION_COLLECTIVES.update({"gather_single": "gather", "gather_into_tensor": "gather"})

#: "Collective name" prefix of the records torch's symmetric-memory ops write
#: (``torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu``: each op calls
#: RECORD_PARAM_COMMS with Seq 0, its group's name and description, the own rank, In / Out
#: msg nelems = input / output numel, "[]" splits and rank start / stride -1; the six names below
#: are strings of the torch 2.15.0 wheel's libtorch_cuda.so, their values not seen in a trace). Seq 0 on every
#: call: a symmetric-memory record has no cross-rank identity of its own.
SYMM_MEM_PREFIX = "symm_mem::"
#: Each symmetric-memory record's name -> its row, by the op that writes it
#: (``multimem_all_reduce_``, ``multimem_one_shot_reduce_out`` / ``multimem_one_shot_all_reduce_out``,
#: ``multimem_all_gather_out``, ``one_shot_all_reduce_out_impl``, ``two_shot_all_reduce_impl``,
#: ``reduce_scatter_out``). They launch torch's own kernels, no NCCL (``nccl_kernel`` ""), so they
#: stay out of :data:`COLLECTIVES`. ``multimem_one_shot_reduce`` has no bus-bandwidth factor: the same
#: name records a reduce to one root and (root = every rank in turn) an all-reduce, and the
#: record does not say which, so neither nccl-tests factor is right for both.
SYMM_MEM_COLLECTIVES: dict[str, Collective] = {row.name: row for row in (
    collective_row(SYMM_MEM_PREFIX + "multimem_all_reduce", "allreduce", True, "", "in", "2(n-1)/n", "io", None, "all"),
    collective_row(SYMM_MEM_PREFIX + "one_shot_all_reduce", "allreduce", True, "", "in", "2(n-1)/n", "io", None, "all"),
    collective_row(SYMM_MEM_PREFIX + "two_shot_all_reduce", "allreduce", True, "", "in", "2(n-1)/n", "io", None, "all"),
    collective_row(SYMM_MEM_PREFIX + "multimem_one_shot_reduce", "reduce", True, "", None, None, "io", None, "all"),
    collective_row(SYMM_MEM_PREFIX + "multimem_all_gather", "allgather", True, "", "out", "(n-1)/n", "io", "out = in x n", "all"),
    collective_row(SYMM_MEM_PREFIX + "reduce_scatter", "reducescatter", True, "", "in", "(n-1)/n", "io", "in = out x n", "all"),
)}
#: The busbw no link carries (GB/s): NVLink 5 (B200/GB200) moves 900 GB/s per GPU each way, the
#: fastest GPU link NVIDIA ships; InfiniBand XDR 100 GB/s. A busbw above it was measured on a time
#: that is not the transfer's (a kernel that only signalled, a clipped span): flagged, not reported.
MAX_PLAUSIBLE_BUSBW_GBPS = 1000.0

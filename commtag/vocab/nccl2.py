"""ProcessGroupNCCL2 (nccl2): its record names, keys and Seq rules."""

from __future__ import annotations

from typing import Final, Optional

from commtag.vocab.collectives import COLLECTIVES, RECV, SEND, Collective, collective_row
from commtag.vocab.eager import DST_RANK_KEY, PG_DESC_KEY, RANK_START_KEY, RANK_STRIDE_KEY, SRC_RANK_KEY


# Facts from docs/nccl2.md (§ numbers below), read from the torch 2.15.0
# wheel and pytorch's nccl2 sources; none from a real nccl2 trace (launch/gpu_check.py's nccl2
# step is what settles them on hardware).

#: What a c10d backend object's ``name()`` returns, per implementation (§1: ``kBackendName``).
BACKEND_NCCL = "nccl"
BACKEND_NCCL2 = "nccl2"
BACKEND_NCCL_LAZY = "nccl-lazy"
BACKEND_GLOO = "gloo"
#: The format of a group's eager records: ProcessGroupNCCL's (and commtag's for gloo, which
#: records none) or ProcessGroupNCCL2's (§2, §3).
LEGACY_FORMAT: Final = "legacy"
NCCL2_FORMAT: Final = "nccl2"
#: Backend implementation -> the format its records follow; any other writes the legacy one.
#: nccl-lazy runs its collectives on a primary nccl2 communicator (§4, §6).
RECORD_FORMATS: dict[str, str] = {BACKEND_NCCL2: NCCL2_FORMAT, BACKEND_NCCL_LAZY: NCCL2_FORMAT}
#: The environment variable that picks nccl2 or legacy for ``"nccl"`` (§1): torch 2.14 gives
#: nccl2 only with "1", torch 2.15 gives it unless "0".
USE_NCCL2_ENV = "TORCH_DIST_USE_NCCL2"

#: nccl2's "Collective name" for each legacy one (§3: the string passed to TracingGuard).
#: all_to_allv splits in two by whether the caller gave split lists (§3 alltoall_base rows):
#: :data:`NCCL2_ALLTOALL_EVEN` without, :data:`NCCL2_ALLTOALL_SPLIT` with. The coalesced
#: legacy names become one record per tensor (or pair) under the single op's name (§3).
NCCL2_NAMES: dict[str, str] = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "broadcast": "broadcast", "reduce": "reduce",
    "all_gather": "all_gather", "_allgather_base": "allGatherSingleImpl", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "allGatherSingleImpl", "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduceScatterSingleImpl",
    "reduce_scatter_tensor_coalesced": "reduceScatterSingleImpl", "all_to_all": "all_to_all", "gather": "gather",
    "scatter": "scatter", "barrier": "barrier", SEND: SEND, RECV: RECV,
}
NCCL2_ALLTOALL_EVEN = "allToAllSingleImpl"
NCCL2_ALLTOALL_SPLIT = "all_to_all_v_single"
#: The one record nccl2 writes for a whole ``batch_isend_irecv`` (at ``_end_coalescing``):
#: In / Out msg nelems = the sends' / the receives' total, splits per send / per receive (§3).
NCCL2_BATCH_P2P = "batch_op_issue"
#: Legacy names whose one call nccl2 writes as one record per tensor (or tensor pair), every
#: record with the call's one Seq (§3 coalesced rows, §4) -> the legacy name of one such part.
NCCL2_PER_TENSOR: dict[str, str] = {
    "allreduce_coalesced": "allreduce", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "_allgather_base", "reduce_scatter_tensor_coalesced": "_reduce_scatter_base",
}
#: Keys nccl2 never writes (§2): the description (an empty comm id), rank start and stride
#: (both -1), and the p2p peers (no group ranks to find them in).
NCCL2_OMITTED_KEYS: tuple[str, ...] = (PG_DESC_KEY, RANK_START_KEY, RANK_STRIDE_KEY, DST_RANK_KEY, SRC_RANK_KEY)
#: nccl2's "Process Group Ranks" on every record (§2: stride -1 leaves groupRanks empty).
NCCL2_GROUP_RANKS = "[]"
#: nccl2 writes "Is asynchronized op" = 1 on every record, barrier included (§2).
NCCL2_ALWAYS_ASYNC = True
#: nccl2 p2p (send, recv, batch_op_issue) takes no Seq of its own: it carries the Seq of the
#: group's last collective, 0 before any (§4), so (group, Seq) and Comms Id do not tell a p2p
#: call from that collective or from another p2p call: p2p pairs by its own order.
NCCL2_P2P_NAMES = frozenset({SEND, RECV, NCCL2_BATCH_P2P})
#: Records nccl2 writes that are no collective (§2 "Extra records with no kernel"): a
#: communicator's ``init`` and a Work's ``wait`` (already in :data:`NON_COLLECTIVE_NAMES`).
NCCL2_NON_COLLECTIVES = frozenset({"init", "wait"})

#: One row per nccl2 "Collective name" (see :class:`Collective`). Sizes follow the record's own
#: In / Out msg nelems (§3), which differ from legacy for the list all_gather (the guard's input
#: list is the output list: in = N·n, out = n) and for rooted ops off the root (gather: out 0,
#: scatter: in 0), so these rows are keyed by the nccl2 name and read only for a group whose
#: format is :data:`NCCL2_FORMAT`. Kernels: §3's NCCL calls (the list all_gather and
#: reduce_scatter run N broadcasts / reduces; the even all-to-all ncclAlltoAll). The rooted
#: ops' sizes are the largest over the ranks (the root's), as the analysis reads them.
NCCL2_COLLECTIVES: dict[str, Collective] = {row.name: row for row in (
    collective_row("all_reduce", "allreduce", True, "AllReduce", "in", "2(n-1)/n", "io", None, "all"),
    collective_row("broadcast", "broadcast", False, "Broadcast", "in", "1", "io", None, "rooted"),
    collective_row("reduce", "reduce", False, "Reduce", "in", "1", "io", None, "rooted"),
    collective_row("all_gather", "allgather", True, "Broadcast", "in", "(n-1)/n", "io", "in = out x n", "all"),
    collective_row("allGatherSingleImpl", "allgather", True, "AllGather", "out", "(n-1)/n", "io", "out = in x n", "all"),
    collective_row("reduce_scatter", "reducescatter", True, "Reduce", "in", "(n-1)/n", "io", "in = out x n", "all"),
    collective_row("reduceScatterSingleImpl", "reducescatter", True, "ReduceScatter", "in", "(n-1)/n", "io", "in = out x n",
         "all"),
    collective_row(NCCL2_ALLTOALL_EVEN, "alltoall", True, "AlltoAll", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    collective_row(NCCL2_ALLTOALL_SPLIT, "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    collective_row("all_to_all", "alltoall", True, "SendRecv", "in", "(n-1)/n", "", "sum in = sum out", "all"),
    collective_row("gather", "gather", False, "SendRecv", "out", "(n-1)/n", "i", None, "rooted"),
    collective_row("scatter", "scatter", False, "SendRecv", "in", "(n-1)/n", "o", None, "rooted"),
    collective_row("barrier", "barrier", True, "AllReduce", None, None, "io", None, "all"),
    collective_row(SEND, "send", False, "SendRecv", "in", "1", "io", None, "p2p"),
    collective_row(RECV, "recv", False, "SendRecv", "out", "1", "io", None, "p2p"),
    # No bus bandwidth: one batch's sends and receives go to several peers in sizes of their own.
    collective_row(NCCL2_BATCH_P2P, "sendrecv", False, "SendRecv", None, None, "", None, "p2p"),
)}


#: nccl2 names legacy never writes: a record named so is nccl2's, whatever the sidecar says.
NCCL2_ONLY_NAMES = frozenset(NCCL2_COLLECTIVES) - frozenset(COLLECTIVES)
#: The one name per kind the analysis and summary use for an nccl2 record: the legacy name of
#: the same call (§3), so one job reads the same under either backend; the record's own name
#: stays on its slices. A batch of p2p (no legacy record: legacy writes each op alone) keeps its own.
NCCL2_KINDS: dict[str, str] = {
    **{name: name for name in NCCL2_COLLECTIVES},
    "all_reduce": "allreduce", "allGatherSingleImpl": "_allgather_base",
    "reduceScatterSingleImpl": "_reduce_scatter_base", NCCL2_ALLTOALL_EVEN: "all_to_allv",
    NCCL2_ALLTOALL_SPLIT: "all_to_allv",
}
#: nccl2 names legacy also writes, whose legacy split sizes are always "[]" (LEG) where nccl2's
#: list each tensor's numel (§2): a non-empty split tells nccl2's record apart.
_NCCL2_SPLIT_TELLS = frozenset(NCCL2_COLLECTIVES) - {"all_to_all", "barrier"}


def is_nccl2_record(name: object, in_split: object, out_split: object) -> bool:
    """Is this record_param_comms record (or its kernel's copy) nccl2's? By its name (an engine
    name, §3), else by a split size legacy leaves "[]" (§2). A barrier reads alike in both."""
    if name in NCCL2_ONLY_NAMES:
        return True
    return name in _NCCL2_SPLIT_TELLS and (in_split not in ("[]", None) or out_split not in ("[]", None))


#: Names only legacy writes (its coalesced and c10d names): a record named so is legacy's.
LEGACY_ONLY_NAMES = frozenset(COLLECTIVES) - frozenset(NCCL2_COLLECTIVES)


def content_format(name: object, in_split: object, out_split: object) -> Optional[str]:
    """The format a record's own content shows: NCCL2_FORMAT (:func:`is_nccl2_record`),
    LEGACY_FORMAT (a name only legacy writes, or "[]" splits where nccl2 lists each tensor's
    numel, §2), or None where both write it alike (barrier, the list all_to_all, no split keys)."""
    if is_nccl2_record(name, in_split, out_split):
        return NCCL2_FORMAT
    if name in LEGACY_ONLY_NAMES or (name in _NCCL2_SPLIT_TELLS and in_split == "[]" and out_split == "[]"):
        return LEGACY_FORMAT
    return None


def kernel_row(name: str, in_split: object, out_split: object) -> Optional[Collective]:
    """The catalogue row whose NCCL kernel a record's call runs: nccl2's for an nccl2 record (its
    list all_gather runs broadcasts, its list reduce_scatter reduces, §3), else legacy's; where
    the content does not tell (barrier, all_to_all) both rows name the same kernel."""
    if content_format(name, in_split, out_split) == NCCL2_FORMAT:
        return NCCL2_COLLECTIVES.get(name)
    return COLLECTIVES.get(name) or NCCL2_COLLECTIVES.get(name)


def legacy_view(record_format: object, name: str, in_nelems: int, out_nelems: int,
                group_size: int) -> tuple[str, int, int]:
    """(kind, In msg nelems, Out msg nelems) of a record as legacy writes the same call; an nccl2
    record's differ (§3 against LEG): the list all_gather's guard lists the output as its input
    (N·n / n, legacy n / N·n); off the root, gather writes out 0 and scatter in 0 (legacy: N·n)."""
    if record_format != NCCL2_FORMAT:
        return name, in_nelems, out_nelems
    kind = NCCL2_KINDS.get(name, name)
    if name == "all_gather":
        return kind, out_nelems, in_nelems
    if name == "gather" and out_nelems == 0:
        return kind, in_nelems, in_nelems * group_size
    if name == "scatter" and in_nelems == 0:
        return kind, out_nelems * group_size, out_nelems
    return kind, in_nelems, out_nelems


#: c10d's hook op names (torch 2.15 ``HookOpName``, the name a ProcessGroup pre-hook is given;
#: docs/nccl2.md §7a) -> the eager "Collective name" of the c10d op behind it. Left out:
#: ALLTOALL_BASE (:data:`SPLITS_UNSEEN_HOOK_OP`), SPLIT, NEW_WINDOW and UNKNOWN (no
#: collective). torch 2.14's HookOpName lacks the *_BASE and *_COALESCED members (§7a).
HOOK_OP_COLLECTIVES: dict[str, str] = {
    "ALLREDUCE": "allreduce", "ALLREDUCE_COALESCED": "allreduce_coalesced", "BROADCAST": "broadcast",
    "REDUCE": "reduce", "ALLGATHER": "all_gather", "ALLGATHER_BASE": "_allgather_base",
    "ALLGATHER_COALESCED": "allgather_coalesced", "ALLGATHER_INTO_TENSOR_COALESCED": "allgather_into_tensor_coalesced",
    "REDUCE_SCATTER": "reduce_scatter", "REDUCE_SCATTER_BASE": "_reduce_scatter_base",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter_tensor_coalesced", "ALLTOALL": "all_to_all",
    "GATHER": "gather", "SCATTER": "scatter", "BARRIER": "barrier", "SEND": SEND, "RECV": RECV,
}
#: The hook op name of all_to_all_single, whose split lists (which legacy records, and which
#: pick nccl2's engine, §3) the hook is not given: described by its tensors' sizes, its splits
#: "not recorded" (keys.ANN_SPLITS), under nccl2 as :data:`NCCL2_ALLTOALL_SPLIT`.
SPLITS_UNSEEN_HOOK_OP = "ALLTOALL_BASE"

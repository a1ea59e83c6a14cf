"""The keys the eager profiler writes on a collective (record_param_comms), each named once."""

from __future__ import annotations


# The keys ProcessGroupNCCL's ``record_param_comms`` writes for one collective, each named once
# (their values: docs/eager-metadata.md).
COLLECTIVE_NAME_KEY = "Collective name"
IN_NELEMS_KEY = "In msg nelems"
OUT_NELEMS_KEY = "Out msg nelems"
GROUP_SIZE_KEY = "Group size"
DTYPE_KEY = "dtype"
IN_SPLIT_KEY = "In split size"
OUT_SPLIT_KEY = "Out split size"
RANK_START_KEY = "Global rank start"
RANK_STRIDE_KEY = "Global rank stride"
PG_NAME_KEY = "Process Group Name"
PG_DESC_KEY = "Process Group Description"
#: The group's global ranks as a list string, ``"[0, 2, 4]"`` (read by :func:`commtag.constants.parse_rank_list`).
PG_RANKS_KEY = "Process Group Ranks"
#: The own group rank, the root's (rooted ops) or the peer's (send/recv).
RANK_KEY = "Rank"
DST_RANK_KEY = "Dst Rank"
SRC_RANK_KEY = "Src Rank"
SEQ_KEY = "Seq"
#: The largest Seq a record can carry: the profiler keeps it as an int64 (ParamCommsDebugInfo's
#: ``int64_t sequenceNumber_``, torch/csrc/distributed/c10d/ParamCommsUtils.hpp), though the
#: backends count in uint64 (``Backend::getSequenceNumberForGroup``, c10d/Backend.hpp).
SEQ_LIMIT = (1 << 63) - 1
#: A hash newer profilers add after Seq (of the group name, Seq, p2p-ness and rank start/stride/size):
#: the profiler's own, which commtag does not reproduce.
COMMS_ID_KEY = "Comms Id"
#: Those keys in the profiler's order (the aliases of :class:`commtag.schema.CollectiveAnnotation`'s
#: eager fields, checked there).
EAGER_KEYS: tuple[str, ...] = (
    COLLECTIVE_NAME_KEY, IN_NELEMS_KEY, OUT_NELEMS_KEY, GROUP_SIZE_KEY, DTYPE_KEY, IN_SPLIT_KEY, OUT_SPLIT_KEY,
    RANK_START_KEY, RANK_STRIDE_KEY, PG_NAME_KEY, PG_DESC_KEY, PG_RANKS_KEY, RANK_KEY, DST_RANK_KEY, SRC_RANK_KEY,
    SEQ_KEY,
)
#: The eager keys Kineto copies from the op onto the collective's NCCL kernel, in its order.
KERNEL_EAGER_KEYS: tuple[str, ...] = (
    COLLECTIVE_NAME_KEY, IN_NELEMS_KEY, OUT_NELEMS_KEY, GROUP_SIZE_KEY, DTYPE_KEY, IN_SPLIT_KEY, OUT_SPLIT_KEY,
    PG_NAME_KEY, PG_DESC_KEY, PG_RANKS_KEY, DST_RANK_KEY, SRC_RANK_KEY, SEQ_KEY,
)
#: Eager keys only a point-to-point call carries (its peer's group rank).
P2P_PEER_KEYS: tuple[str, ...] = (DST_RANK_KEY, SRC_RANK_KEY)

"""One job's sidecars, and its CUDA-graph replays, in both formats: legacy ProcessGroupNCCL's and nccl2's.

Why: the merge joins a graph-replayed NCCL kernel (which carries no metadata) to the
annotation commtag's runtime recorded when the collective was captured, and reads
that annotation in its group's format. No GPU here runs nccl2, so the tests that
check a graphed nccl2 job get its traces and sidecars from here, built on the
records of :mod:`commtag.testing.nccl2` (every value cites its source there).

:func:`commtag_keys` adds what commtag's runtime writes beside each record (its own
keys: p2p flag, pair Seq, a batch's peers); :func:`sidecar` is a rank's sidecar for an
eager trace of :func:`commtag.testing.nccl2.job_trace`; :func:`graph_job` is a rank's
trace and sidecar of the job captured once and replayed: Kineto writes each replay
as one ``cudaGraphLaunch`` and the graph's kernels, with its correlation, "graph id"
and "graph node id" (as ``tests/test_graph_match.py`` and the H100 fixtures show) and
no eager keys.
"""

from __future__ import annotations

from typing import Any, Sequence

from commtag.identity import GroupRow, format_list, group_info
from commtag.runtime.describe.nccl2 import nccl2_sizes
from commtag.schema import (
    CapturedCollective, CollectiveAnnotation, GraphCapture, GraphNodeRecord, GraphReplay, ProcessGroupInfo,
    RecordedCollective, Sidecar,
)
from commtag.testing.nccl2 import (
    ASYNC_KEY, BASE_TIME_NS, KERNEL_US, NCCL_VERSION, JobCall, JobGroup, kernel_name, records_per_call, job_trace,
)
from commtag.vocab import (
    ANN_LANE, ANN_LANE_ID, ANN_P2P, ANN_P2P_PAIR_SEQ, ANN_PG_UID, ANN_RECV_PEERS, ANN_SEND_PEERS,
    COLLECTIVE_NAME_KEY, COMMS_OP, CORRELATION_KEY, EXTERNAL_ID_KEY, GRAPH_ID_KEY, GRAPH_NODE_ID_KEY, KERNEL_CATEGORY,
    KERNEL_NODE_TYPE, LEGACY_FORMAT, NCCL2_BATCH_P2P, NCCL2_FORMAT, NCCL2_GROUP_RANKS, P2P_COLLECTIVES, SEND,
)

#: The graph's exec id in every rank's trace, a replay's period and where its launch starts (µs).
GRAPH_ID = 21
REPLAY_US, LAUNCH_US, FIRST_KERNEL_US = 1000.0, 10.0, 50.0
#: A kernel of the graph that is no collective (node 0), as a real step has.
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def _row(group: JobGroup) -> GroupRow:
    return group_info(group.name, group.desc, group.ranks, "nccl")


def commtag_keys(job: Sequence[JobCall], rank: int, fmt: str) -> list[dict[str, object]]:
    """What commtag's runtime adds to each record :func:`commtag.testing.nccl2.records` writes for
    ``rank``, in the same order: the lane, the p2p flag, a send/recv's pair Seq (its place among
    the messages from its source to its destination in the group, counted on both ends), and an
    nccl2 batch_op_issue's peers per send and receive (global ranks; nccl2 writes none)."""
    out: list[dict[str, object]] = []
    pairs: dict[tuple[str, int, int], int] = {}

    def pair_seq(group: JobGroup, src: int, dst: int) -> int:
        key = (group.name, src, dst)
        pairs[key] = pairs.get(key, 0) + 1
        return pairs[key]

    for call, recs in records_per_call(job, rank, fmt):
        row = _row(call.group)
        lane = {ANN_LANE_ID: row.lane_id, ANN_LANE: row.lane_name, ANN_PG_UID: row.uid}
        me = call.group.ranks.index(rank)
        mine = [pair for pair in call.pairs if me in pair]
        if call.op == NCCL2_BATCH_P2P and fmt == NCCL2_FORMAT:
            ranks = call.group.ranks
            out.append({**lane, ANN_P2P: True,
                        ANN_SEND_PEERS: format_list([ranks[dst] for src, dst in mine if src == me]),
                        ANN_RECV_PEERS: format_list([ranks[src] for src, dst in mine if dst == me])})
        elif call.op == NCCL2_BATCH_P2P or call.op in P2P_COLLECTIVES:
            out += [{**lane, ANN_P2P: True, ANN_P2P_PAIR_SEQ: pair_seq(call.group, src, dst)} for src, dst in mine]
        else:
            out += [{**lane, ANN_P2P: False} for _ in recs]
    return out


def rank_annotations(job: Sequence[JobCall], rank: int, fmt: str) -> list[CollectiveAnnotation]:
    """Each record of ``rank`` with commtag's keys, as its runtime's sidecar holds it."""
    recs = [record for _, part in records_per_call(job, rank, fmt) for record in part]
    return [CollectiveAnnotation.model_validate({**{k: v for k, v in record.items() if k != ASYNC_KEY}, **keys})
            for record, keys in zip(recs, commtag_keys(job, rank, fmt))]


def _groups(job: Sequence[JobCall], rank: int, fmt: str) -> list[ProcessGroupInfo]:
    """The rank's group table, each group with its backend implementation and record format."""
    seen = {call.group.name: call.group for call in job if rank in call.group.ranks}
    impl = {"cuda": "nccl2" if fmt == NCCL2_FORMAT else "nccl"}
    return [ProcessGroupInfo(uid=row.uid, name=row.name, desc=row.desc, ranks=row.ranks, backend="nccl",
                             lane_id=row.lane_id, lane_name=row.lane_name, backend_impls=impl, record_format=fmt)
            for row in map(_row, seen.values())]


def _head(rank: int, world: int, fmt: str) -> dict[str, Any]:
    return dict(run_id="nccl2-generator", rank=rank, world_size=world, host="node0", pid=1000 + rank,
                torch_version="2.15.0", nccl_version=NCCL_VERSION, trace_file=f"rank{rank}.pt.trace.json.gz")


def sidecar(job: Sequence[JobCall], rank: int, world: int, fmt: str, skew_us: float = 0.0) -> Sidecar:
    """The sidecar commtag's runtime writes beside :func:`job_trace` (same ``skew_us``): each
    record's annotation over its record_param_comms op's span."""
    ops = [e for e in job_trace(job, rank, world, fmt, skew_us)["traceEvents"] if e["name"] == COMMS_OP]
    recorded = []
    for op, annotation in zip(ops, rank_annotations(job, rank, fmt)):
        start = BASE_TIME_NS + int(op["ts"] * 1000)
        recorded.append(RecordedCollective(annotation=annotation, start_ns=start, end_ns=start + int(op["dur"] * 1000),
                                           tid=op["tid"]))
    return Sidecar(**_head(rank, world, fmt), process_groups=_groups(job, rank, fmt), collectives=recorded)


def _kernels(record: dict[str, object], fmt: str, size: int) -> list[str]:
    """The NCCL kernels one record's call runs (note §3): nccl2's list all_gather N broadcasts, its
    list reduce_scatter N reduces (§8.2 leaves the count unverified); otherwise one."""
    name = kernel_name(record, fmt)
    many = fmt == NCCL2_FORMAT and record[COLLECTIVE_NAME_KEY] in ("all_gather", "reduce_scatter")
    return [name] * (size if many else 1)


def graph_job(job: Sequence[JobCall], rank: int, world: int, fmt: str, replays: int = 3,
              skew_us: float = 0.0) -> tuple[dict, Sidecar]:
    """Rank ``rank``'s trace and sidecar of ``job`` captured in one CUDA graph before the profile
    and replayed ``replays`` times in it. Each replay's launch starts ``skew_us`` later on this rank
    than on a rank without skew; each record's kernels run in one slot ending at the same instant on
    every rank (its several kernels split the slot). The capture holds a GEMM (node 0), then each
    record's kernels in call order (a legacy batch: one kernel its ops' records share); its
    annotations carry the capture id."""
    pid, stream = 1000 + rank, 7
    per_call = records_per_call(job, rank, fmt)
    anns = iter(rank_annotations(job, rank, fmt))
    collectives, index = [], 1
    #: Each call's kernel nodes, in call order (what a replay runs, one slot per call).
    slots: list[list[GraphNodeRecord]] = []
    for call, part in per_call:
        shared: list[GraphNodeRecord] = []
        if fmt == LEGACY_FORMAT and call.op == NCCL2_BATCH_P2P:
            # A legacy batch: one grouped launch for all its ops (docs/cuda-graphs.md: the
            # graph runs what capture launched; docs/eager-metadata.md "Where it is written": the batch's kernels
            # launch at group end): one SendRecv kernel (vocab.kernels' name for send/recv), a node
            # every op's record shares. That a captured batch is one kernel node is unverified
            # (docs/cuda-graphs.md, "Batched p2p").
            shared = [GraphNodeRecord(index=index, node_type=KERNEL_NODE_TYPE,
                                      kernel_name=kernel_name({COLLECTIVE_NAME_KEY: SEND}, fmt))]
            index += 1
            slots.append(shared)
        for record, ann in zip(part, anns):
            nodes = shared
            if not shared:
                nodes = []
                for name in _kernels(record, fmt, len(call.group.ranks)):
                    nodes.append(GraphNodeRecord(index=index, node_type=KERNEL_NODE_TYPE, kernel_name=name))
                    index += 1
                slots.append(nodes)
            collectives.append(CapturedCollective(annotation=ann.model_copy(update={"capture_id": 0}),
                                                  nodes=list(nodes), tid=pid))
    events: list[dict] = []
    logged = []
    for r in range(replays):
        corr = 9000 + r
        at = 100.0 + r * REPLAY_US + skew_us
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": pid, "tid": pid, "ts": at,
                       "dur": LAUNCH_US, "args": {CORRELATION_KEY: corr, EXTERNAL_ID_KEY: corr}})
        logged.append(GraphReplay(index=r, start_ns=BASE_TIME_NS + int((at - 1.0) * 1000),
                                  end_ns=BASE_TIME_NS + int((at + LAUNCH_US + 1.0) * 1000), tid=pid))
        slot = 100.0 + r * REPLAY_US + FIRST_KERNEL_US
        for replayed in [None, *slots]:
            names = [GEMM] if replayed is None else [node.kernel_name for node in replayed]
            first = 0 if replayed is None else replayed[0].index
            piece = KERNEL_US / len(names)
            for k, name in enumerate(names):
                events.append({"ph": "X", "cat": KERNEL_CATEGORY, "name": name, "pid": rank, "tid": stream,
                               "ts": slot + k * piece, "dur": piece,
                               "args": {EXTERNAL_ID_KEY: corr, CORRELATION_KEY: corr, "device": rank, "stream": stream,
                                        GRAPH_ID_KEY: GRAPH_ID, GRAPH_NODE_ID_KEY: first + k}})
            slot += KERNEL_US + 10.0
    trace = {**job_trace(job, rank, world, fmt), "traceEvents": events}
    capture = GraphCapture(capture_id=0, exec_graph_id=GRAPH_ID, start_ns=BASE_TIME_NS + 10_000,
                           end_ns=BASE_TIME_NS + 20_000, total_nodes=index, collectives=collectives, replays=logged)
    return trace, Sidecar(**_head(rank, world, fmt), process_groups=_groups(job, rank, fmt), collectives=[],
                          captures=[capture])



def as_nccl2(annotation: CollectiveAnnotation, own_rank: int) -> CollectiveAnnotation:
    """A legacy annotation as nccl2 writes the same call (note §2-3, through the rule the runtime
    uses, :func:`commtag.runtime.describe.nccl2.nccl2_sizes`): its engine name, sizes and per-tensor
    splits, "[]" ranks, no description, rank start / stride or Dst / Src Rank. For a sidecar of a
    real legacy run (the H100 fixtures) turned into the sidecar an nccl2 group would have given;
    ``own_rank``: the recording rank's group rank (legacy's "Rank" is a rooted op's root)."""
    sizes = nccl2_sizes(annotation.collective_name, annotation.in_msg_nelems, annotation.out_msg_nelems,
                        annotation.in_split_size, annotation.out_split_size, annotation.group_size,
                        annotation.rank, own_rank)
    if sizes is None:
        raise ValueError(f"{annotation.collective_name!r}: nccl2 writes it as several records")
    return annotation.model_copy(update={
        "collective_name": sizes.collective, "in_msg_nelems": sizes.in_nelems, "out_msg_nelems": sizes.out_nelems,
        "in_split_size": sizes.in_split, "out_split_size": sizes.out_split, "pg_ranks": NCCL2_GROUP_RANKS,
        **{field: None for field in ("pg_desc", "global_rank_start", "global_rank_stride", "dst_rank", "src_rank")}})

"""Replay matching on exact-format Kineto events (no GPU trace with graph node ids exists yet).

The events below follow what Kineto writes for a graph replay (see the
public H100 trace in edge-cases/ for the key set): one ``cudaGraphLaunch``
runtime event and the replay's kernels/copies sharing its ``correlation``,
each with ``"graph id"`` and ``"graph node id"``.
"""

from __future__ import annotations

import itertools
from typing import Optional

import pytest

from commtag.merge.rank.captures import comm_nodes, index_node_id
from commtag.merge.rank.replays import match_graph_replays
from commtag.schema import (
    CapturedCollective,
    CollectiveAnnotation,
    GraphCapture,
    GraphNodeRecord,
    GraphReplay,
)
from commtag.vocab import base_name, nccl_kind, nccl_symmetric, parse_nccl_kernel

BASE_NS = 1_775_078_550_000_000_000
TID = 514683
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"
AG = "ncclDevKernel_AllGather_RING_LL"
TRACE_ARGS = "(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


def _ann(name: str, seq: int, dtype: str, pg: str = "0", capture_id: int = 0) -> CollectiveAnnotation:
    return CollectiveAnnotation(
        collective_name=name, in_msg_nelems=4096, out_msg_nelems=4096, group_size=2, dtype=dtype,
        pg_name=pg, pg_desc="default_pg" if pg == "0" else "tp", pg_ranks="[0, 1]", rank=0, seq=seq,
        lane_id=60 + int(pg), lane_name=f"PG {pg}", pg_uid=f"{pg}:abc", capture_id=capture_id,
    )


def _capture(capture_id: int = 0, names: bool = True, exec_graph_id: Optional[int] = None,
             tools_graph: Optional[int] = None, replays: tuple[tuple[int, int], ...] = (), dtype_rs: str = "BFloat16") -> GraphCapture:
    """Capture order: gemm(0) allreduce(1) relu(2) reduce_scatter(3) gemm(4)."""

    def node(index: int, name: str) -> GraphNodeRecord:
        return GraphNodeRecord(index=index, node_type="kernel", kernel_name=name if names else "",
                               tools_id=None if tools_graph is None else (tools_graph << 32) | index)

    return GraphCapture(
        capture_id=capture_id, exec_graph_id=exec_graph_id, start_ns=BASE_NS - 10**9, end_ns=BASE_NS - 10**9 + 5000,
        total_nodes=5,
        collectives=[
            CapturedCollective(annotation=_ann("allreduce", 7, "Float", capture_id=capture_id), nodes=[node(1, AR)], reduce_op="sum"),
            CapturedCollective(annotation=_ann("_reduce_scatter_base", 3, dtype_rs, pg="1", capture_id=capture_id),
                               nodes=[node(3, RS)], reduce_op="sum"),
        ],
        replays=[GraphReplay(index=i, start_ns=BASE_NS + round(t * 1000) - 2000, end_ns=BASE_NS + round(t * 1000) + 30_000, tid=TID)
                 for i, t in replays],
    )


class Trace:
    """Builds one rank's traceEvents the way Kineto writes a graph replay."""

    def __init__(self) -> None:
        self.events: list[dict] = [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": TID, "tid": 0, "args": {"name": "python"}},
        ]
        self._corr = itertools.count(5000)

    def replay(self, ts: float, graph_id: int, nodes: list[tuple[str, int]], packed: bool = False, tid: int = TID,
               launch: str = "cudaGraphLaunch", launch_cat: str = "cuda_runtime") -> int:
        corr = next(self._corr)
        self.events.append({"ph": "X", "cat": launch_cat, "name": launch, "pid": TID, "tid": tid,
                            "ts": ts, "dur": 12.5, "args": {"External id": corr, "cbid": 311, "correlation": corr}})
        start = ts + 20.0
        for name, node_id in nodes:
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
            full = name if cat != "kernel" or name == GEMM else name + TRACE_ARGS
            self.events.append({
                "ph": "X", "cat": cat, "name": full, "pid": 0, "tid": 7, "ts": start, "dur": 8.0,
                "args": {"External id": corr, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": corr,
                         "registers per thread": 96, "shared memory": 0, "blocks per SM": 0.5, "warps per SM": 2.0,
                         "grid": [2, 1, 1], "block": [512, 1, 1], "est. achieved occupancy %": 3,
                         "graph id": graph_id, "graph node id": ((graph_id << 32) | node_id) if packed else node_id},
            })
            start += 10.0
        return corr


FULL_REPLAY = [(GEMM, 0), (AR, 1), ("void at::native::relu_kernel", 2), (RS, 3), (GEMM, 4)]


def _annotated(events: list[dict], result) -> list[tuple]:
    """(name, Seq, replay, capture id, method) of every match, in event order."""
    def name(event: dict) -> str:
        return base_name(event["name"]) if event["cat"] == "kernel" else event["name"]

    return [(name(m.event), m.annotation.seq, m.annotation.replay, m.annotation.capture_id, m.method)
            for m in result.matches]


@pytest.mark.parametrize("packed", [False, True])
def test_node_ids_equal_to_creation_index_give_exact_matches_in_both_encodings(packed: bool) -> None:
    trace = Trace()
    trace.replay(1000.0, 21, FULL_REPLAY, packed=packed)
    trace.replay(2000.0, 21, FULL_REPLAY, packed=packed)
    capture = _capture(replays=((4, 1000.0), (5, 2000.0)))
    result = match_graph_replays(trace.events, [capture], BASE_NS)
    assert result.unmatched == []
    assert _annotated(trace.events, result) == [
        (AR, 7, 4, 0, "node-id"), (RS, 3, 4, 0, "node-id"),
        (AR, 7, 5, 0, "node-id"), (RS, 3, 5, 0, "node-id"),
    ]
    args = result.matches[0].args()
    assert args["Collective name"] == "allreduce" and args["Seq"] == 7 and args["commtag replay"] == 4
    assert args["commtag capture id"] == 0 and args["commtag match"] == "node-id"
    # What every member rank names the instance by: (group uid, p2p, capture Seq, replay index)
    a = result.matches[0].annotation
    assert (a.pg_uid, a.is_p2p, a.seq, a.replay) == ("0:abc", False, 7, 4)
    # The events themselves are untouched: attaching is the caller's job.
    assert all("Collective name" not in e.get("args", {}) for e in trace.events)


def test_tools_ids_match_exactly_and_pick_the_capture_by_exec_graph_id() -> None:
    trace = Trace()
    trace.replay(1000.0, 111, FULL_REPLAY, packed=True)
    capture = _capture(exec_graph_id=111, tools_graph=11, replays=((0, 1000.0),))
    other = _capture(capture_id=1, exec_graph_id=112, tools_graph=12)
    result = match_graph_replays(trace.events, [other, capture], BASE_NS)
    assert [(n, s, r, c, m) for n, s, r, c, m in _annotated(trace.events, result)] == [
        (AR, 7, 0, 0, "tools-id"), (RS, 3, 0, 0, "tools-id")]


def test_without_node_ids_the_replay_is_matched_by_order_confirmed_by_names() -> None:
    trace = Trace()
    trace.replay(1000.0, 0, [(n, 0) for n, _ in FULL_REPLAY])  # no graph node ids (all 0)
    result = match_graph_replays(trace.events, [_capture(replays=((2, 1000.0),))], BASE_NS)
    assert _annotated(trace.events, result) == [(AR, 7, 2, 0, "order"), (RS, 3, 2, 0, "order")]


def test_node_ids_that_do_not_follow_creation_order_fall_back_to_order() -> None:
    # Hypothesis 1 wrong: ids are offset by one. The node-id join hits the wrong kernels,
    # their names refute it, and the replay is matched by order instead.
    trace = Trace()
    trace.replay(1000.0, 21, [(n, i + 1) for n, i in FULL_REPLAY])
    result = match_graph_replays(trace.events, [_capture(replays=((0, 1000.0),))], BASE_NS)
    assert [m for *_, m in _annotated(trace.events, result)] == ["order", "order"]
    assert [n for n, *_ in _annotated(trace.events, result)] == [AR, RS]


def test_a_replay_with_an_uncaptured_nccl_kernel_is_reported_and_left_unannotated() -> None:
    trace = Trace()
    good = trace.replay(1000.0, 0, [(n, 0) for n, _ in FULL_REPLAY])
    bad = trace.replay(2000.0, 0, [(n, 0) for n, _ in FULL_REPLAY] + [(AG, 0)])
    result = match_graph_replays(trace.events, [_capture(replays=((0, 1000.0), (1, 2000.0)))], BASE_NS)
    assert {m.event["args"]["correlation"] for m in result.matches} == {good}
    (unmatched,) = result.unmatched
    assert unmatched.correlation == bad and unmatched.capture_id == 0
    assert "3 NCCL kernels in the replay, 2 captured" in unmatched.reason


def test_without_captured_names_the_kernel_dtype_and_op_must_agree() -> None:
    trace = Trace()
    trace.replay(1000.0, 0, [(n, 0) for n, _ in FULL_REPLAY])
    # Captured as Float data, but the replayed kernel reduces bf16: refuse, do not guess.
    capture = _capture(names=False, dtype_rs="Float", replays=((0, 1000.0),))
    result = match_graph_replays(trace.events, [capture], BASE_NS)
    assert result.matches == []
    assert "BFloat16 kernel for Float data" in result.unmatched[0].reason
    # With the right dtype the same replay matches on the trace's names alone.
    ok = match_graph_replays(trace.events, [_capture(names=False, replays=((0, 1000.0),))], BASE_NS)
    assert [m for *_, m in _annotated(trace.events, ok)] == ["order", "order"]


def test_replay_log_tells_interleaved_graphs_apart() -> None:
    trace = Trace()
    one = [(GEMM, 0), (AR, 1), ("void at::native::relu_kernel", 2), (RS, 3), (GEMM, 4)]
    trace.replay(1000.0, 21, one)
    trace.replay(1100.0, 22, one)
    trace.replay(1200.0, 21, one)
    a = _capture(0, replays=((10, 1000.0), (11, 1200.0)))
    b = _capture(1, replays=((0, 1100.0),))
    result = match_graph_replays(trace.events, [a, b], BASE_NS)
    got = [(c, r) for _, _, r, c, _ in _annotated(trace.events, result)]
    assert got == [(0, 10), (0, 10), (1, 0), (1, 0), (0, 11), (0, 11)]
    assert result.unmatched == []


def test_a_launch_on_another_thread_than_the_logged_replay_is_not_taken_for_it() -> None:
    trace = Trace()
    trace.replay(1000.0, 21, FULL_REPLAY, tid=TID + 1)
    result = match_graph_replays(trace.events, [_capture(replays=((0, 1000.0),))], BASE_NS)
    assert result.matches == []
    assert "NCCL kernels in a replay that matches no capture" in result.unmatched[0].reason


def test_without_a_log_a_unique_capture_is_used_with_trace_relative_indices() -> None:
    trace = Trace()
    trace.replay(1000.0, 21, FULL_REPLAY)
    trace.replay(2000.0, 21, FULL_REPLAY)
    result = match_graph_replays(trace.events, [_capture()], BASE_NS)
    assert [r for _, _, r, _, _ in _annotated(trace.events, result)] == [0, 0, 1, 1]
    assert any("count its replays within this trace" in note for note in result.notes)


def test_two_captures_that_fit_a_replay_equally_are_never_guessed_between() -> None:
    trace = Trace()
    trace.replay(1000.0, 21, FULL_REPLAY)
    result = match_graph_replays(trace.events, [_capture(0), _capture(1)], BASE_NS)
    assert result.matches == []
    assert "fits captures [0, 1] equally" in result.unmatched[0].reason


def test_old_nccl_kernel_names_confirm_too() -> None:
    old_ar = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
    trace = Trace()
    trace.events.append({})  # unrelated junk must not disturb indices
    corr = trace.replay(1000.0, 0, [(GEMM, 0)])
    trace.events[-1]["name"] = GEMM
    trace.events.append({**trace.events[-1], "name": old_ar, "ts": 1100.0})
    capture = _capture(names=False, replays=((0, 1000.0),))
    capture.collectives.pop()  # only the allreduce was captured
    result = match_graph_replays(trace.events, [capture], BASE_NS)
    (match,) = result.matches
    assert match.event["name"] == old_ar and match.method == "order"
    assert match.event["args"]["correlation"] == corr


def test_copies_of_a_collective_are_matched_by_node_id_and_left_out_by_order_with_a_note() -> None:
    # World size 1: an out-of-place all_gather is a device-to-device copy, no NCCL kernel.
    copy_collective = CapturedCollective(annotation=_ann("_allgather_base", 8, "Float"),
                                         nodes=[GraphNodeRecord(index=2, node_type="memcpy")])
    capture = _capture(replays=((0, 1000.0), (1, 2000.0)))
    capture.collectives.insert(1, copy_collective)
    trace = Trace()
    trace.replay(1000.0, 21, [(GEMM, 0), (AR, 1), ("Memcpy DtoD (Device -> Device)", 2), (RS, 3), (GEMM, 4)])
    trace.replay(2000.0, 0, [(GEMM, 0), (AR, 0), ("Memcpy DtoD (Device -> Device)", 0), (RS, 0), (GEMM, 0)])
    result = match_graph_replays(trace.events, [capture], BASE_NS)
    # Without node ids a copy has no name to confirm its place: the kernels are placed, the copy is not.
    assert [(n, r, m) for n, _, r, _, m in _annotated(trace.events, result)] == [
        (AR, 0, "node-id"), ("Memcpy DtoD (Device -> Device)", 0, "node-id"), (RS, 0, "node-id"),
        (AR, 1, "order"), (RS, 1, "order")]
    assert result.unmatched == []
    assert any("1 copy/memset node(s) of its collectives stay unannotated" in note for note in result.notes)


def test_replays_of_graphs_without_collectives_are_counted_not_reported() -> None:
    trace = Trace()
    trace.replay(1000.0, 30, [(GEMM, 0), (GEMM, 1)])
    result = match_graph_replays(trace.events, [_capture(replays=((0, 5000.0),))], BASE_NS)
    assert result.matches == [] and result.unmatched == [] and result.plain_replays == 1


def test_kernel_names_parse_in_every_spelling() -> None:
    mangled = f"_Z{len(AR)}{AR}24ncclDevKernelArgsStorageILm4096EE"
    assert base_name(mangled) == base_name(AR + TRACE_ARGS) == AR
    assert base_name("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float>>(int, float)") == \
        base_name("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13AUnaryFunctorIfEEEEviT0_") == \
        "at::native::vectorized_elementwise_kernel"
    assert (p := parse_nccl_kernel(AR + TRACE_ARGS)) and (p.collective, p.op, p.dtype) == ("AllReduce", "sum", "Float")
    assert (p := parse_nccl_kernel(RS)) and (p.collective, p.op, p.dtype) == ("ReduceScatter", "sum", "BFloat16")
    assert (p := parse_nccl_kernel(AG + TRACE_ARGS)) and (p.collective, p.op, p.dtype) == ("AllGather", None, None)
    old_bcast = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"
    assert (p := parse_nccl_kernel(old_bcast)) and (p.collective, p.dtype) == ("Broadcast", None)  # bytes, not data type
    assert parse_nccl_kernel("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)").collective == "Generic"
    assert parse_nccl_kernel(GEMM) is None


def test_a_collective_nodes_id_under_hypothesis_1_is_its_creation_index() -> None:
    capture = _capture()
    ids = {index_node_id(n): (cc.annotation.seq, n.kernel_name) for cc in capture.collectives for n in comm_nodes(cc)}
    assert ids == {1: (7, AR), 3: (3, RS)}


def test_attach_matches_exactly_then_replay_by_replay_and_every_annotated_kernel_says_how() -> None:
    from commtag.merge.rank.attach import RankFlows, attach
    from commtag.merge.rank.replays import match
    from commtag.schema import ProcessGroupInfo, Sidecar

    trace = Trace()
    trace.replay(1000.0, 21, FULL_REPLAY)                              # node ids follow creation order
    trace.replay(2000.0, 21, [(n, 0) for n, _ in FULL_REPLAY])         # no node ids: order
    trace.replay(3000.0, 21, [(n, 0) for n, _ in FULL_REPLAY] + [(AG, 0)])  # unmatchable
    sidecar = Sidecar(
        run_id="r", rank=0, world_size=2, host="h", pid=1, torch_version="2.11", trace_file="t.json",
        process_groups=[ProcessGroupInfo(uid=f"{pg}:abc", name=pg, desc="d", ranks=[0, 1], lane_id=60 + int(pg), lane_name=f"PG {pg}")
                        for pg in ("0", "1")],
        collectives=[],
        captures=[_capture(replays=((0, 1000.0), (1, 2000.0), (2, 3000.0)))],  # driver 13.0: no exec graph id
    )
    doc = {"baseTimeNanoseconds": BASE_NS, "traceEvents": trace.events}
    kernels = [e for e in trace.events if e.get("cat") == "kernel"]
    launches = {e["args"]["correlation"]: e for e in trace.events if e.get("cat") == "cuda_runtime"}
    unmatched = match(kernels, launches, sidecar.captures, BASE_NS).unmatched
    instances = attach(0, doc, sidecar, RankFlows(0))
    graphed = sorted((i.replay, i.collective, i.seq, i.arg("commtag match")) for i in instances if i.source == "graph-replay")
    assert graphed == [(0, "_reduce_scatter_base", 3, "node-id"), (0, "allreduce", 7, "node-id"),
                       (1, "_reduce_scatter_base", 3, "order"), (1, "allreduce", 7, "order")]
    kernels = [e for e in trace.events if e.get("cat") == "kernel" and "Collective name" in e["args"]]
    assert {e["args"]["commtag match"] for e in kernels} == {"node-id", "order"}
    assert [u.reason for u in unmatched] == ["3 NCCL kernels in the replay, 2 captured"]


# ---------------------------------------------------------------------------- through the merge


def _sidecar(captures: list[GraphCapture]):
    from commtag.schema import ProcessGroupInfo, Sidecar

    return Sidecar(
        run_id="r", rank=0, world_size=2, host="h", pid=1, torch_version="2.11", trace_file="rank0.pt.trace.json",
        process_groups=[ProcessGroupInfo(uid=f"{pg}:abc", name=pg, desc="d", ranks=[0, 1], lane_id=60 + int(pg),
                                         lane_name=f"PG {pg}") for pg in ("0", "1")],
        collectives=[], captures=captures,
    )


def _merged_replays(tmp_path, trace: Trace, captures: list[GraphCapture]) -> list[tuple]:
    """Merge one rank's trace and sidecar as a user would; (replay, collective, Seq, how matched)
    of every graph-replayed instance, and the instances from metadata-less NCCL kernels."""
    import orjson

    from merging import merge

    (tmp_path / "rank0.pt.trace.json").write_bytes(orjson.dumps({"baseTimeNanoseconds": BASE_NS,
                                                                  "traceEvents": trace.events}))
    (tmp_path / "rank0.commtag.json").write_text(_sidecar(captures).model_dump_json(by_alias=True))
    result = merge([tmp_path], tmp_path / "merged.pftrace")
    return sorted((i.replay, i.collective, i.seq, i.arg("commtag match") or i.source) for i in result.instances)


@pytest.mark.parametrize("launch, category", [("hipGraphLaunch", "cuda_runtime"), ("cuGraphLaunch", "cuda_driver"),
                                              ("cudaGraphLaunch_v10000", "cuda_runtime")])
def test_every_graph_launch_name_reaches_order_matching(tmp_path, launch: str, category: str) -> None:
    """HIP's and the driver's graph launches are graph launches too (commtag.vocab): a replay
    without node ids is matched by order whatever launched it, not left as unattributed kernels."""
    trace = Trace()
    trace.replay(1000.0, 0, [(n, 0) for n, _ in FULL_REPLAY], launch=launch, launch_cat=category)
    assert _merged_replays(tmp_path, trace, [_capture(replays=((2, 1000.0),))]) == [
        (2, "_reduce_scatter_base", 3, "order"), (2, "allreduce", 7, "order")]


def test_a_launch_at_the_tolerance_from_its_logged_replay_is_that_replay_on_both_joins(tmp_path) -> None:
    """One tolerance for launch vs logged replay() (vocab.LAUNCH_TOLERANCE_NS), whether the kernels
    are joined by node id or by order: a launch exactly that far before its logged call is that
    replay (5, 6), not the first replay of the trace."""
    from commtag.vocab import LAUNCH_TOLERANCE_NS

    trace = Trace()
    trace.replay(1000.0, 21, FULL_REPLAY)                       # node ids: the exact join
    trace.replay(2000.0, 21, [(n, 0) for n, _ in FULL_REPLAY])  # none: order
    capture = _capture().model_copy(update={"graph_id": 21, "replays": [
        GraphReplay(index=5, start_ns=BASE_NS + 1_000_000 + LAUNCH_TOLERANCE_NS, end_ns=BASE_NS + 1_100_000, tid=TID),
        GraphReplay(index=6, start_ns=BASE_NS + 1_900_000, end_ns=BASE_NS + 2_000_000 - LAUNCH_TOLERANCE_NS, tid=TID),
    ]})
    assert _merged_replays(tmp_path, trace, [capture]) == [
        (5, "_reduce_scatter_base", 3, "node-id"), (5, "allreduce", 7, "node-id"),
        (6, "_reduce_scatter_base", 3, "order"), (6, "allreduce", 7, "order")]


def test_a_launch_just_beyond_the_tolerance_is_not_taken_for_the_logged_replay() -> None:
    from commtag.vocab import LAUNCH_TOLERANCE_NS

    trace = Trace()
    trace.replay(1000.0, 0, [(n, 0) for n, _ in FULL_REPLAY])
    capture = _capture().model_copy(update={"replays": [GraphReplay(
        index=5, start_ns=BASE_NS + 1_000_000 + LAUNCH_TOLERANCE_NS + 1, end_ns=BASE_NS + 1_100_000, tid=TID)]})
    result = match_graph_replays(trace.events, [capture], BASE_NS)
    assert result.matches == [] and [u.reason for u in result.unmatched] == [
        "NCCL kernels in a replay that matches no capture"]


#: NCCL's symmetric-memory kernels as src/device/symmetric/generate.py names them
#: (ncclSymkDevKernel_<Coll>_<Algo>[_<red>_<ty>]), with the argument Kineto prints.
SYMK_AR = "ncclSymkDevKernel_AllReduce_RSxLDMC_AGxSTMC_sum_f32"
SYMK_RS = "ncclSymkDevKernel_ReduceScatter_LL_sum_bf16"
SYMK_ARGS = "(ncclSymkDevWorkArgs4K)"


def test_symmetric_kernel_names_parse_in_every_spelling() -> None:
    for name, parsed in [
        (SYMK_AR + SYMK_ARGS, ("AllReduce", "sum", "Float")),
        ("ncclSymkDevKernel_AllReduce_RSxLDMC_AGxSTMC_sum_f8e5m2", ("AllReduce", "sum", "Float8_e5m2")),
        ("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f16", ("AllReduce", "sum", "Half")),
        (SYMK_RS, ("ReduceScatter", "sum", "BFloat16")),
        ("ncclSymkDevKernel_AllGather_LL" + SYMK_ARGS, ("AllGather", None, None)),
        ("ncclSymkDevKernel_AllGather_GinHier_MCRing", ("AllGather", None, None)),
        (f"_Z{len(SYMK_RS)}{SYMK_RS}21ncclSymkDevWorkArgs4K", ("ReduceScatter", "sum", "BFloat16")),
    ]:
        p = parse_nccl_kernel(name)
        assert p == parsed and nccl_symmetric(name), name
        assert nccl_kind(name) == parsed[0].lower()
    assert not nccl_symmetric(AR) and not nccl_symmetric(GEMM)


def test_a_replay_of_symmetric_kernels_is_matched_by_order_confirmed_by_names() -> None:
    trace = Trace()
    trace.replay(1000.0, 0, [(GEMM, 0), (SYMK_AR, 0), ("void at::native::relu_kernel", 0), (SYMK_RS, 0), (GEMM, 0)])
    result = match_graph_replays(trace.events, [_capture(names=False, replays=((0, 1000.0),))], BASE_NS)
    assert _annotated(trace.events, result) == [(SYMK_AR, 7, 0, 0, "order"), (SYMK_RS, 3, 0, 0, "order")]
    assert result.unmatched == []

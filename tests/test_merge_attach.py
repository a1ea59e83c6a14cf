"""Attach on events in the exact Kineto format: graph replays by node id (both encodings); which events it reads."""

from __future__ import annotations

import gzip

import orjson
import pytest

from commtag.merge.rank.attach import RankFlows, args_decide, attach, is_candidate
from commtag.merge.rank.captures import CapturedKernels
from commtag.merge.records import Interner
from commtag.schema import (
    CapturedCollective, CollectiveAnnotation, GraphCapture, GraphNodeRecord, GraphReplay, ProcessGroupInfo,
    RecordedCollective,
    Sidecar,
)
from commtag.testing import PUBLIC_TRACES
from commtag.vocab import family

BASE = 1_700_000_000_000_000_000
GRAPH, EXEC = 7, 9


def _annotation(seq: int, name: str = "allreduce") -> CollectiveAnnotation:
    return CollectiveAnnotation.model_validate({
        "Collective name": name, "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 2,
        "dtype": "Float", "Process Group Name": "0", "Process Group Description": "default_pg",
        "Process Group Ranks": "[0, 1]", "Rank": 0, "Seq": seq, "commtag lane id": 60,
        "commtag lane": "PG 0 (default_pg) [0, 1]", "commtag pg uid": "0:abc", "commtag capture id": 0,
    })


def _sidecar(replays: list[GraphReplay]) -> Sidecar:
    capture = GraphCapture(
        capture_id=0, graph_id=GRAPH, exec_graph_id=EXEC, start_ns=BASE, end_ns=BASE + 1000, total_nodes=6,
        collectives=[
            CapturedCollective(annotation=_annotation(5), nodes=[GraphNodeRecord(index=2, node_type="kernel")]),
            CapturedCollective(annotation=_annotation(6, "_allgather_base"),
                               nodes=[GraphNodeRecord(index=4, node_type="kernel")]),
        ],
        replays=replays,
    )
    return Sidecar(
        run_id="t", rank=0, world_size=2, host="h", pid=1, torch_version="2.13", trace_file="rank0.json",
        process_groups=[ProcessGroupInfo(uid="0:abc", name="0", desc="default_pg", ranks=[0, 1], backend="nccl",
                                         lane_id=60, lane_name="PG 0 (default_pg) [0, 1]")],
        collectives=[], captures=[capture],
    )


def _trace(packed: bool) -> dict:
    """Two replays of a 6-node graph: nodes 0..5, NCCL kernels at node 2 and 4."""
    events = []
    for replay, corr in enumerate((500, 600)):
        t0 = 1000.0 + replay * 100
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1,
                       "ts": t0, "dur": 5.0, "args": {"correlation": corr, "External id": corr}})
        for node in range(6):
            nccl = node in (2, 4)
            name = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL" if node == 2 else "ncclDevKernel_AllGather_RING_LL") \
                if nccl else f"gemm_{node}"
            events.append({
                "ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t0 + 10 + node * 10,
                "dur": 8.0, "args": {"device": 0, "stream": 7, "correlation": corr, "graph id": EXEC,
                                     "graph node id": (EXEC << 32 | node) if packed else node},
            })
    return {"traceEvents": events, "baseTimeNanoseconds": BASE, "distributedInfo": {"rank": 0, "world_size": 2}}


@pytest.mark.parametrize("packed", [True, False], ids=["graph<<32|node", "node only"])
def test_graph_kernels_join_by_node_id(packed: bool) -> None:
    trace = _trace(packed)
    instances = attach(0, trace, _sidecar([]), RankFlows(0))
    instances.sort(key=lambda i: i.start_ns)
    assert [(i.collective, i.seq, i.replay, i.source) for i in instances] == [
        ("allreduce", 5, 0, "graph-replay"), ("_allgather_base", 6, 0, "graph-replay"),
        ("allreduce", 5, 1, "graph-replay"), ("_allgather_base", 6, 1, "graph-replay"),
    ]
    kernels = [e for e in trace["traceEvents"] if e["name"].startswith("nccl")]
    assert all(k["args"]["Seq"] in (5, 6) and k["args"]["commtag replay"] in (0, 1) for k in kernels)
    assert all(k["args"]["commtag match"] == "node-id" for k in kernels)
    others = [e for e in trace["traceEvents"] if e["name"].startswith("gemm")]
    assert not any("Collective name" in e["args"] for e in others)
    first = instances[0]
    assert (first.start_ns, first.end_ns) == (BASE + 1_030_000, BASE + 1_038_000)
    assert first.key == ("0:abc", False, 5, 0)
    # the lane slice carries what the kernel carries; replays of one call site share one dict of it
    lane_args = first.all_args()
    assert {"Collective name", "Rank", "Seq", "commtag replay", "commtag lane"} <= lane_args.keys()
    assert (lane_args.pop("commtag rank"), lane_args.pop("commtag source")) == (0, "graph-replay")
    assert lane_args == {key: kernels[0]["args"][key] for key in lane_args}
    again = instances[2]
    assert again.common_args is first.common_args and again.args is not first.args
    assert (first.arg("commtag replay"), again.arg("commtag replay"), again.arg("Seq")) == (0, 1, 5)


def test_replay_index_comes_from_the_replay_log() -> None:
    # the profiled window began after 40 replays: the log says which replay each launch was
    log = [GraphReplay(index=40, start_ns=BASE + 999_000, end_ns=BASE + 1_006_000, tid=1),
           GraphReplay(index=41, start_ns=BASE + 1_099_000, end_ns=BASE + 1_106_000, tid=1)]
    instances = attach(0, _trace(True), _sidecar(log), RankFlows(0))
    assert sorted({i.replay for i in instances}) == [40, 41]


def test_a_wrong_graph_id_matches_nothing() -> None:
    trace = _trace(False)
    for e in trace["traceEvents"]:
        if e["cat"] == "kernel":
            e["args"]["graph id"] = 3
    instances = attach(0, trace, _sidecar([]), RankFlows(0))
    assert {i.source for i in instances} == {"nccl-kernel"}  # shown, but only as unattributed kernels
    assert all(i.arg("commtag inferred") for i in instances)


def test_collective_families() -> None:
    assert family("gloo:all_reduce") == family("allreduce") == family("allreduce_coalesced") == "allreduce"
    assert family("c10d::_allgather_base_") == family("gloo:all_gather") == "allgather"
    assert family("_reduce_scatter_base") == "reducescatter" and family("all_to_allv") == "alltoall"
    assert family("gloo:send") == "send" and family("c10d::recv_") == "recv" and family("reduce") == "reduce"


def test_shared_common_args_keep_their_types() -> None:
    # equal dicts are shared, but 1, 1.0 and True are equal in Python and not in a trace
    interner = Interner()
    first = interner.common({"In msg nelems": 1024, "commtag p2p": False})
    assert interner.common({"In msg nelems": 1024, "commtag p2p": False}) is first
    other = interner.common({"In msg nelems": 1024.0, "commtag p2p": 0})
    assert other is not first
    assert (type(other["In msg nelems"]), type(other["commtag p2p"])) == (float, int)


def test_a_merge_shares_its_values_within_itself_and_with_no_other_merge(tmp_path) -> None:
    """Instances of one call site share one dict of common args within a merge; a second merge
    in the same process (a library user merging many runs) builds its own, and the first one's
    tables go with it instead of living as long as the process."""
    import orjson

    from commtag.merge.engine.options import MergeOptions
    from commtag.merge.engine.pipeline import make_plan, write_ranks
    from commtag.merge.engine.worlds import SoloWorld

    (tmp_path / "rank0.pt.trace.json").write_bytes(orjson.dumps(_trace(True)))
    sidecar = _sidecar([]).model_copy(update={"trace_file": "rank0.pt.trace.json"})
    (tmp_path / "rank0.commtag.json").write_text(sidecar.model_dump_json(by_alias=True))

    def instances(name: str) -> list:  # what a merge's ranks keep once written (a result reads its file back)
        plan = make_plan([tmp_path], tmp_path / name, MergeOptions(progress=False), SoloWorld())
        with plan.output:
            return [i for s in write_ranks(plan) for i in s.instances]

    first = instances("first.pftrace")
    second = instances("second.pftrace")
    assert [i.key for i in first] == [i.key for i in second] and len(first) == 4
    by_site = {}
    for inst in first:
        by_site.setdefault(inst.collective, []).append(inst.common_args)
    assert all(all(args is group[0] for args in group) for group in by_site.values())
    assert not {id(i.common_args) for i in first} & {id(i.common_args) for i in second}
    assert not {id(i.group_ranks) for i in first} & {id(i.group_ranks) for i in second}


def test_a_launch_its_captures_replay_log_does_not_hold_gets_no_guessed_replay_index() -> None:
    """One replay-index rule for every join (commtag.merge.rank.replays): a capture that logged its
    replays, none of them around this launch, does not say which replay it was. Counting launches
    in the trace instead (0, 1) would give a cross-rank key no other rank shares: the kernels stay
    unattributed, shown and counted, not misnamed."""
    far = [GraphReplay(index=40, start_ns=BASE + 500_000_000, end_ns=BASE + 500_007_000, tid=1),
           GraphReplay(index=41, start_ns=BASE + 600_000_000, end_ns=BASE + 600_007_000, tid=1)]
    instances = attach(0, _trace(True), _sidecar(far), RankFlows(0))
    assert not [i for i in instances if i.source == "graph-replay"]
    assert {i.source for i in instances} == {"nccl-kernel"} and all(i.arg("commtag inferred") for i in instances)


def test_an_eager_kernel_takes_the_record_of_its_own_seq_not_the_earliest_call() -> None:
    """A call recorded early on a second thread (Seq 3: launched ahead, queued behind Seq 1 and
    2 on the group's stream) keeps its own kernel. Pairing records with kernels k-th with k-th
    in call-time order would show the kernel Kineto labels Seq 1 as Seq 3 and, the other ranks'
    calls interleaving differently, mix Seqs in one column of a group."""
    calls = {3: (0, 777), 1: (100, 1), 2: (200, 1)}  # Seq -> (call start µs, thread)
    records, events = [], []
    for seq, (call_us, tid) in calls.items():
        keys = {**_annotation(seq).model_dump(by_alias=True), "In msg nelems": 1000 + seq, "Out msg nelems": 1000 + seq}
        annotation = CollectiveAnnotation.model_validate({k: v for k, v in keys.items() if k != "commtag capture id"})
        records.append(RecordedCollective(annotation=annotation, start_ns=BASE + call_us * 1000,
                                          end_ns=BASE + call_us * 1000 + 5000, tid=tid))
        events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                       "pid": 0, "tid": 7, "ts": 300.0 + seq * 50, "dur": 20.0,
                       "args": {**annotation.eager_dict(), "device": 0, "stream": 7}})
    sidecar = _sidecar([]).model_copy(update={"collectives": records, "captures": []})
    trace = {"traceEvents": events, "baseTimeNanoseconds": BASE, "distributedInfo": {"rank": 0, "world_size": 2}}
    instances = attach(0, trace, sidecar, RankFlows(0))
    shown = sorted((i.start_ns - BASE, i.seq, i.in_nelems) for i in instances)
    assert shown == [(350_000, 1, 1001), (400_000, 2, 1002), (450_000, 3, 1003)]


@pytest.mark.parametrize("trace", ["eager-nccl-metadata/hta_a100_nccl_data.json.gz",
                                   "eager-nccl-metadata/tracelens_mi300_rccl_resnet.json.gz"])
def test_only_kernels_and_comms_ops_are_candidates_by_their_args(trace: str) -> None:
    """The converter asks is_candidate once per event name and category except where args_decide: on
    every event of real traces, with the events' own args, no args and a collective's keys, any other
    event gets one answer (and the traces hold candidates of both kinds)."""
    events = orjson.loads(gzip.decompress((PUBLIC_TRACES / trace).read_bytes()))["traceEvents"]
    captured = CapturedKernels(())
    by_name = [e for e in events if e.get("ph") == "X" and not args_decide(e.get("name", ""), e.get("cat"))]
    eager = {"Collective name": "allreduce", "graph node id": 3}
    for e in by_name:
        answers = {is_candidate(e["name"], e.get("cat"), args, captured) for args in (e.get("args"), None, eager)}
        assert len(answers) == 1, e
    assert any(is_candidate(e["name"], e.get("cat"), None, captured) for e in by_name)
    assert any(is_candidate(e["name"], e.get("cat"), e.get("args"), CapturedKernels(()))
               for e in events if e.get("ph") == "X" and args_decide(e.get("name", ""), e.get("cat")))

"""Graph-replayed nccl2 collectives: one job captured in a CUDA graph and replayed,
its sidecars written in legacy ProcessGroupNCCL's format and in nccl2's by the generator
(commtag.testing.nccl2_graph, every field citing docs/nccl2.md), merges to the same analysis;
what nccl2 writes otherwise (coalesced records sharing one Seq, a list all_gather's several
broadcast kernels) is read per replay as it is eagerly."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from commtag.merge import merge
from commtag.runtime.record.sidecar import write_sidecar
from commtag.testing.nccl2 import JobCall, JobGroup
from commtag.testing.nccl2_graph import graph_job
from commtag.vocab import ANN_MATCH, ANN_RECORD_FORMAT, ANN_SEQ_PART, COLLECTIVE_NAME_KEY, LEGACY_FORMAT, NCCL2_FORMAT, SEND
from merging import matched

WORLD = JobGroup("0", "default_pg", (0, 1, 2, 3))
PAIR = JobGroup("1", "undefined", (0, 1))
#: Every op both formats write one record for (a coalesced call differs by design), in one graph.
JOB = (
    JobCall("allreduce", WORLD, (8,)),
    JobCall("broadcast", WORLD, (8,), root=1),
    JobCall("all_gather", WORLD, (8,)),
    JobCall("_allgather_base", WORLD, (8,)),
    JobCall("reduce_scatter", WORLD, (8,)),
    JobCall("_reduce_scatter_base", WORLD, (8,)),
    JobCall("all_to_allv", WORLD, (8,)),
    JobCall("all_to_allv", WORLD, (8,), splits=((1, 2, 3, 2), (2, 2, 2, 2))),
    JobCall("all_to_all", WORLD, (2, 2, 2, 2)),
    JobCall(SEND, WORLD, (8,), pairs=((1, 2),)),
    JobCall("allreduce", PAIR, (16,)),
    JobCall(SEND, WORLD, (8,), pairs=((3, 0),)),
    JobCall("allreduce", WORLD, (4,), dtype="BFloat16"),
)
REPLAYS = 3


def _merged(tmp_path: Path, job, fmt: str):
    directory = tmp_path / fmt
    directory.mkdir()
    for rank in range(4):
        trace, side = graph_job(job, rank, 4, fmt, REPLAYS, skew_us=5.0 * rank)
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        write_sidecar(directory / f"rank{rank}.commtag.json", side)
    return merge(directory, tmp_path / f"{fmt}.pftrace", jobs=1)


def _view(result) -> tuple[list, list]:
    """Per matched instance: kind, group, lane, Seq (a collective's), replay, members, bytes,
    busbw and skew; and the findings."""
    rows = sorted((m.collective, m.pg_uid, m.lane_name, None if m.is_p2p else m.seq, m.replay,
                   tuple(sorted(m.members)), m.missing_ranks, m.bytes, m.busbw_gbps, m.skew_ns, m.straggler)
                  for m in matched(result))
    findings = sorted((f.kind.value, f.pg_uid, f.seq, f.replay, f.ranks, f.fields) for f in result.analysis.findings)
    return rows, findings


def test_one_graphed_job_in_either_format_merges_to_the_same_analysis(tmp_path) -> None:
    legacy = _merged(tmp_path, JOB, LEGACY_FORMAT)
    nccl2 = _merged(tmp_path, JOB, NCCL2_FORMAT)
    assert _view(nccl2) == _view(legacy)
    rows = _view(nccl2)[0]
    assert len(rows) == len(JOB) * REPLAYS and {row[4] for row in rows} == set(range(REPLAYS))
    assert not nccl2.analysis.findings, nccl2.analysis.findings
    # Every replayed collective is matched on every rank that takes part (no replay left over).
    assert not [n for n in nccl2.notices if "left unannotated" in n], nccl2.notices
    assert all(inst.source == "graph-replay" for m in matched(nccl2) for inst in m.members.values())
    assert all(m.busbw_gbps is not None for m in matched(nccl2))
    # One name per kind (the legacy one), while the slices keep nccl2's own names and say their format.
    assert {row[0] for row in rows} >= {"allreduce", "_allgather_base", "_reduce_scatter_base", "all_to_allv"}
    own = {(inst.arg(COLLECTIVE_NAME_KEY), inst.arg(ANN_RECORD_FORMAT), inst.arg(ANN_MATCH))
           for m in matched(nccl2) for inst in m.members.values()}
    assert {name for name, _, _ in own} >= {"all_reduce", "allGatherSingleImpl", "reduceScatterSingleImpl",
                                            "allToAllSingleImpl", "all_to_all_v_single", "send", "recv"}
    assert {fmt for _, fmt, _ in own} == {NCCL2_FORMAT} and {match for _, _, match in own} == {"node-id"}


def test_the_broadcast_kernels_of_a_replayed_list_all_gather_are_its_one_collective(tmp_path) -> None:
    """nccl2's list all_gather runs N broadcast kernels (note §3): each replay joins all of them to
    its one record; legacy's runs one all_gather kernel, which a Broadcast kernel would not confirm."""
    result = _merged(tmp_path, (JobCall("all_gather", WORLD, (8,)), JobCall("allreduce", WORLD, (8,))), NCCL2_FORMAT)
    gathers = [m for m in matched(result) if m.collective == "all_gather"]
    assert sorted(m.replay for m in gathers) == list(range(REPLAYS))
    assert all(len(m.members) == 4 and m.bytes == 4 * 8 * 4 for m in gathers)
    assert not result.analysis.findings, result.analysis.findings


def test_a_replayed_coalesced_call_is_one_instance_per_record_on_every_replay(tmp_path) -> None:
    """nccl2 writes one all_reduce per tensor with the call's one Seq (note §3, §4); captured, each
    record keeps its part on every replay, so no two parts meet across ranks and no replay mixes."""
    job = (JobCall("allreduce", WORLD, (8,)), JobCall("allreduce_coalesced", WORLD, (4, 6)))
    result = _merged(tmp_path, job, NCCL2_FORMAT)
    coalesced = sorted((m.replay, m.bytes, len(m.members)) for m in matched(result) if m.seq == 2)
    assert coalesced == sorted((r, b, 4) for r in range(REPLAYS) for b in (16, 24))
    parts = {inst.arg(ANN_SEQ_PART) for m in matched(result) if m.seq == 2 for inst in m.members.values()}
    assert parts == {None, 1}
    assert not result.analysis.findings, result.analysis.findings


@pytest.mark.parametrize("fmt", [LEGACY_FORMAT, NCCL2_FORMAT])
def test_replayed_kernels_matched_by_order_are_confirmed_by_the_family_of_the_annotations_format(tmp_path, fmt) -> None:
    """Without node ids a replay is matched by order, each kernel confirmed by its name: nccl2's
    list all_gather runs Broadcast kernels (note §3), which confirm its nccl2 annotation and refute
    a legacy all_gather's (an AllGather kernel): that replay is left unannotated, never guessed."""
    job = (JobCall("all_gather", WORLD, (8,)),)
    directory = tmp_path / fmt
    directory.mkdir()
    for rank in range(4):
        trace, side = graph_job(job, rank, 4, NCCL2_FORMAT, REPLAYS)
        for event in trace["traceEvents"]:
            event["args"].pop("graph node id", None)
        captured = side.captures[0].collectives[0]
        captured.nodes = [node.model_copy(update={"kernel_name": ""}) for node in captured.nodes]
        if fmt == LEGACY_FORMAT:
            legacy = graph_job(job, rank, 4, LEGACY_FORMAT, REPLAYS)[1]
            captured.annotation = legacy.captures[0].collectives[0].annotation
            side.process_groups[:] = legacy.process_groups
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        write_sidecar(directory / f"rank{rank}.commtag.json", side)
    result = merge(directory, tmp_path / f"{fmt}.pftrace", jobs=1)
    replayed = [m for m in matched(result) if m.replay is not None]
    if fmt == NCCL2_FORMAT:
        assert sorted(m.replay for m in replayed) == list(range(REPLAYS))
        assert {inst.arg(ANN_MATCH) for m in replayed for inst in m.members.values()} == {"order"}
    else:
        assert replayed == []
        assert any("left unannotated: in capture order: Broadcast kernel for a 'all_gather' collective" in n
                   for n in result.notices), result.notices


def test_the_summary_of_a_graphed_job_reads_either_format_alike_and_lane_slices_keep_nccl2_names(tmp_path) -> None:
    """`commtag summary` of the merged .pftrace (read back from its lane slices) and of the
    directory: the same tables for both formats, but for the all-to-all traffic (nccl2's
    all_to_all_v_single records no split lists); the lane slices keep nccl2's own names."""
    from commtag.merge.pftrace.readback import read_instances
    from commtag.report.inputs import load
    from commtag.report.tables import to_text

    for fmt in (LEGACY_FORMAT, NCCL2_FORMAT):
        _merged(tmp_path, JOB, fmt)
    texts = {}
    for fmt in (LEGACY_FORMAT, NCCL2_FORMAT):
        for source in (fmt, f"{fmt}.pftrace"):
            text = to_text(load(tmp_path / source)[0])
            assert any("imbalance p50" in line for line in text.splitlines()), text
            texts[(fmt, source.endswith(".pftrace"))] = [line for line in text.splitlines() if "imbalance" not in line]
    for merged in (False, True):
        assert texts[(NCCL2_FORMAT, merged)] == texts[(LEGACY_FORMAT, merged)]
    assert not any("all_reduce " in line for line in texts[(NCCL2_FORMAT, True)])
    slices = read_instances(tmp_path / f"{NCCL2_FORMAT}.pftrace")
    assert {inst.arg(COLLECTIVE_NAME_KEY) for inst in slices} >= {
        "all_reduce", "allGatherSingleImpl", "reduceScatterSingleImpl", "allToAllSingleImpl", "all_to_all_v_single"}
    assert {inst.arg(ANN_RECORD_FORMAT) for inst in slices} == {NCCL2_FORMAT}
    assert {inst.collective for inst in slices} >= {"allreduce", "_allgather_base", "all_to_allv"}


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu_graphs" / "graph"


@pytest.mark.skipif(not FIXTURES.exists(), reason="no GPU fixtures: run launch/gpu_check.py on a GPU machine")
def test_the_h100_graph_fixture_with_its_sidecar_written_as_nccl2_merges_alike(tmp_path) -> None:
    """The real H100 trace of graph replays (tests/fixtures/gpu_graphs, legacy NCCL, one rank)
    merged with its own sidecar and with that sidecar as an nccl2 group would have written it
    (commtag.testing.nccl2_graph.as_nccl2): the same replayed instances, sizes and findings; the
    slices keep nccl2's names. The kernels are the hardware's; only the annotations are derived."""
    import shutil

    from commtag.schema import Sidecar
    from commtag.testing.nccl2_graph import as_nccl2

    legacy_dir, nccl2_dir = tmp_path / "legacy", tmp_path / "nccl2"
    shutil.copytree(FIXTURES, legacy_dir)
    shutil.copytree(FIXTURES, nccl2_dir)
    path = next(nccl2_dir.glob("*.commtag.json"))
    side = Sidecar.model_validate_json(path.read_text())
    for group in side.process_groups:
        group.record_format = NCCL2_FORMAT
        group.backend_impls = {"cuda": "nccl2"}
    for capture in side.captures:
        for captured in capture.collectives:
            captured.annotation = as_nccl2(captured.annotation, 0)
    path.unlink()
    write_sidecar(path, side)
    legacy = merge(legacy_dir, tmp_path / "legacy.pftrace", jobs=1)
    nccl2 = merge(nccl2_dir, tmp_path / "nccl2.pftrace", jobs=1)
    assert _view(nccl2) == _view(legacy)
    assert sorted(nccl2.notices) == sorted(legacy.notices)
    replayed = [inst for m in matched(nccl2) for inst in m.members.values() if inst.replay is not None]
    before = [inst for m in matched(legacy) for inst in m.members.values() if inst.replay is not None]
    assert len(replayed) == len(before) == 12  # the step's 3 all_reduces and the 1 of the other graph, 3 replays each
    assert {inst.arg(ANN_RECORD_FORMAT) for inst in replayed} == {NCCL2_FORMAT}
    assert {inst.arg(COLLECTIVE_NAME_KEY) for inst in replayed} == {"all_reduce"}


def test_a_replayed_batch_op_issue_pairs_with_its_peers_batches_on_each_replay(tmp_path) -> None:
    """A captured nccl2 batch (one record for a whole batch_isend_irecv, note §3) with the peers
    commtag's runtime recorded: on each replay the ring's four batches are one matched instance."""
    from commtag.vocab import NCCL2_BATCH_P2P

    ring = tuple((r, (r + 1) % 4) for r in range(4))
    job = (JobCall("allreduce", WORLD, (8,)), JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=ring))
    result = _merged(tmp_path, job, NCCL2_FORMAT)
    batches = sorted((m.replay, tuple(sorted(m.members))) for m in matched(result) if m.collective == NCCL2_BATCH_P2P)
    assert batches == [(r, (0, 1, 2, 3)) for r in range(REPLAYS)]
    assert not result.analysis.findings, result.analysis.findings


@pytest.mark.parametrize("node_ids", [True, False])
def test_a_replayed_legacy_batch_gives_each_op_its_keys_and_pairs_it_on_each_replay(tmp_path, node_ids) -> None:
    """pytorch#194693 under CUDA graphs: legacy ProcessGroupNCCL runs a captured batch_isend_irecv as
    one SendRecv kernel (the generator's legacy batch: one node its ops' records share). On each
    replay, joined by node id or by order, every op of every rank's batch is its own instance with its
    eager keys (its peer as Dst / Src Rank), each send paired with its receive; the kernel keeps only
    what all its ops agree on. The truth is the job's ring."""
    from commtag.vocab import ANN_MATCH, DST_RANK_KEY, NCCL2_BATCH_P2P, RECV, SRC_RANK_KEY

    ring = tuple((r, (r + 3) % 4) for r in range(4))
    job = (JobCall("allreduce", WORLD, (8,)), JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=ring))
    directory = tmp_path / "legacy"
    directory.mkdir()
    for rank in range(4):
        trace, side = graph_job(job, rank, 4, LEGACY_FORMAT, REPLAYS, skew_us=5.0 * rank)
        kernels = [e for e in trace["traceEvents"] if "SendRecv" in e["name"]]
        assert len(kernels) == REPLAYS  # one kernel per replayed batch, both of the rank's ops in it
        if not node_ids:
            for event in trace["traceEvents"]:
                event["args"].pop("graph node id", None)
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        write_sidecar(directory / f"rank{rank}.commtag.json", side)
    result = merge(directory, tmp_path / "legacy.pftrace", jobs=1)
    assert not result.analysis.findings, result.analysis.findings
    assert not [n for n in result.notices if "left unannotated" in n], result.notices
    found = set()
    for m in (m for m in matched(result) if m.is_p2p):
        ends = {inst.collective: inst for inst in m.members.values()}
        assert set(ends) == {SEND, RECV}, m.to_dict()
        send, recv = ends[SEND], ends[RECV]
        assert send.arg(DST_RANK_KEY) == recv.rank and recv.arg(SRC_RANK_KEY) == send.rank
        assert send.in_nelems == recv.out_nelems == 8 and m.bytes == 32
        assert {inst.arg(ANN_MATCH) for inst in ends.values()} == {"node-id" if node_ids else "order"}
        assert all(inst.source == "graph-replay" for inst in ends.values())
        found.add((m.replay, send.rank, recv.rank))
    assert found == {(r, src, dst) for r in range(REPLAYS) for src, dst in ring}


def test_a_kernel_a_legacy_batch_shares_carries_only_what_its_ops_agree_on(tmp_path) -> None:
    """The one SendRecv kernel of a replayed legacy batch belongs to a send and a receive: written on
    it, neither op's own name, peer or rank, but their group, Seq and replay (no op's keys are
    passed off as the kernel's)."""
    from commtag.vocab import DST_RANK_KEY, NCCL2_BATCH_P2P, PG_NAME_KEY, SRC_RANK_KEY

    ring = tuple((r, (r + 1) % 4) for r in range(4))
    job = (JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=ring),)
    directory = tmp_path / "one"
    directory.mkdir()
    for rank in range(4):
        trace, side = graph_job(job, rank, 4, LEGACY_FORMAT, REPLAYS)
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        write_sidecar(directory / f"rank{rank}.commtag.json", side)
    merge(directory, tmp_path / "one.pftrace", json_dir=tmp_path / "json", jobs=1)
    written = [orjson.loads(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes())
               for p in sorted((tmp_path / "json").iterdir())]
    kernels = [e for trace in written for e in trace["traceEvents"] if "SendRecv" in e.get("name", "")]
    assert len(kernels) == 4 * REPLAYS
    for kernel in kernels:
        args = kernel["args"]
        assert not {COLLECTIVE_NAME_KEY, DST_RANK_KEY, SRC_RANK_KEY, "Rank"} & set(args), args
        assert args[PG_NAME_KEY] == "0" and args["Seq"] == 1 and args["commtag replay"] in range(REPLAYS)


@pytest.mark.slow
def test_the_all_to_all_traffic_is_the_same_whatever_the_merge_workers(tmp_path) -> None:
    """Each worker reads the traffic of the all-to-alls it matched; the lead gathers them in one
    process's order: the list the analysis of the merged file makes, with one worker or two."""
    from commtag.merge.engine.shards import analyze
    from commtag.merge.pftrace.readback import read_merged

    one = _merged(tmp_path, JOB, NCCL2_FORMAT)
    two = merge(tmp_path / NCCL2_FORMAT, tmp_path / "two.pftrace", jobs=2)
    assert two.output.read_bytes() == one.output.read_bytes()
    instances, _, coverage = read_merged(one.output)
    expected = [a.to_dict() for a in analyze(instances, coverage=coverage).all_to_all]
    assert len(expected) == 3 * REPLAYS and any(a["matrix"] for a in expected)
    assert [a.to_dict() for a in one.analysis.all_to_all] == expected
    assert [a.to_dict() for a in two.analysis.all_to_all] == expected

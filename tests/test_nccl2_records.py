"""The nccl2 record generator (commtag.testing.nccl2) against docs/nccl2.md.

Each expected record below is read off the note's tables (§2 common keys, §3 per op, §4 Seq), for
a 4-rank group, n = 8 Float elements per rank, root 0, seen from rank 1 (and rank 0 where the
root's record differs); the legacy ones off docs/eager-metadata.md.
"""

from __future__ import annotations

from commtag.runtime.describe.calls import CallRecord, OpCall
from commtag.runtime.describe.groups import GroupState
from commtag.testing.nccl2 import ASYNC_KEY, JobCall, JobGroup, kernel_args, records
from commtag.vocab import (
    KERNEL_EAGER_KEYS, LEGACY_FORMAT, NCCL2_BATCH_P2P, NCCL2_FORMAT, NCCL2_OMITTED_KEYS, SEND,
)
from commtag.schema import CollectiveAnnotation
from merging import matched

WORLD = JobGroup("0", "default_pg", (0, 1, 2, 3))
JOB = (
    JobCall("allreduce", WORLD, (8,)),
    JobCall("broadcast", WORLD, (8,), root=0),
    JobCall("all_gather", WORLD, (8,)),
    JobCall("_allgather_base", WORLD, (8,)),
    JobCall("reduce_scatter", WORLD, (8,)),
    JobCall("_reduce_scatter_base", WORLD, (8,)),
    JobCall("all_to_allv", WORLD, (8,)),
    JobCall("all_to_allv", WORLD, (8,), splits=((1, 2, 3, 2), (2, 2, 2, 2))),
    JobCall("gather", WORLD, (8,), root=0),
    JobCall("scatter", WORLD, (8,), root=0),
    JobCall("barrier", WORLD, (8,)),
    JobCall("allreduce_coalesced", WORLD, (4, 6)),
    JobCall(SEND, WORLD, (8,), pairs=((1, 2),)),
    JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=((1, 2), (2, 1))),
    JobCall("allreduce", WORLD, (8,)),
)

# (name, In / Out msg nelems, In / Out split size, dtype, Rank, Seq) on rank 1, by the note's §3 and §4.
NCCL2_RANK1 = [
    ("all_reduce", 8, 8, "[8]", "[8]", "Float", 1, 1),
    ("broadcast", 8, 8, "[8]", "[8]", "Float", 0, 2),
    ("all_gather", 32, 8, "[8, 8, 8, 8]", "[8]", "Float", 1, 3),
    ("allGatherSingleImpl", 8, 32, "[8]", "[32]", "Float", 1, 4),
    ("reduce_scatter", 32, 8, "[8, 8, 8, 8]", "[8]", "Float", 1, 5),
    ("reduceScatterSingleImpl", 32, 8, "[32]", "[8]", "Float", 1, 6),
    ("allToAllSingleImpl", 8, 8, "[8]", "[8]", "Float", 1, 7),
    ("all_to_all_v_single", 8, 8, "[8]", "[8]", "Float", 1, 8),
    ("gather", 8, 0, "[8]", "[]", "Float", 0, 9),
    ("scatter", 0, 8, "[]", "[8]", "Float", 0, 10),
    ("barrier", 0, 0, "[]", "[]", "Byte", 1, 11),
    ("all_reduce", 4, 4, "[4]", "[4]", "Float", 1, 12),          # coalesced: one record per tensor,
    ("all_reduce", 6, 6, "[6]", "[6]", "Float", 1, 12),          # both with the call's one Seq
    ("send", 8, 8, "[8]", "[8]", "Float", 2, 12),                # p2p: the last collective's Seq
    ("batch_op_issue", 8, 8, "[8]", "[8]", "Float", 1, 12),
    ("all_reduce", 8, 8, "[8]", "[8]", "Float", 1, 13),
]
_FIELDS = ("Collective name", "In msg nelems", "Out msg nelems", "In split size", "Out split size", "dtype", "Rank",
           "Seq")


def test_nccl2_records_follow_the_notes_per_op_table_and_seq_rules() -> None:
    got = records(JOB, 1, NCCL2_FORMAT)
    assert [tuple(r[k] for k in _FIELDS) for r in got] == NCCL2_RANK1
    for record in got:
        # §2: the same group keys on every record, "[]" ranks, the omitted keys absent, async 1.
        assert record["Group size"] == 4 and record["Process Group Name"] == "0"
        assert record["Process Group Ranks"] == "[]" and record[ASYNC_KEY] == 1
        assert not set(NCCL2_OMITTED_KEYS) & set(record)


def test_the_destination_of_a_message_records_its_recv() -> None:
    """§3: recv n / n, Rank = the source's group rank; §4: the last collective's Seq."""
    (recv,) = [r for r in records(JOB, 2, NCCL2_FORMAT) if r["Collective name"] == "recv"]
    assert (recv["In msg nelems"], recv["In split size"], recv["Rank"], recv["Seq"]) == (8, "[8]", 1, 12)
    (legacy,) = [r for r in records(JOB, 2, LEGACY_FORMAT) if r["Collective name"] == "recv" and "Src Rank" in r
                 and r["Seq"] == 1]
    assert legacy["Src Rank"] == 1 and legacy["Rank"] == 1


def test_the_root_of_a_gather_or_scatter_records_the_whole_buffer() -> None:
    """§3: gather n / N·n and scatter N·n / n on the root (0 elsewhere, above)."""
    root = {r["Collective name"]: r for r in records(JOB, 0, NCCL2_FORMAT) if r["Collective name"] in ("gather", "scatter")}
    assert (root["gather"]["In msg nelems"], root["gather"]["Out msg nelems"], root["gather"]["Out split size"]) == (
        8, 32, "[8, 8, 8, 8]")
    assert (root["scatter"]["In msg nelems"], root["scatter"]["Out msg nelems"], root["scatter"]["In split size"]) == (
        32, 8, "[8, 8, 8, 8]")


def test_the_legacy_records_of_the_same_job_follow_eager_comm_metadata() -> None:
    """The other format of the same job: c10d names, one record per coalesced call, p2p on its own
    Seq counter with the global peer, description and ranks listed."""
    got = records(JOB, 1, LEGACY_FORMAT)
    names = [r["Collective name"] for r in got]
    assert names == ["allreduce", "broadcast", "all_gather", "_allgather_base", "reduce_scatter",
                     "_reduce_scatter_base", "all_to_allv", "all_to_allv", "gather", "scatter", "barrier",
                     "allreduce_coalesced", "send", "send", "recv", "allreduce"]
    by_index = dict(enumerate(got))
    assert (by_index[2]["In msg nelems"], by_index[2]["Out msg nelems"]) == (8, 32)      # all_gather: n / n x size
    assert (by_index[7]["In split size"], by_index[7]["Out split size"]) == ("[1, 2, 3, 2]", "[2, 2, 2, 2]")
    assert (by_index[8]["In msg nelems"], by_index[8]["Out msg nelems"]) == (8, 32)      # gather: in / in x size
    assert by_index[10]["dtype"] == "Byte" and by_index[10][ASYNC_KEY] == 0               # barrier
    assert by_index[11]["In msg nelems"] == 10 and by_index[11]["Seq"] == 12             # coalesced: one record
    assert [r["Seq"] for r in got[12:15]] == [1, 2, 2]                                   # p2p counter, batch = one
    assert got[12]["Dst Rank"] == 2 and got[14]["Src Rank"] == 2 and got[15]["Seq"] == 13
    assert all(r["Process Group Description"] == "default_pg" and r["Process Group Ranks"] == "[0, 1, 2, 3]"
               and r["Global rank start"] == 0 and r["Global rank stride"] == 1 for r in got)


def test_kernel_args_are_the_keys_kineto_copies_in_its_order() -> None:
    for fmt in (LEGACY_FORMAT, NCCL2_FORMAT):
        for record in records(JOB, 1, fmt):
            args = kernel_args(record)
            assert list(args) == [k for k in KERNEL_EAGER_KEYS if k in record]
            assert "Rank" not in args and ASYNC_KEY not in args


def test_the_runtime_annotates_an_nccl2_group_as_the_generator_writes_it() -> None:
    """A group whose backend is nccl2 gets nccl2's names, sizes, splits and omitted keys on its
    annotations (runtime.calls), the same values the generator writes for the call."""
    state = GroupState(uid="0:x", name="0", desc="default_pg", ranks=[0, 1, 2, 3], ranks_text="[0, 1, 2, 3]", size=4,
                       group_rank=1, global_rank_start=0, global_rank_stride=1, backend="nccl", lane_id=60,
                       lane_name="PG 0", generation=0, backend_impls={"cuda": "nccl2"}, record_format=NCCL2_FORMAT)
    calls = {
        "all_gather": OpCall("all_gather", state, 8, 32, "Float", 1),
        "_allgather_base": OpCall("_allgather_base", state, 8, 32, "Float", 1),
        "gather": OpCall("gather", state, 8, 32, "Float", 0),
        "all_to_allv": OpCall("all_to_allv", state, 8, 8, "Float", 1, in_split="[1, 2, 3, 2]",
                              out_split="[2, 2, 2, 2]"),
        SEND: OpCall(SEND, state, 8, 8, "Float", 2, p2p=SEND, peer=2),
    }
    expected = {r["Collective name"]: r for r in records(JOB, 1, NCCL2_FORMAT)}
    for legacy, name in (("all_gather", "all_gather"), ("_allgather_base", "allGatherSingleImpl"),
                         ("gather", "gather"), ("all_to_allv", "all_to_all_v_single"), (SEND, "send")):
        annotation = CollectiveAnnotation(**CallRecord(calls[legacy], 5, 1 if legacy == SEND else None, 0,
                                                       "t").annotation_fields()).eager_dict()
        want = kernel_args(expected[name])
        assert {k: annotation[k] for k in want if k != "Seq"} == {k: v for k, v in want.items() if k != "Seq"}
        assert not set(NCCL2_OMITTED_KEYS) & set(annotation)


def _write_traces(directory, job, world: int, fmt: str) -> None:
    import gzip

    import orjson

    from commtag.testing.nccl2 import job_trace

    directory.mkdir()
    for rank in range(world):
        trace = job_trace(job, rank, world, fmt, skew_us=5.0 * rank)
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))


def test_the_legacy_traces_of_a_job_merge_with_every_call_matched_on_its_members(tmp_path) -> None:
    """The generator's traces are what the merge reads: the legacy form of a 4-rank job on two
    groups merges with each collective matched on all its members, no finding, and the bytes the
    note's sizes give. (The same job's nccl2 traces, merged to the same analysis, is the merge's
    side of docs/nccl2.md: job_trace(..., NCCL2_FORMAT) writes them.)"""
    from commtag.merge import merge
    from commtag.testing.nccl2 import job_trace

    pair = JobGroup("1", "undefined", (0, 1))
    job = (*(call for call in JOB if call.op not in (SEND, NCCL2_BATCH_P2P)), JobCall("allreduce", pair, (16,)))
    _write_traces(tmp_path / "legacy", job, 4, LEGACY_FORMAT)
    result = merge(tmp_path / "legacy", tmp_path / "legacy.pftrace", jobs=1)
    found = matched(result)
    assert len(found) == len(job)
    assert all(len(m.members) == m.group_size and not m.missing_ranks for m in found)
    assert not result.analysis.findings, result.analysis.findings
    assert sorted(m.collective for m in found) == sorted(call.op for call in job)
    # Both formats of the same rank's trace carry one kernel per record, linked by External id.
    for fmt in (LEGACY_FORMAT, NCCL2_FORMAT):
        events = job_trace(job, 1, 4, fmt)["traceEvents"]
        ops = [e for e in events if e["name"] == "record_param_comms"]
        kernels = [e for e in events if e["cat"] == "kernel"]
        assert [k["args"]["External id"] for k in kernels] == [o["args"]["External id"] for o in ops]
        assert [o["args"]["Collective name"] for o in ops] == [r["Collective name"] for r in records(job, 1, fmt)]

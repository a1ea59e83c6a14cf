"""The merge of nccl2 traces: one job written by the generator in legacy
ProcessGroupNCCL's format and in nccl2's (commtag.testing.nccl2, every field citing
docs/nccl2.md) merges, without sidecars, to the same analysis; what nccl2 writes otherwise
(coalesced records sharing a Seq, p2p carrying the last collective's Seq, one batch_op_issue per
batch, several kernels per list all_gather, init and wait records) is read as the note says."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Callable, Optional

import orjson
import pytest

from commtag.merge import merge
from merging import analysed
from commtag.testing.nccl2 import JobCall, JobGroup, job_trace
from commtag.vocab import LEGACY_FORMAT, NCCL2_BATCH_P2P, NCCL2_FORMAT, SEND

WORLD = JobGroup("0", "default_pg", (0, 1, 2, 3))
PAIR = JobGroup("1", "undefined", (0, 1))
#: Every op both formats write one record for (a coalesced call and a batch differ by design).
JOB = (
    JobCall("allreduce", WORLD, (8,)),
    JobCall("broadcast", WORLD, (8,), root=1),
    JobCall("all_gather", WORLD, (8,)),
    JobCall("_allgather_base", WORLD, (8,)),
    JobCall("reduce_scatter", WORLD, (8,)),
    JobCall("_reduce_scatter_base", WORLD, (8,)),
    JobCall("all_to_allv", WORLD, (8,)),
    JobCall("all_to_allv", WORLD, (8,), splits=((1, 2, 3, 2), (2, 2, 2, 2))),
    JobCall("gather", WORLD, (8,), root=2),
    JobCall("scatter", WORLD, (8,), root=0),
    JobCall("barrier", WORLD, (8,)),
    JobCall(SEND, WORLD, (8,), pairs=((1, 2),)),
    JobCall("allreduce", PAIR, (16,)),
    JobCall(SEND, WORLD, (8,), pairs=((3, 0),)),
    JobCall("allreduce", WORLD, (4,)),
)


def _merged(tmp_path: Path, job, fmt: str, edit: Optional[Callable[[dict], None]] = None, sidecars: bool = False):
    from commtag.runtime.record.sidecar import write_sidecar
    from commtag.testing.nccl2_graph import sidecar

    directory = tmp_path / fmt
    directory.mkdir()
    for rank in range(4):
        trace = job_trace(job, rank, 4, fmt, skew_us=5.0 * rank)
        if edit is not None:
            edit(trace)
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        if sidecars:
            write_sidecar(directory / f"rank{rank}.commtag.json", sidecar(job, rank, 4, fmt, skew_us=5.0 * rank))
    return analysed(merge(directory, tmp_path / f"{fmt}.pftrace", jobs=1))


def _view(analysis) -> tuple[list, list]:
    """What a user reads of an analysis: per collective its kind, group and its lane (the
    description and members nccl2 omits come from pg_config), Seq (a collective's),
    members, bytes, bandwidth and skew; and the findings."""
    rows = sorted((m.collective, m.pg_uid, m.lane_name, None if m.is_p2p else m.seq, tuple(sorted(m.members)),
                   m.missing_ranks, m.bytes, m.busbw_gbps, m.skew_ns, m.straggler) for m in analysis.collectives)
    findings = sorted((f.kind.value, f.pg_uid, f.seq, f.ranks, f.fields) for f in analysis.findings)
    return rows, findings


@pytest.mark.parametrize("sidecars", [False, True], ids=["traces alone", "with sidecars"])
def test_one_job_in_either_format_merges_to_the_same_analysis(tmp_path, sidecars: bool) -> None:
    legacy = _merged(tmp_path, JOB, LEGACY_FORMAT, sidecars=sidecars)
    nccl2 = _merged(tmp_path, JOB, NCCL2_FORMAT, sidecars=sidecars)
    assert _view(nccl2) == _view(legacy)
    # With sidecars, every instance is its sidecar record's (commtag's own keys), else the trace's.
    from_sidecar = {"commtag thread" in inst.all_args() for m in nccl2.collectives for inst in m.members.values()}
    assert from_sidecar == {sidecars}
    rows = _view(nccl2)[0]
    assert len(rows) == len(JOB)
    assert all(bytes_ is not None for kind, *_, bytes_, _bw, _skew, _s in rows if kind != "barrier")
    # One name per kind: the legacy one (vocab.NCCL2_KINDS).
    assert {row[0] for row in rows} >= {"allreduce", "_allgather_base", "_reduce_scatter_base", "all_to_allv"}


@pytest.mark.parametrize("sidecars", [False, True], ids=["traces alone", "with sidecars"])
def test_the_records_of_a_coalesced_call_are_instances_of_their_own(tmp_path, sidecars: bool) -> None:
    """nccl2 writes one all_reduce per tensor, all with the call's Seq (note §3, §4)."""
    job = (JobCall("allreduce", WORLD, (8,)), JobCall("allreduce_coalesced", WORLD, (4, 6)))
    analysis = _merged(tmp_path, job, NCCL2_FORMAT, sidecars=sidecars)
    coalesced = sorted((m.seq, m.bytes, len(m.members)) for m in analysis.collectives if m.seq == 2)
    assert coalesced == [(2, 16, 4), (2, 24, 4)]
    assert not analysis.findings, analysis.findings


@pytest.mark.parametrize("sidecars", [False, True], ids=["traces alone", "with sidecars"])
def test_p2p_and_a_batch_pair_by_their_own_order_not_the_seq_they_carry(tmp_path, sidecars: bool) -> None:
    """send, recv and batch_op_issue carry the last collective's Seq (note §4): never matched with
    that collective; a batch_op_issue pairs with its peer's batch where its peers are known (the
    runtime records them: tests/test_nccl2_batches.py), else it stays alone on its rank."""
    job = (JobCall("allreduce", WORLD, (8,)), JobCall(SEND, WORLD, (8,), pairs=((1, 2),)),
           JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=((1, 2), (2, 1))), JobCall(SEND, WORLD, (8,), pairs=((1, 2),)))
    analysis = _merged(tmp_path, job, NCCL2_FORMAT, sidecars=sidecars)
    assert not analysis.findings, analysis.findings
    by_kind: dict[str, list] = {}
    for m in analysis.collectives:
        kinds = {inst.collective for inst in m.members.values()}
        by_kind.setdefault("/".join(sorted(kinds)), []).append(tuple(sorted(m.members)))
    batches = [(1, 2)] if sidecars else [(1,), (2,)]
    assert by_kind == {"allreduce": [(0, 1, 2, 3)], "recv/send": [(1, 2), (1, 2)], NCCL2_BATCH_P2P: batches}


def _spread_list_kernels(trace: dict) -> None:
    """The list all_gather's record launches N broadcast kernels (note §3), all with its External id."""
    events = trace["traceEvents"]
    for kernel in [e for e in events if e["cat"] == "kernel" and e["args"].get("Collective name") == "all_gather"]:
        for i in range(1, 4):
            events.append({**kernel, "ts": kernel["ts"] + 40.0 * i, "args": dict(kernel["args"])})


def test_the_broadcast_kernels_of_a_list_all_gather_are_its_record(tmp_path) -> None:
    job = (JobCall("all_gather", WORLD, (8,)), JobCall("allreduce", WORLD, (8,)))
    analysis = _merged(tmp_path, job, NCCL2_FORMAT, _spread_list_kernels)
    gathers = [m for m in analysis.collectives if m.collective == "all_gather"]
    assert len(gathers) == 1 and len(gathers[0].members) == 4
    assert all(inst.duration_ns == 150_000 for inst in gathers[0].members.values())
    assert not analysis.findings, analysis.findings


def _add_init_and_wait(trace: dict) -> None:
    """nccl2's records with no kernel (note §2): a communicator's init, a Work's wait (its Seq)."""
    ops = [e for e in trace["traceEvents"] if e["name"] == "record_param_comms"]
    for op in ops[:2]:
        for name in ("init", "wait"):
            args = {**op["args"], "Collective name": name, "In msg nelems": 0, "Out msg nelems": 0,
                    "External id": 10_000 + len(trace["traceEvents"])}
            trace["traceEvents"].append({**op, "ts": op["ts"] + 5.0, "dur": 1.0, "args": args})


def test_init_and_wait_records_are_no_collectives(tmp_path) -> None:
    (tmp_path / "plain").mkdir()
    plain = _merged(tmp_path / "plain", JOB, NCCL2_FORMAT)
    extra = _merged(tmp_path, JOB, NCCL2_FORMAT, _add_init_and_wait)
    assert _view(extra) == _view(plain)


def test_the_summary_reads_either_format_alike_and_lane_slices_keep_nccl2_names(tmp_path) -> None:
    """`commtag summary` of the merged .pftrace (read back from its lane slices, which keep the
    backend's own "Collective name") and of the trace directory: the same tables for both formats,
    but for the all-to-all traffic: nccl2's all_to_all_v_single records only its totals, so its
    matrix is "not recorded" where the legacy record lists the splits."""
    from commtag.merge.pftrace.readback import read_instances
    from commtag.report.tables import to_text
    from commtag.report.inputs import load

    for fmt in (LEGACY_FORMAT, NCCL2_FORMAT):
        _merged(tmp_path, JOB, fmt)
    full = {(fmt, source): to_text(load(tmp_path / source)[0])
            for fmt in (LEGACY_FORMAT, NCCL2_FORMAT) for source in (fmt, f"{fmt}.pftrace")}
    for (fmt, _), text in full.items():
        traffic = [line for line in text.splitlines() if "imbalance p50" in line]
        assert traffic and all(("not recorded" in line) == (fmt == NCCL2_FORMAT) for line in traffic), text
    texts = {key: "\n".join(line for line in text.splitlines() if "imbalance p50" not in line)
             for key, text in full.items()}
    assert texts[(NCCL2_FORMAT, NCCL2_FORMAT)] == texts[(LEGACY_FORMAT, LEGACY_FORMAT)]
    assert texts[(NCCL2_FORMAT, f"{NCCL2_FORMAT}.pftrace")] == texts[(LEGACY_FORMAT, f"{LEGACY_FORMAT}.pftrace")]
    assert "all_reduce" not in texts[(NCCL2_FORMAT, f"{NCCL2_FORMAT}.pftrace")]
    names = {inst.arg("Collective name") for inst in read_instances(tmp_path / f"{NCCL2_FORMAT}.pftrace")}
    assert {"all_reduce", "allGatherSingleImpl", "allToAllSingleImpl", "send", "recv"} <= names


def test_each_group_is_read_in_its_own_format(tmp_path) -> None:
    """One job whose world group writes nccl2's records and whose pair group writes the legacy
    ones (as a legacy or gloo group beside an nccl2 one does) reads as the job written all legacy."""
    from commtag.testing.nccl2 import SLOT_US

    world_calls = tuple(call for call in JOB if call.group is WORLD)
    pair_calls = (JobCall("allreduce", PAIR, (16,)), JobCall(SEND, PAIR, (8,), pairs=((0, 1),)),
                  JobCall("allreduce", PAIR, (4,)))
    legacy = _merged(tmp_path, world_calls + pair_calls, LEGACY_FORMAT)

    def mixed(trace: dict) -> None:
        rank = trace["distributedInfo"]["rank"]
        trace["traceEvents"] = job_trace(world_calls, rank, 4, NCCL2_FORMAT, skew_us=5.0 * rank)["traceEvents"]
        if rank in PAIR.ranks:
            for event in job_trace(pair_calls, rank, 4, LEGACY_FORMAT, skew_us=5.0 * rank)["traceEvents"]:
                args = event["args"]
                for key in ("External id", "correlation"):
                    if key in args:
                        args[key] += 10_000
                trace["traceEvents"].append({**event, "ts": event["ts"] + SLOT_US * len(world_calls)})

    (tmp_path / "mixed").mkdir()
    both = _merged(tmp_path / "mixed", world_calls + pair_calls, LEGACY_FORMAT, mixed)
    assert _view(both) == _view(legacy)
    formats = {(m.pg_uid, inst.arg("commtag record format")) for m in both.collectives for inst in m.members.values()}
    assert {fmt for _, fmt in formats} == {NCCL2_FORMAT, None} and len({uid for uid, _ in formats}) == 2

"""Trace records the merge cannot read, and Seqs far apart.

A 4-rank job written by the generator (commtag.testing.nccl2, every field citing its source)
has one record of rank 1 damaged the way a corrupt or hand-made file has it: a Seq that is no
number or beyond int64, a rank list that lists no ranks, no group name, a peer or rank outside
the group or the world, negative split sizes. The record is counted and named in a notice (file,
event, field) and left out of the matching: no finding names rank 1 (no missing_ranks, no Seq
gap, no phantom group). A Seq millions past the rest is read, and what the analysis keeps of
the gap does not grow with it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Callable

import pytest

from commtag.merge.analysis.parts import SeqRuns, seq_runs
from commtag.testing.nccl2 import JobCall, JobGroup, job_trace
from commtag.vocab import (
    COLLECTIVE_NAME_KEY, COMMS_OP, GROUP_SIZE_KEY, IN_SPLIT_KEY, KERNEL_CATEGORY, LEGACY_FORMAT, NCCL2_FORMAT, PG_NAME_KEY,
    PG_RANKS_KEY, RANK_KEY, SEND, SEQ_KEY,
)
from merging import matched, merge

WORLD = JobGroup("0", "default_pg", (0, 1, 2, 3))
JOB = (
    JobCall("allreduce", WORLD, (8,)),
    JobCall("allreduce", WORLD, (8,)),
    JobCall("allreduce", WORLD, (8,)),
    JobCall("all_to_allv", WORLD, (8,), splits=((1, 2, 3, 2), (2, 2, 2, 2))),
    JobCall(SEND, WORLD, (8,), pairs=((1, 2),)),
    JobCall("allreduce", WORLD, (8,)),
)


def _records(trace: dict, name: str, seq: int = 2) -> list[dict]:
    """The record_param_comms op of rank 1's call ``name`` (an allreduce: that of Seq ``seq``) and its
    kernel (the same External id)."""
    op = next(e for e in trace["traceEvents"] if e["name"] == COMMS_OP and e["args"][COLLECTIVE_NAME_KEY] == name
              and (name not in ("allreduce", "all_reduce") or e["args"].get(SEQ_KEY) == seq))
    link = op["args"]["External id"]
    return [op, *(e for e in trace["traceEvents"] if e.get("cat") == KERNEL_CATEGORY
                  and e["args"].get("External id") == link)]


def _setting(name: str, key: str, value: object) -> Callable[[dict], str]:
    def edit(trace: dict) -> str:
        events = _records(trace, name)
        for e in events:
            if value is None:
                e["args"].pop(key, None)
            elif key in e["args"] or e["name"] == COMMS_OP:
                e["args"][key] = value
        return events[-1]["name"]
    return edit


def _write(folder: Path, fmt: str, edit: Callable[[dict], str]) -> str:
    folder.mkdir()
    damaged = ""
    for rank in range(4):
        trace = job_trace(JOB, rank, 4, fmt, skew_us=5.0 * rank)
        if rank == 1:
            damaged = edit(trace)
        # the json module: it writes integers beyond 64 bits too
        (folder / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(trace).encode()))
    return damaged


CASES = {
    "seq-text": (LEGACY_FORMAT, _setting("allreduce", SEQ_KEY, "abc"), "'Seq' 'abc'"),
    "seq-2**70": (LEGACY_FORMAT, _setting("allreduce", SEQ_KEY, 2**70), "'Seq' "),
    "seq-negative": (LEGACY_FORMAT, _setting("allreduce", SEQ_KEY, -2), "'Seq' -2"),
    "ranks-unparseable": (LEGACY_FORMAT, _setting("allreduce", PG_RANKS_KEY, "[0, one, 2, 3]"),
                          "'Process Group Ranks' '[0, one, 2, 3]'"),
    "no-group-name": (LEGACY_FORMAT, _setting("allreduce", PG_NAME_KEY, None), "no 'Process Group Name'"),
    "rank-outside-world": (LEGACY_FORMAT, _setting("allreduce", PG_RANKS_KEY, "[0, 1, 2, 99]"),
                           "names rank 99, outside the world of 4"),
    "group-size-not-its-ranks": (LEGACY_FORMAT, _setting("allreduce", "Group size", 3),
                                 "'Group size' 3 but 'Process Group Ranks' lists 4 ranks"),
    "negative-split": (LEGACY_FORMAT, _setting("all_to_allv", IN_SPLIT_KEY, "[-3, 5, 3, 3]"),
                       "'In split size' '[-3, 5, 3, 3]'"),
    "nccl2-peer-99": (NCCL2_FORMAT, _setting(SEND, RANK_KEY, 99), "'Rank' 99 is not a group rank"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_unreadable_record_is_named_and_blames_no_rank(tmp_path: Path, case: str) -> None:
    fmt, edit, words = CASES[case]
    folder = tmp_path / "in"
    damaged = _write(folder, fmt, edit)
    result = merge(folder, tmp_path / "m.pftrace", analysis=True)
    said = [n for n in result.notices if "cannot read" in n]
    assert len(said) == 1, result.notices
    assert said[0].startswith(f"rank 1: {folder / 'rank1.pt.trace.json.gz'}: 1 collective record(s) it cannot read"), said
    assert f"{damaged!r} at ts " in said[0] and words in said[0], said
    assert result.analysis.findings == [], [f.message for f in result.analysis.findings]
    # No phantom group: every instance is of the job's one group.
    assert {i.pg_uid for i in result.instances} == {next(iter(result.instances)).pg_uid}


def test_the_same_job_undamaged_has_no_notice(tmp_path: Path) -> None:
    _write(tmp_path / "in", LEGACY_FORMAT, lambda trace: "")
    result = merge(tmp_path / "in", tmp_path / "m.pftrace", analysis=True)
    assert not [n for n in result.notices if "cannot read" in n] and result.analysis.findings == []


def test_a_gap_of_millions_of_seqs_is_two_spans(tmp_path: Path) -> None:
    """Rank 1's last allreduce says Seq 3,000,005 (the others' 5): the Seqs between are two spans
    in the Seq runs the merge keeps, whatever the gap: Seq 5,
    which the others recorded, and Seqs 6 to 3,000,004, which no rank did. The first is a desync
    of rank 1; the second no finding, as ranks 0 and 3 were no longer profiled at rank 1's Seq."""
    gap = 3_000_000
    _write(tmp_path / "in", LEGACY_FORMAT, lambda trace: [e["args"].update({SEQ_KEY: 5 + gap})
                                                         for e in _records(trace, "allreduce", 5)] and "")
    result = merge(tmp_path / "in", tmp_path / "m.pftrace", analysis=True)
    runs = SeqRuns(seq_runs(result.instances, result.analysis.coverage), {})
    holes = runs.holes()
    assert sorted((first, last, tuple(ranks)) for (_, first, last), ranks in holes.items()) == \
        [(5, 5, (1,)), (6, 4 + gap, (1,))]
    gaps = [(f.seq, f.ranks, f.desync, f.detail) for f in result.analysis.findings if f.kind == "seq_gap"]
    assert gaps == [(5, (1,), True, "Seq 5 missing on rank 1 between their neighbouring Seqs")], gaps


def test_an_empty_trace_is_said_and_blames_no_rank(tmp_path: Path) -> None:
    """A trace without events is well-formed (a profiler window that recorded nothing): the merge
    says so, naming it, and the collectives of the other ranks do not blame its rank."""
    folder = tmp_path / "in"
    _write(folder, LEGACY_FORMAT, lambda trace: "")
    path = folder / "rank2.pt.trace.json.gz"
    trace = json.loads(gzip.decompress(path.read_bytes()))
    path.write_bytes(gzip.compress(json.dumps({**trace, "traceEvents": []}).encode()))
    result = merge(folder, tmp_path / "m.pftrace", analysis=True)
    assert f"rank 2: {path}: holds no timed events: nothing of its rank is merged from it" in result.notices
    assert not [f for f in result.analysis.findings if 2 in f.ranks], [f.message for f in result.analysis.findings]


def test_members_that_disagree_on_the_group_size_are_a_desync_without_busbw(tmp_path: Path) -> None:
    """nccl2 lists no group ranks ("[]"), so a record's "Group size" stands alone: rank 1's allreduce
    says 3 where the others say 4. That is a size_mismatch of rank 1, and the collective's bus
    bandwidth (whose factor is the group size) is not measured, rather than measured with one rank's."""
    folder = tmp_path / "in"
    _write(folder, NCCL2_FORMAT, _setting("all_reduce", "Group size", 3))  # nccl2's name (vocab.NCCL2_KINDS)
    result = merge(folder, tmp_path / "m.pftrace", analysis=True)
    found = [(f.kind.value, f.seq, f.ranks, f.fields) for f in result.analysis.findings]
    assert found == [("size_mismatch", 2, (1,), ("Group size",))], found
    by_seq = {m.seq: m for m in matched(result) if m.collective == "allreduce"}
    assert by_seq[2].busbw_gbps is None and by_seq[2].skew_ns is not None
    assert all(m.busbw_gbps is not None for s, m in by_seq.items() if s != 2)


def test_a_rank_listing_other_members_of_a_group_is_warned_of(tmp_path: Path) -> None:
    """Rank 1's distributedInfo lists the world group "0" as ranks [0, 1, 2]; the others as [0, 1, 2, 3]:
    a warning names rank 1's file and both lists (--strict refuses it)."""
    folder = tmp_path / "in"

    def three(trace: dict) -> str:
        trace["distributedInfo"]["pg_config"][0].update(ranks=[0, 1, 2], pg_size=3)
        return ""
    _write(folder, LEGACY_FORMAT, three)
    result = merge(folder, tmp_path / "m.pftrace", analysis=True)
    assert result.warnings == [f"{folder / 'rank1.pt.trace.json.gz'}: rank 1 lists process group '0' with members "
                               "[0, 1, 2], ranks 0, 2, 3 with [0, 1, 2, 3]: its calls match only among ranks that agree"]


def _answer(result) -> tuple:
    """What a user reads of a merge of these cases: the notices of unreadable records, the
    warnings, and the findings."""
    return ([n for n in result.notices if "cannot read" in n], result.warnings,
            sorted((f.kind.value, f.pg_uid, f.seq, f.ranks, f.fields, f.detail) for f in result.analysis.findings))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["seq-2**70", "gap"])
def test_two_workers_say_what_one_says(tmp_path: Path, capsys, case: str) -> None:
    """A Seq beyond int64 and a gap of millions of Seqs: -j 2 (worker processes) says what -j 1
    says, and `commtag summary --format json` reads the folder (exit 0) with the same findings."""
    import commtag.merge
    from commtag.cli import main

    folder = tmp_path / "in"
    if case == "gap":
        _write(folder, LEGACY_FORMAT, lambda trace: [e["args"].update({SEQ_KEY: 5 + 3_000_000})
                                                     for e in _records(trace, "allreduce", 5)] and "")
    else:
        _write(folder, LEGACY_FORMAT, _setting("allreduce", SEQ_KEY, 2**70))
    one = merge(folder, tmp_path / "one.pftrace", analysis=True)
    two = commtag.merge.merge(folder, tmp_path / "two.pftrace", analysis=True, jobs=2)
    assert _answer(two) == _answer(one)
    assert (case == "gap") != bool(_answer(one)[0])
    capsys.readouterr()
    assert main(["summary", str(folder), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert sorted((f["kind"], f["seq"], tuple(f["ranks"])) for f in summary["findings"]) == \
        sorted((f.kind.value, f.seq, f.ranks) for f in one.analysis.findings)


def test_every_unreadable_record_is_counted_and_the_first_named(tmp_path: Path) -> None:
    """All four allreduces of rank 1 carry a Seq that is text: one note counts the four and names
    three; none of the four collectives blames rank 1 (it ran something there, what is not known)."""
    def texts(trace: dict) -> str:
        for e in trace["traceEvents"]:
            if (e.get("args") or {}).get(COLLECTIVE_NAME_KEY) == "allreduce":
                e["args"][SEQ_KEY] = "many"
        return ""
    _write(tmp_path / "in", LEGACY_FORMAT, texts)
    result = merge(tmp_path / "in", tmp_path / "m.pftrace", analysis=True)
    said = [n for n in result.notices if "cannot read" in n]
    assert len(said) == 1 and ": 4 collective record(s) it cannot read" in said[0], said
    assert said[0].count("'Seq' 'many'") == 3 and said[0].endswith("; and 1 more"), said
    assert result.analysis.findings == [], [f.message for f in result.analysis.findings]


def test_a_group_rank_list_is_read_once_however_many_records_repeat_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checking a record costs the same whatever its group's size: the rank list every record of
    a group repeats is parsed once, not once per record; a list naming a rank twice is still refused."""
    from commtag.merge.rank import checks

    parsed: list[str] = []
    real = checks.parse_rank_list
    monkeypatch.setattr(checks, "parse_rank_list", lambda text: parsed.append(text) or real(text))
    record = {COLLECTIVE_NAME_KEY: "allreduce", PG_NAME_KEY: "0", PG_RANKS_KEY: str(list(range(3, 4099))),
              GROUP_SIZE_KEY: 4096, RANK_KEY: 5}
    assert [checks.record_problem({**record, SEQ_KEY: seq}, 8192, True) for seq in range(1, 201)] == [None] * 200
    assert len(parsed) <= 1
    twice = {**record, PG_RANKS_KEY: "[0, 1, 1, 3]", GROUP_SIZE_KEY: 4, RANK_KEY: 2, SEQ_KEY: 1}
    assert checks.record_problem(twice, 8, True) == "'Process Group Ranks' names a rank twice"

"""A sidecar's stated record format: a group's entry says "legacy" or "nccl2", and that
rank's annotations and eager records of the group are read in that format where their own
content does not tell; where the content and the sidecar disagree, the merge warns, naming the
file (and --strict refuses it). Jobs from the generator (commtag.testing.nccl2)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Optional

import orjson
import pytest

from commtag.merge import merge
from commtag.merge.errors import MergeInputError
from commtag.runtime.record.sidecar import write_sidecar
from commtag.testing.nccl2 import JobCall, JobGroup, job_trace
from commtag.testing.nccl2_graph import sidecar
from commtag.vocab import ANN_RECORD_FORMAT, IN_SPLIT_KEY, LEGACY_FORMAT, NCCL2_FORMAT, OUT_SPLIT_KEY, SEND
from merging import matched

WORLD = JobGroup("0", "default_pg", (0, 1, 2, 3))
#: Ops whose nccl2 records differ from legacy's in more than the name (the list all_gather swaps
#: in and out, gather off the root writes out 0, two sends carry one Seq and name no peer) and a
#: barrier.
JOB = (JobCall("all_gather", WORLD, (8,)), JobCall("gather", WORLD, (8,), root=2),
       JobCall(SEND, WORLD, (8,), pairs=((1, 2),)), JobCall(SEND, WORLD, (8,), pairs=((0, 3),)),
       JobCall("barrier", WORLD, (8,)), JobCall("allreduce", WORLD, (8,)))


def _without_splits(trace: dict) -> None:
    """Records whose split keys are gone (a Kineto that does not copy them): only a name nccl2
    alone writes tells the format, and these are names both write."""
    for event in trace["traceEvents"]:
        event["args"].pop(IN_SPLIT_KEY, None)
        event["args"].pop(OUT_SPLIT_KEY, None)


def _merge(tmp_path: Path, name: str, fmt: str, stated: Optional[str], annotations: bool = False,
           strict: bool = False, edit=_without_splits):
    """Merge the job's ``fmt`` traces (``edit``-ed), each with a sidecar stating ``stated`` for its
    groups (None: no sidecar) that holds the annotations only with ``annotations``."""
    directory = tmp_path / name
    directory.mkdir()
    for rank in range(4):
        trace = job_trace(JOB, rank, 4, fmt, skew_us=5.0 * rank)
        if edit is not None:
            edit(trace)
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        if stated is not None:
            side = sidecar(JOB, rank, 4, fmt, skew_us=5.0 * rank)
            for group in side.process_groups:
                group.record_format = stated
            if not annotations:
                side.collectives = []
            write_sidecar(directory / f"rank{rank}.commtag.json", side)
    return merge(directory, tmp_path / f"{name}.pftrace", jobs=1, strict=strict)


def _view(analysis) -> tuple[list, list]:
    rows = sorted((m.collective, m.pg_uid, None if m.is_p2p else m.seq, tuple(sorted(m.members)), m.missing_ranks,
                   m.bytes, m.busbw_gbps) for m in analysis.collectives)
    return rows, sorted((f.kind.value, f.seq, f.ranks, f.fields) for f in analysis.findings)


def test_records_the_content_does_not_tell_are_read_in_the_format_the_sidecar_states(tmp_path) -> None:
    legacy = _merge(tmp_path, "legacy", LEGACY_FORMAT, None, edit=None)
    stated = _merge(tmp_path, "stated", NCCL2_FORMAT, NCCL2_FORMAT)
    alone = _merge(tmp_path, "alone", NCCL2_FORMAT, None)
    assert _view(stated.analysis) == _view(legacy.analysis) and not stated.analysis.findings
    assert not stated.warnings, stated.warnings
    formats = {inst.arg(ANN_RECORD_FORMAT) for m in matched(stated) for inst in m.members.values()}
    assert formats == {NCCL2_FORMAT}
    # Without the sidecar nothing says these records are nccl2's: read as legacy's, the list
    # all_gather's sizes are a mismatch and the two sends, one Seq, are one p2p of four ranks.
    assert _view(alone.analysis) != _view(legacy.analysis)
    assert {f.kind.value for f in alone.analysis.findings} >= {"size_mismatch"}
    assert [tuple(sorted(m.members)) for m in matched(alone) if m.is_p2p] == [(0, 1, 2, 3)]


def test_a_sidecars_annotations_the_content_does_not_tell_take_its_groups_format(tmp_path) -> None:
    """A barrier reads alike in both formats (note §3): the group entry says whose it is."""
    result = _merge(tmp_path, "annotated", NCCL2_FORMAT, NCCL2_FORMAT, annotations=True, edit=None)
    barriers = [inst for m in matched(result) if m.collective == "barrier" for inst in m.members.values()]
    assert len(barriers) == 4 and {inst.arg(ANN_RECORD_FORMAT) for inst in barriers} == {NCCL2_FORMAT}
    assert all("commtag thread" in inst.all_args() for inst in barriers)  # the sidecar's record, not the trace's


@pytest.mark.parametrize(("fmt", "stated"), [(NCCL2_FORMAT, LEGACY_FORMAT), (LEGACY_FORMAT, NCCL2_FORMAT)])
def test_a_sidecar_that_states_the_other_format_is_warned_of_by_file_and_the_content_decides(tmp_path, fmt, stated):
    legacy = _merge(tmp_path, "legacy", LEGACY_FORMAT, None, edit=None)
    result = _merge(tmp_path, "odd", fmt, stated, edit=None)
    assert _view(result.analysis) == _view(legacy.analysis)
    assert len(result.warnings) == 4, result.warnings  # one per rank's file, once per group
    for rank, warning in enumerate(sorted(result.warnings)):
        assert warning.startswith(str(tmp_path / "odd" / f"rank{rank}.pt.trace.json.gz") + ": "), warning
        assert f"its sidecar says process group '0' writes {stated} records, but the" in warning
        assert f"is {fmt}'s" in warning and f"read as {fmt}'s" in warning
    with pytest.raises(MergeInputError, match="--strict refuses it"):
        _merge(tmp_path, "strict", fmt, stated, edit=None, strict=True)
    assert not (tmp_path / "strict.pftrace").exists()

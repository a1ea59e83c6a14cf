"""The analysis of a real scheduled run (tests/window_world.py): what a user reads.

Real gloo ranks, the real profiler with ``schedule(..., repeat=2)``, the real
trace handler, the merge's collection stage or the merged .pftrace read back.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import orjson
import pytest

from window_world import PROFILED_STEPS, WINDOWS, WORLD, idle_rank_world, window_world

pytestmark = pytest.mark.slow

#: Per profiled step, one message each way in each of the two pairs.
TRANSFERS = PROFILED_STEPS * 2 * 2


@pytest.fixture(scope="module")
def traces() -> Path:
    return window_world()


@pytest.fixture(scope="module")
def merged(traces, tmp_path_factory) -> Path:
    from commtag.merge.analysis.hook import MergeAnalysis
    from merging import merge

    out = tmp_path_factory.mktemp("merged") / "merged.pftrace"
    merge(traces, out, analysis=MergeAnalysis(), progress=False)
    return out


def _summary(source: Path, form: str = "text") -> str:
    """What ``commtag summary SOURCE --format FORM`` prints (the CLI only formats this)."""
    from commtag.report import tables as report
    from commtag.report.inputs import load

    analysis, kernels = load(source)
    if form == "json":
        return report.to_json(analysis, kernels).decode()
    return report.to_text(analysis, kernels)


def _rows(text: str) -> dict[str, list[str]]:
    """The text summary's table rows, by op name (two-word names like send/recv stay whole)."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if line.startswith("  ") and len(cells) > 2 and cells[0] != "op":
            rows.setdefault(cells[0], []).append(line)
    return rows


def test_each_transfer_is_counted_once_as_a_send_recv_pair(traces, merged):
    from commtag.merge.pftrace.readback import read_instances
    from commtag.report.inputs import load

    analysis, _ = load(traces)
    p2p = [m for m in analysis.collectives if m.is_p2p]
    assert len(p2p) == TRANSFERS
    assert {m.collective for m in p2p} == {"send/recv"}
    assert all(sorted(i.collective for i in m.members.values()) == ["recv", "send"] for m in p2p)

    for source in (traces, merged):
        text = _summary(source)
        rows = _rows(text)
        assert "send" not in rows and "recv" not in rows, text
        (row,) = rows["send/recv"]
        assert re.split(r"\s{2,}", row.strip())[1] == str(TRANSFERS)
        doc = orjson.loads(_summary(source, "json"))
        assert [r["count"] for r in doc["summary"] if r["collective"] == "send/recv"] == [TRANSFERS]

    # Each rank's lane slice keeps its own direction: one send and one receive per transfer.
    lanes = [i for i in read_instances(merged) if i.is_p2p]
    assert sorted(i.collective for i in lanes) == ["recv"] * TRANSFERS + ["send"] * TRANSFERS
    assert {i.rank for i in lanes if i.collective == "send"} == set(range(WORLD))


def _default_group_seqs(analysis, rank: int) -> list[int]:
    return sorted(m.seq for m in analysis.collectives
                  if not m.is_p2p and m.group_size == WORLD and rank in m.members)


def test_seq_jumps_between_profiled_windows_are_not_findings(traces, merged):
    from commtag.report.inputs import load

    for source in (traces, merged):
        analysis, _ = load(source)
        seqs = _default_group_seqs(analysis, 0)
        assert seqs[-1] - seqs[0] + 1 > len(seqs)  # the Seqs of the unprofiled steps are not there
        assert analysis.findings == [], [f.message for f in analysis.findings]
        text = _summary(source)
        assert "findings:" not in text and "seq_gap" not in text, text
        assert {len(w) for w in analysis.coverage.windows.values()} == {WINDOWS}


def _drop_record(directory: Path, rank: int, step_file: str, seq: int) -> None:
    """Delete one default-group collective from a rank's sidecar (it was never seen there)."""
    path = directory / f"rank{rank}.{step_file}.commtag.json"
    doc = orjson.loads(path.read_bytes())
    before = len(doc["collectives"])
    doc["collectives"] = [c for c in doc["collectives"]
                          if not (c["annotation"]["Seq"] == seq and c["annotation"]["Group size"] == WORLD
                                  and not c["annotation"].get("commtag p2p"))]
    assert len(doc["collectives"]) == before - 1
    path.write_bytes(orjson.dumps(doc))


def test_a_gap_inside_a_window_is_still_a_desync(traces, tmp_path):
    from commtag.report.inputs import load

    copy = tmp_path / "traces"
    shutil.copytree(traces, copy)
    analysis, _ = load(traces)
    late_window = sorted(copy.glob("rank1.*.commtag.json"))[-1].name.split(".")[1]
    seqs = _default_group_seqs(analysis, 1)
    skipped = seqs[-2]  # inside rank 1's second window, with recorded Seqs on both sides
    _drop_record(copy, 1, late_window, skipped)
    edited, _ = load(copy)
    found = sorted((f.kind, f.seq, f.ranks) for f in edited.desyncs)
    assert found == [("missing_ranks", skipped, (1,)), ("seq_gap", skipped, (1,))]


def test_a_rank_without_files_is_named_and_its_collectives_are_incomplete(traces, tmp_path):
    from commtag.merge.analysis.hook import MergeAnalysis
    from merging import merge

    absent = 3
    copy = tmp_path / "traces"
    shutil.copytree(traces, copy)
    for path in copy.glob(f"rank{absent}.*"):
        path.unlink()
    result = merge(copy, tmp_path / "merged.pftrace", analysis=MergeAnalysis(), progress=False)
    assert any(f"1 of {WORLD} ranks have no trace (rank {absent})" in n for n in result.notices), result.notices

    for source in (copy, tmp_path / "merged.pftrace"):
        doc = orjson.loads(_summary(source, "json"))
        assert (doc["ranks"], doc["world_size"], doc["absent_ranks"]) == ([0, 1, 2], WORLD, [absent])
        # The uneven all_to_all sums differ without rank 3's share: that is no size mismatch.
        assert doc["findings"] == []
        with_absent = [c for c in doc["collectives"] if absent in c["missing_ranks"]]
        complete = [c for c in doc["collectives"] if not c["missing_ranks"]]
        # Per step: the default group's all_reduce and all_to_all, pair23's all_reduce, rank 3's two messages.
        assert len(with_absent) == (2 + 1 + 2) * PROFILED_STEPS
        assert all(c["skew_us"] is None and c["busbw_gbps"] is None and c["last_rank"] is None
                   and not c["straggler"] for c in with_absent)
        assert complete and all(c["skew_us"] is not None and set(c["ranks"]) <= {0, 1} for c in complete)
        text = _summary(source)
        assert text.startswith(f"{len(doc['collectives'])} collectives on 3 of {WORLD} ranks")
        assert f"rank {absent}" in text.splitlines()[1] and "desync" not in text.split("\n", 1)[1]


def test_summary_counts_ranks_groups_and_unknown_sizes_as_they_are(public_traces, tmp_path):
    from commtag.merge.analysis.hook import MergeAnalysis
    from merging import merge

    # Rank 1 was profiled but made no collective call: it is still one of the 2 ranks.
    idle = idle_rank_world()
    merge(idle, tmp_path / "idle.pftrace", analysis=MergeAnalysis(), progress=False)
    for source in (idle, tmp_path / "idle.pftrace"):
        assert _summary(source).startswith("1 collective on 2 ranks, 1 process group, 0 desyncs")

    # NCCL kernels without metadata (a public 8-rank trace) are no process groups, and their size is unknown.
    dlrm = public_traces / "param-dlrm-8rank"
    text = _summary(dlrm)
    assert text.startswith("8 collectives on 8 ranks, 0 process groups (+ 2 kinds of NCCL kernels without metadata)")
    rows = _rows(text)
    assert set(rows) == {"send/recv", "allreduce"}
    assert all(re.split(r"\s{2,}", row.strip())[2] == "?" for lines in rows.values() for row in lines)
    csv_rows = {r["collective"]: r for r in orjson.loads(_summary(dlrm, "json"))["summary"]}
    assert {r["bytes"] for r in csv_rows.values()} == {None}

"""Desyncs in real traces: sidecars of a real gloo run, edited the way a desync would show.

Starting from the clean run (tests/sleep_world.py, conftest's ``sleep_run``), the test rewrites a copy
of some ranks' sidecars: one rank reports a different size, one a different
dtype, one a different op, and one never ran a collective. Each must be
detected and named (group, Seq, ranks, fields); ``merge --strict`` must fail
on them, naming them, and pass on the clean run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.schema import Sidecar

pytestmark = pytest.mark.slow

DEFAULT_PG = "default_pg"


def _edit(src: Path, dst: Path) -> dict[str, tuple[int, int]]:
    """Copy the run and plant the four desyncs; return kind -> (rank, Seq) planted."""
    shutil.copytree(src, dst)
    planted: dict[str, tuple[int, int]] = {}

    def rewrite(rank: int, seq: int, kind: str, change) -> None:
        path = next(dst.glob(f"rank{rank}.*commtag.json"))
        doc = orjson.loads(path.read_bytes())
        kept = []
        for rec in doc["collectives"]:
            ann = rec["annotation"]
            if ann["Process Group Description"] == DEFAULT_PG and ann["Seq"] == seq:
                rec = change(rec)
            if rec is not None:
                kept.append(rec)
        doc["collectives"] = kept
        Sidecar.model_validate(doc)  # still a valid sidecar: only the cross-rank story is wrong
        path.write_bytes(orjson.dumps(doc))
        planted[kind] = (rank, seq)

    def size(rec):
        rec["annotation"]["In msg nelems"] //= 2
        rec["annotation"]["Out msg nelems"] //= 2
        return rec

    def dtype(rec):
        rec["annotation"]["dtype"] = "Double"
        return rec

    def op(rec):
        rec["annotation"]["Collective name"] = "broadcast"
        return rec

    rewrite(3, 2, "size_mismatch", size)
    rewrite(1, 3, "dtype_mismatch", dtype)
    rewrite(0, 5, "op_mismatch", op)
    rewrite(2, 6, "missing_ranks", lambda rec: None)
    return planted


@pytest.fixture(scope="module")
def desynced(sleep_run: Path, tmp_path_factory) -> tuple[Path, dict[str, tuple[int, int]]]:
    dst = tmp_path_factory.mktemp("desync") / "traces"
    return dst, _edit(sleep_run, dst)


def test_each_planted_desync_is_detected_and_named(desynced):
    from commtag.report.inputs import load

    path, planted = desynced
    analysis, _ = load(path)
    found = {(f.kind, f.seq): f for f in analysis.desyncs}
    for kind, (rank, seq) in planted.items():
        finding = found.get((kind, seq))
        assert finding is not None, (kind, seq, [f.message for f in analysis.desyncs])
        assert finding.ranks == (rank,)
        assert f"Seq {seq}" in finding.message and f"ranks [{rank}]" in finding.message
        assert DEFAULT_PG in finding.message
    assert found[("size_mismatch", 2)].fields == ("In msg nelems", "Out msg nelems")
    assert found[("dtype_mismatch", 3)].fields == ("dtype",)
    assert found[("op_mismatch", 5)].fields == ("Collective name",)
    # The rank that skipped Seq 6 also shows a gap in its own Seq numbers.
    assert found[("seq_gap", 6)].ranks == (2,)
    # Nothing else: the untouched collectives still match.
    assert set(found) == {(k, s) for k, (_, s) in planted.items()} | {("seq_gap", 6)}


def _merge(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commtag", "merge", *args], capture_output=True, text=True, timeout=300)


def test_strict_merge_fails_on_the_desyncs_and_names_them(desynced, tmp_path):
    path, planted = desynced
    done = _merge(str(path), "-o", str(tmp_path / "out.pftrace"), "--strict")
    assert done.returncode not in (0, 2), done.stderr  # 2 is bad input; a desync is its own failure
    for kind, (rank, seq) in planted.items():
        line = next((ln for ln in done.stderr.splitlines() if kind in ln and f"Seq {seq}:" in ln), None)
        assert line is not None, (kind, done.stderr)
        assert f"ranks [{rank}]" in line and DEFAULT_PG in line
    assert "[In msg nelems, Out msg nelems]" in done.stderr and "[dtype]" in done.stderr


def test_strict_merge_passes_on_the_clean_run(sleep_run, tmp_path):
    done = _merge(str(sleep_run), "-o", str(tmp_path / "out.pftrace"), "--strict")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.pftrace").stat().st_size > 0
    assert "desync" not in done.stderr


def test_two_torchrun_workers_name_each_desync_once(desynced, tmp_path):
    # Each worker runs the analysis to write its own ranks' lanes; only one may report.
    from commtag.merge.pftrace.readback import read_trace
    from torchrun_merge import torchrun_merge

    path, planted = desynced
    one = _merge(str(path), "-o", str(tmp_path / "one.pftrace"), "--strict")
    two = torchrun_merge([str(path), "-o", str(tmp_path / "two.pftrace"), "--strict"])
    assert two.returncode != 0, two.stderr[-3000:]

    def desyncs(stderr: str) -> list[str]:
        return [ln for ln in stderr.splitlines() if ln.startswith("commtag merge: ") and "Seq " in ln]

    assert len(desyncs(one.stderr)) >= len(planted)
    assert desyncs(two.stderr) == desyncs(one.stderr)
    # The marker instants, lanes and flows worker 1 wrote for ranks 2 and 3 are the single merge's.
    single, double = read_trace(tmp_path / "one.pftrace"), read_trace(tmp_path / "two.pftrace")
    markers = [s for s in double.slices if double.name_path(s.track)[-1] == "commtag markers"]
    assert {double.name_path(s.track)[0].split(" · ")[0] for s in markers} >= {"rank 2", "rank 3"}
    assert double.slices == single.slices and double.tracks == single.tracks

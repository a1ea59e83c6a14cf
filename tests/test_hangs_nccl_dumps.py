"""NCCL-side Flight Recorder dumps (generated field by field as torch writes them, see
commtag.testing.fr_dumps): commtag's diagnosis names the stuck rank and the waiting ones, and torch's
own analyzer reports the same collectives missing the same ranks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.cli import main
from commtag.testing.fr_dumps import Job, expected_stuck, write_dumps

#: 16 ranks, TP groups of 4; rank 5 never enters its step-2 reduce_scatter (call 7 of its schedule).
JOB = Job(world=16, tp=4, steps=4, stuck={5: 7})


@pytest.fixture
def dumps(tmp_path: Path) -> Path:
    write_dumps(JOB, tmp_path)
    return tmp_path


def _hangs(capsys, folder: Path) -> dict:
    assert main(["summary", str(folder), "--format", "json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_the_stuck_rank_is_named_and_the_ranks_waiting_on_it_grouped(dumps: Path, capsys) -> None:
    report = _hangs(capsys, dumps)
    assert report["stuck_ranks"] == expected_stuck(JOB) == [5]
    hangs = {(h["pg"], h["seq"], h["collective"], tuple(h["missing"]), tuple(h["entered"])) for h in report["hangs"]}
    # Its data-parallel peers wait in the reduce_scatter it never entered; its tensor-parallel peers
    # in the next all_reduce, and so do the other TP groups, whose members wait in that reduce_scatter.
    assert ("6", 5, "_reduce_scatter_base", (5,), (1, 9, 13)) in hangs
    assert ("2", 4, "all_reduce", (5,), (4, 6, 7)) in hangs
    assert {h[3] for h in hangs} == {(1,), (5,), (9,), (13,)}
    assert report["fr_desyncs"] == []
    assert main(["summary", str(dumps)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(
        "stuck: rank 5 never entered all_reduce Seq 4 of group 2, _reduce_scatter_base Seq 5 of group 6, which "
        "ranks 1,4,6-7,9,13 wait in")


@pytest.mark.slow
def test_torchs_analyzer_reports_the_same_ranks_missing(dumps: Path, capsys) -> None:
    analyzed = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps)],
                              capture_output=True, text=True, timeout=300)
    assert analyzed.returncode == 0, analyzed.stderr
    told = analyzed.stdout + analyzed.stderr
    theirs = {(group, frozenset(int(r) for r in missing.split(", ")))
              for group, missing in re.findall(r"group info: (\d+):\w+\n.*?missing ranks: \{([\d, ]+)\}", told, re.S)}
    ours = {(h["pg"], frozenset(h["missing"])) for h in _hangs(capsys, dumps)["hangs"]}
    assert theirs == ours

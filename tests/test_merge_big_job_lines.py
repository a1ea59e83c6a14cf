"""A big job's merge speaks in lines that do not grow with its ranks: what became of its events in
one line that adds every rank up (--verbose, and any job of 16 ranks or fewer, says each rank's),
and --align's offsets once per clock moved, with the ranks it moved."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commtag import cli
from commtag.merge import merge
from commtag.testing import scaleset

WORLD = 24


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, public_traces: Path) -> Path:
    out = tmp_path_factory.mktemp("job24")
    assert scaleset.main(["--ranks", str(WORLD), "--events", str(WORLD * 300), "-o", str(out)]) == 0
    return out


def _account_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if " events read, " in line]


def test_one_line_adds_up_every_rank(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    accounts = merge([job], tmp_path / "lib.pftrace").accounts
    assert cli.main(["merge", str(job), "-o", str(tmp_path / "cli.pftrace"), "--no-progress"]) == 0
    lines = _account_lines(capsys.readouterr().err)
    assert len(lines) == 1
    got = re.fullmatch(r"commtag merge: 24 ranks \(0-23\): (\d+) events read, (\d+) written, (\d+) launch flows drawn; "
                       r"left out: (.*) \(--verbose: each rank's\)", lines[0])
    assert got is not None, lines[0]
    assert int(got[1]) == sum(a.read for a in accounts) > 0
    assert int(got[2]) == sum(a.written for a in accounts) > 0
    assert int(got[3]) == sum(a.flows for a in accounts) > 0
    for reason in {r for a in accounts for r in a.left_out}:
        assert f"{sum(a.left_out.get(reason, 0) for a in accounts)} {reason}" in got[4]


def test_verbose_says_each_rank(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["merge", str(job), "-o", str(tmp_path / "v.pftrace"), "--no-progress", "--verbose"]) == 0
    lines = _account_lines(capsys.readouterr().err)
    assert [int(re.match(r"commtag merge: rank (\d+):", line)[1]) for line in lines] == list(range(WORLD))


def test_align_says_each_clock_once_with_its_ranks(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["merge", str(job), "-o", str(tmp_path / "a.pftrace"), "--no-progress", "--align",
                     "collectives"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("--align collectives:"))
    moved = re.findall(r"ranks? ([\d,-]+): [+-]\d+\.\d us", line)
    nodes = [f"{n * 4}-{n * 4 + 3}" for n in range(WORLD // 4)]  # the generator's 4 ranks per host
    assert moved and set(moved) <= set(nodes), line  # hosts share a clock: never one rank of a host alone
    assert "rank 0" not in line and "ranks 0-3" not in line  # the first host is the reference

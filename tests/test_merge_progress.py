"""A merge shown on a terminal (or with ``progress=True``) shows every long stage's progress: the
ranks, then the analysis and the lanes, each bar run to its end; with ``progress=False`` none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from commtag.merge import merge
from commtag.testing import PUBLIC_TRACES as PUBLIC


def _finished(stderr: str, stage: str) -> tuple[int, int]:
    """The last state ``stage``'s bar drew: (done, total)."""
    drawn = re.findall(rf"{stage}: +\d+%\|[^|]*\| (\d+)/(\d+)", stderr)
    assert drawn, (stage, stderr[-2000:])
    done, total = drawn[-1]
    return int(done), int(total)


def test_the_analysis_and_the_lanes_show_their_progress(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    merge(PUBLIC / "param-dlrm-8rank", tmp_path / "shown.pftrace", progress=True)
    shown = capsys.readouterr().err
    assert _finished(shown, "commtag merge") == (8, 8)
    done, total = _finished(shown, "commtag analysis")  # 8 ranks dealt out, 1 bucket, the conclusion
    assert done == total == 8 + 1 + 1
    done, total = _finished(shown, "commtag lanes")
    assert done == total >= 8  # each rank has at least one lane
    merge(PUBLIC / "param-dlrm-8rank", tmp_path / "quiet.pftrace", progress=False)
    assert "commtag" not in capsys.readouterr().err

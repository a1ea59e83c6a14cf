"""The command line's one error path: every error commtag raises on purpose (:class:`CommtagError`)
is said as one line, ``commtag COMMAND: error: FILE: PROBLEM``, and exits with the status its class
carries; no traceback, whatever the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from commtag.cli import main
from commtag.errors import CommtagError
from commtag.merge.pftrace.validate import TraceReadError, validate_file


def test_summary_says_its_error_as_merge_and_validate_do(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "no-such-input"
    assert main(["summary", str(missing)]) == CommtagError.exit_code == 2
    captured = capsys.readouterr()
    assert captured.err == f"commtag summary: error: {missing}: no such file or directory\n"
    assert captured.out == "" and "Traceback" not in captured.err
    assert list(tmp_path.iterdir()) == []


def test_validate_names_the_file_it_cannot_read(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pftrace"
    empty.touch()
    with pytest.raises(TraceReadError, match=f"^{empty}: empty file, not a .pftrace$"):
        validate_file(empty)

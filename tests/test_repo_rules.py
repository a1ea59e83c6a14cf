"""Rules about the repository itself that the linter cannot check."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("commtag", "tests", "launch") for p in (ROOT / folder).rglob("*.py"))

#: A noqa with its codes and nothing after them; the reason goes after " - ".
_BARE_NOQA = re.compile(r"#\s*noqa(?::\s*[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)?\s*$")


def test_every_noqa_says_why():
    bare = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
            for path in SOURCES
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if _BARE_NOQA.search(line)]
    assert not bare, "a noqa without its reason (write `# noqa: CODE - why`):\n" + "\n".join(bare)


def test_a_test_not_marked_slow_cannot_start_a_process():
    """conftest's guard: the fast subset (launch/test.sh --fast) stays free of processes."""
    from conftest import processes_refused

    with processes_refused("this test"):
        with pytest.raises(RuntimeError, match="this test starts a process but is not marked slow"):
            subprocess.run(["true"], check=True, timeout=10)
        with pytest.raises(RuntimeError, match="not marked slow"):
            multiprocessing.get_context("spawn").Process(target=print).start()


def test_hypothesis_is_derandomized_exactly_in_ci():
    """CI (.ci/run) selects the derandomized profile; elsewhere examples are random."""
    assert "COMMTAG_HYPOTHESIS_PROFILE=ci" in (ROOT / ".ci" / "run").read_text()
    assert settings().derandomize is (os.environ.get("COMMTAG_HYPOTHESIS_PROFILE") == "ci")


def test_launch_scripts_import_without_editing_sys_path():
    """launch/ imports its helpers from commtag.testing (installed, or the checkout under ``python -m``)."""
    edits = [f"{path.relative_to(ROOT)}:{number}" for path in sorted((ROOT / "launch").glob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if "sys.path" in line]
    assert edits == []

"""Every small public trace merges with exit 0 and its output validates, whatever its age or maker.

The folder holds real traces from other projects (old torch, CPU-only,
ROCm, distributed ranks, graph replays, ...); a trace added there is
covered without touching this file. Each is merged alone through the
command line, as a user would, under a rank-naming link (many name no rank).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from commtag.testing import PUBLIC_TRACES

pytestmark = pytest.mark.slow

#: Where public traces are kept: tests/data/public (with their PROVENANCE.md).
ROOTS = (PUBLIC_TRACES,)
#: Larger traces are merged by the scale tests and benchmarks, not here.
_SMALL = 2 << 20
SMALL_TRACES = sorted(
    p for root in ROOTS for p in root.rglob("*")
    if p.is_file() and p.name.endswith((".json", ".json.gz")) and p.stat().st_size < _SMALL
)


def test_there_are_public_traces_to_check() -> None:
    assert len(SMALL_TRACES) >= 10, f"expected the public traces under {ROOTS}"


@pytest.mark.parametrize("path", SMALL_TRACES, ids=[f"{p.parent.name}/{p.name}" for p in SMALL_TRACES])
def test_merges_and_validates(tmp_path: Path, path: Path) -> None:
    link = tmp_path / "in" / ("rank0." + path.name)
    link.parent.mkdir()
    link.symlink_to(path)
    out = tmp_path / "merged.pftrace"
    merged = subprocess.run([sys.executable, "-m", "commtag", "merge", str(link.parent), "-o", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert merged.returncode == 0, merged.stderr
    assert out.stat().st_size > 0
    checked = subprocess.run([sys.executable, "-m", "commtag", "validate", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr

"""A disk that fills up while the merge writes, for real: the output's folder is a small tmpfs.

Every way the merge runs (one process, ``-j 2``, torchrun's two workers) must end the same:
one line naming the output, exit status 2, the previous output as it was, and nothing else
left in the folder (no part, shard, temporary or exchange folder of the workers).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from commtag.testing import PUBLIC_TRACES
from torchrun_merge import torchrun_merge, traceback_in_commtag

pytestmark = pytest.mark.slow

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"
PREVIOUS = b"previous output " * 4096
#: The merged DLRM trace takes 1.45 MB: a disk of 256 kB fills at the first bytes written, one of
#: 1,400 kB (the previous output on it) at the last; one of 1,800 kB holds the workers' parts but
#: not worker 0's copy of worker 1's, appended to its own (one process needs no such room).
CASES = [(mode, size) for mode in ("-j 1", "-j 2", "torchrun") for size in ("256k", "1400k", "1800k")
         if (mode, size) != ("-j 1", "1800k")]


@pytest.fixture
def small_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of the parameter's size, mounted for the test (root only: skipped elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={request.param}", "tmpfs", str(disk)],
                             capture_output=True, text=True) if _can_mount() else None
    if mounted is None or mounted.returncode != 0:
        pytest.skip("a small tmpfs, the disk that fills up, needs mount(8) and root: "
                    f"{mounted.stderr.strip() if mounted else 'not root'}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.parametrize(("mode", "small_disk"), CASES, indirect=["small_disk"])
def test_a_full_disk_is_one_line_exit_2_and_the_previous_output(small_disk: Path, mode: str) -> None:
    out = small_disk / "merged.pftrace"
    out.write_bytes(PREVIOUS)
    args = [str(DLRM), "-o", str(out), "--no-progress"]
    if mode == "torchrun":
        proc = torchrun_merge(args)
        exits = dict(re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*: (-?\d+)", proc.stderr))
        assert exits == {"0": "2", "1": "2"}, proc.stderr[-3000:]
    else:
        proc = subprocess.run([sys.executable, "-m", "commtag.merge", *args, *mode.split()],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr[-3000:]
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("commtag merge:")]
    assert said == [f"commtag merge: error: {out}: cannot write the output: No space left on device"], said
    assert not traceback_in_commtag(proc.stderr)
    assert out.read_bytes() == PREVIOUS
    assert [p.name for p in small_disk.iterdir()] == ["merged.pftrace"]

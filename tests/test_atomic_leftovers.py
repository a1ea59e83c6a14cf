"""One temporary-name rule for both wings (commtag.atomic): what a killed training process left
while writing its trace is named so that the next merge into that folder removes it.

A real profile, its trace handed to ``commtag.trace_handler``; the process dies (``os._exit``)
after the profiler exported the trace to its temporary and before the trace took its name, as a
SIGKILL there would leave it. The merge beside it then merges the other traces and removes it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from commtag.testing import PUBLIC_TRACES

pytestmark = pytest.mark.slow

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"

_KILLED_WHILE_PUBLISHING = """
import os, sys
import torch
from torch.profiler import ProfilerActivity, profile

import commtag
from commtag.runtime.record import sidecar

def die(tmp, rank, steps):  # the trace is exported to its temporary: the process is killed now
    os._exit(9)

sidecar.publish_trace = die
commtag.install()
with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(sys.argv[1])):
    torch.ones(4).sum()
"""


def test_a_killed_trace_handlers_temporary_is_removed_by_the_next_merge(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    killed = subprocess.run([sys.executable, "-c", _KILLED_WHILE_PUBLISHING, str(traces)], capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == 9, killed.stderr
    left = [p.name for p in traces.iterdir()]
    assert len(left) == 1 and left[0].startswith(".rank0"), left  # the exported trace, under its temporary name
    for r in range(2):
        (traces / f"rank{r}.json.gz").symlink_to(next(DLRM.glob(f"worker{r}_*")))

    merged = subprocess.run([sys.executable, "-m", "commtag.merge", str(traces), "--no-progress"], capture_output=True,
                            text=True, timeout=300)

    assert merged.returncode == 0, merged.stderr
    assert sorted(p.name for p in traces.iterdir()) == ["merged.pftrace", "rank0.json.gz", "rank1.json.gz"]

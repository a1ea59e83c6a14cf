"""What the merge makes of what other tools write into, or beside, a profiler trace: Kineto's own
trace-wide instants, a folder holding another profiler's output, and HTA's critical-path flows."""

from __future__ import annotations

import shutil
from pathlib import Path

from merging import merge
from pftrace_reader import read


def test_the_record_window_end_instant_sits_on_its_ranks_trace_row(public_traces: Path, tmp_path: Path) -> None:
    """Kineto ends every file with a global instant "Record Window End" written with pid "" and
    tid "" (libkineto/src/output_json.cpp, finalizeTrace); PARAM's DLRM rank 1 is such a file. It
    goes on the row of the window's other global instant, "Iteration Start", under its rank."""
    source = next((public_traces / "param-dlrm-8rank").glob("worker1_*"))
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(source, job / source.name)
    out = tmp_path / "merged.pftrace"
    merge(job, out, progress=False)
    parsed = read(out)
    marks = {s.name: parsed.name_path(s.track) for s in parsed.slices
             if s.instant and (s.name == "Record Window End" or s.name.startswith("Iteration Start"))}
    assert marks["Record Window End"] == marks["Iteration Start: PyTorch Profiler"], marks
    assert marks["Record Window End"][0].startswith("rank 1 ") and marks["Record Window End"][1:] == \
        ["Traces", "Trace PyTorch Profiler"]

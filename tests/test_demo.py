"""The README's main job, run the way a user runs it (minus the venv set-up).

``launch/demo.py`` spawns its own 4 gloo ranks, profiles them with the real
torch.profiler and commtag installed, then the three offline commands run as
subprocesses. What is checked is what a user would look at: every command
exits 0, the merged file has a process per rank and a lane per process group,
and every collective the ranks recorded is matched in the summary with no
desync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from commtag.constants import SIDECAR_SUFFIX
from commtag.merge.pftrace.readback import read_trace
from pftrace_reader import lane_of
from commtag.sidecarfile import read_sidecar

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# The demo's 2x2 mesh, as its docstring describes it: group name (creation order), desc, ranks.
LANES = {
    "PG 0 (default_pg) [0, 1, 2, 3]": {0, 1, 2, 3},
    "PG 1 (tp) [0, 1]": {0, 1},
    "PG 2 (tp) [2, 3]": {2, 3},
    "PG 3 (dp) [0, 2]": {0, 2},
    "PG 4 (dp) [1, 3]": {1, 3},
}
DEMO_OPS = {"broadcast", "allreduce", "all_to_allv", "_reduce_scatter_base", "_allgather_base", "all_gather"}


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """Run the demo, merge with the default output name, validate and summarize (as JSON)."""
    work = tmp_path_factory.mktemp("demo")
    _run(str(ROOT / "launch" / "demo.py"), "--out", "traces", cwd=work)
    traces = work / "traces"
    merged = _run("-m", "commtag.merge", "traces", cwd=work)
    validated = _run("-m", "commtag", "validate", "traces/merged.pftrace", cwd=work)
    summary = _run("-m", "commtag", "summary", "traces/merged.pftrace", "--format", "json", cwd=work)
    return {"traces": traces, "merge_out": merged.stdout, "validate_out": validated.stdout,
            "summary": json.loads(summary.stdout)}


def test_merge_writes_the_default_output_and_it_validates(demo) -> None:
    assert (demo["traces"] / "merged.pftrace").is_file()
    assert "4 ranks" in demo["merge_out"]
    assert "merged.pftrace: OK" in demo["validate_out"]


def test_merged_file_has_a_process_per_rank_and_a_lane_per_process_group(demo) -> None:
    trace = read_trace(demo["traces"] / "merged.pftrace")
    procs = sorted(d.process.process_name.split(" · ")[0] for d in trace.processes())
    assert procs == ["rank 0", "rank 1", "rank 2", "rank 3"]
    lanes_by_rank: dict[int, set[str]] = defaultdict(set)
    for slice_ in trace.slices:
        where = lane_of(trace, slice_)
        if where is not None and "commtag rank" in slice_.args:
            lanes_by_rank[where[0]].add(where[1])
    assert set().union(*lanes_by_rank.values()) == set(LANES)
    for rank in range(4):
        assert lanes_by_rank[rank] == {name for name, members in LANES.items() if rank in members}, rank


def test_every_recorded_collective_is_in_the_summary_without_desync(demo) -> None:
    recorded: dict[tuple[str, int], set[int]] = defaultdict(set)
    ops: dict[tuple[str, int], str] = {}
    sidecars = sorted(demo["traces"].glob(f"rank*{SIDECAR_SUFFIX}"))
    assert len(sidecars) == 4
    for path in sidecars:
        side = read_sidecar(path)
        for rc in side.collectives:
            key = (rc.annotation.pg_uid, rc.annotation.seq)
            recorded[key].add(side.rank)
            ops[key] = rc.annotation.collective_name
    assert set(ops.values()) == DEMO_OPS
    report = demo["summary"]
    assert report["ranks"] == [0, 1, 2, 3]
    matched = {(c["pg"], c["seq"]): c for c in report["collectives"]}
    assert set(matched) == set(recorded)
    for key, ranks in recorded.items():
        record = matched[key]
        assert record["collective"] == ops[key], key
        assert set(record["ranks"]) == ranks and record["missing_ranks"] == [], key
        assert record["desync"] == [], key
        assert set(record["ranks"]) == LANES[record["lane"]], key
    assert report["findings"] == []
    assert sum(row["count"] for row in report["summary"]) == len(recorded)
    assert {row["lane"] for row in report["summary"]} == set(LANES)

"""What each collective's time went to, on real 4-rank gloo jobs (tests/cause_world.py).

Without a late rank each 16 MB all_reduce after a barrier is its transfer; with rank 1 sleeping
0.5 s before one of them, that one is its late arrival (arrival skew: its CPU call came late too,
so not launch skew), rank 1 last; the others stay transfers. The lane slices carry the same cause
and each rank's launch delay, the summary of the merged file says what the directory's says, and
the per group and op table gives each cause's share of the time.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from cause_world import CALLS, LATE, LATE_CALL, run_cause_world
from merging import merge
from pftrace_reader import read
from commtag.report.inputs import load
from commtag.report.tables import to_json

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    return {late: run_cause_world(tmp_path_factory.mktemp("late" if late else "on_time") / "traces", late)
            for late in (False, True)}


def _allreduces(path: Path) -> list[dict]:
    records = orjson.loads(to_json(*load(path)))["collectives"]
    found = sorted((r for r in records if r["collective"] == "allreduce"), key=lambda r: r["start_ns"])
    assert len(found) == CALLS and all(r["ranks"] == [0, 1, 2, 3] and not r["missing_ranks"] for r in found)
    return found


def _started_together(traces: Path) -> list[bool]:
    """Per all_reduce, in call order: whether the ranks' gloo works began within a quarter of its span,
    read straight from each rank's profiler trace (one host clock). The barrier before each call
    makes it so, unless a loaded machine holds a rank back after it (32 ms of 77 once): such a call
    is not the transfer this test is about, and is said by its figures instead."""
    works = []
    for rank in range(4):
        (path,) = traces.glob(f"rank{rank}.*.pt.trace.json.gz")
        events = orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        works.append(sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                            if e.get("ph") == "X" and e["name"] == "gloo:all_reduce"))
    assert all(len(w) == CALLS for w in works)
    together = []
    for call in range(CALLS):
        starts, ends = [w[call][0] for w in works], [w[call][1] for w in works]
        together.append(max(starts) - min(starts) < (max(ends) - min(starts)) / 4)
    return together


def test_allreduces_that_start_together_are_their_transfer(runs) -> None:
    together = _started_together(runs[False])
    assert sum(together) >= CALLS - 1, together  # at most one call held back by the machine
    causes = [r["cause"] for r in _allreduces(runs[False])]
    assert all(cause == "transfer" for cause, came in zip(causes, together) if came), (causes, together)


def test_a_late_rank_makes_its_collective_arrival_skew(runs) -> None:
    found = _allreduces(runs[True])
    together = _started_together(runs[True])
    assert not together[LATE_CALL] and sum(together) >= CALLS - 2, together
    assert found[LATE_CALL]["cause"] == "arrival skew" and found[LATE_CALL]["last_rank"] == LATE
    assert all(r["cause"] == "transfer" for i, r in enumerate(found) if i != LATE_CALL and together[i]), \
        ([r["cause"] for r in found], together)


def test_the_merged_trace_carries_causes_and_launch_delays(runs, tmp_path: Path) -> None:
    out = tmp_path / "merged.pftrace"
    merge(runs[True], out, analysis=True)
    lanes = sorted((s for s in read(out).slices if s.name == "allreduce" and "commtag cause" in s.args),
                   key=lambda s: (s.ts, s.args["commtag rank"]))
    assert len(lanes) == CALLS * 4
    assert [s.args["commtag cause"] for s in lanes[::4]] == [r["cause"] for r in _allreduces(runs[True])]
    assert all(s.args["commtag nodes"] == 1 and s.args["commtag launch us"] >= 0 for s in lanes)
    from_file = orjson.loads(to_json(*load(out)))
    from_dir = orjson.loads(to_json(*load(runs[True])))
    assert [r["cause"] for r in from_file["collectives"]] == [r["cause"] for r in from_dir["collectives"]]
    (row,) = [r for r in from_dir["summary"] if r["collective"] == "allreduce"]
    assert set(row["time_by_cause"]) == {"transfer", "arrival skew"} and row["nodes"] == "intra-node"
    assert row["time_by_cause"]["arrival skew"] > 0 and sum(row["time_by_cause"].values()) == pytest.approx(1, abs=1e-3)

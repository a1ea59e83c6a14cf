"""What a late rank cost each profiler step, on a real 4-rank gloo job (tests/steps_world.py).

The truth is what the job recorded it did: in which steps its culprit slept and for how long,
and when each rank arrived at each collective (one host clock for all ranks). commtag's figures
come from the profiler's traces (their ProfilerStep spans) and commtag's annotations only.
"""

from __future__ import annotations

import csv
import gzip
import io
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from steps_world import CALLS_PER_STEP, RECORDED, WORLD, run_steps_world

pytestmark = pytest.mark.slow

CULPRIT = 1
DELAY_S = 0.05
DELAYED = (3, 5)
#: Per call, how far the job's clock (read just before the call) and the profiler's op start may
#: disagree on a rank's arrival: the call's own way into the op, ms on a loaded 2-core machine.
_CLOCK_SLACK_US = 1000.0
#: Per call, how far commtag's arrival (its annotation's) and the profiler's op start may differ.
_TRACE_SLACK_US = 250.0


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("steps")
    return out, run_steps_world(out, CULPRIT, DELAY_S, DELAYED)


def _summary(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "commtag", "summary", *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _culprit_lead_us(records: list[dict], step: int) -> float:
    """The culprit's lead over the next-latest rank, summed over the step's calls, by the job's clock."""
    return _lead_us({r: records[r]["arrivals"][step] for r in range(WORLD)}) / 1000


def _lead_us(arrivals: dict[int, list]) -> float:
    """Summed over calls: how much later than every other rank the culprit arrived, where it was last."""
    lead = 0.0
    for call in range(CALLS_PER_STEP):
        ordered = sorted((arrivals[r][call], r) for r in range(WORLD))
        (last, rank), (before, _) = ordered[-1], ordered[-2]
        if rank == CULPRIT:
            lead += last - before
    return lead


def _trace_arrivals(out: Path) -> dict[int, dict[int, list[float]]]:
    """By rank and step: when each all_reduce began, as the rank's own profiler trace says (us, the
    host's one clock), read straight from the files: the c10d op starts inside each ProfilerStep span."""
    found: dict[int, dict[int, list[float]]] = {}
    for rank in range(WORLD):
        (path,) = out.glob(f"rank{rank}.*.pt.trace.json.gz")
        events = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
        ops = sorted(e["ts"] for e in events if e["name"] == "c10d::allreduce_")
        found[rank] = {int(e["name"].split("#")[1]): [ts for ts in ops if e["ts"] <= ts < e["ts"] + e["dur"]]
                       for e in events if e["name"].startswith("ProfilerStep#")}
    return found


def test_each_delayed_step_costs_what_the_culprit_slept_there_and_no_other_step_costs_more_than_noise(job):
    out, records = job
    slept = records[CULPRIT]["slept_ns"]
    by_rank = _trace_arrivals(out)
    assert all(len(by_rank[r][s]) == CALLS_PER_STEP for r in range(WORLD) for s in RECORDED)
    assert sorted(slept) == list(DELAYED) and all(ns >= DELAY_S * 1e9 for ns in slept.values())
    doc = orjson.loads(_summary(str(out), "--format", "json"))
    assert doc["impact_outside_steps"] == 0  # every collective lies in a ProfilerStep
    top = doc["impact"][0]
    assert top["rank"] == CULPRIT, doc["impact"]
    steps = {s["step"]: s for s in top["steps"]}
    assert sorted(steps) == list(RECORDED) and {s["window"] for s in top["steps"]} == {1}
    for step in RECORDED:
        cost = steps[step]["cost_us"]
        if step in DELAYED:
            slept_us = slept[step] / 1000
            lead_us = _culprit_lead_us(records, step)
            # At least most of the sleep, at most the culprit's lead by the job's own clock: on a
            # loaded machine it arrives later still than it slept, and the job records that too.
            assert 0.65 * slept_us <= cost <= lead_us + _CLOCK_SLACK_US * CALLS_PER_STEP, \
                (step, steps[step], slept_us, lead_us)
            assert steps[step]["share"] > 0.5  # most of the step's collective time was the wait
        # Every step, delayed or not, costs the culprit's lead by the profiler's own op starts: a step
        # without a sleep costs only what the machine made it late there (a loaded machine can delay
        # a rank for ms between the job's clock reading and the op; the traces record where it was).
        traced_us = _lead_us({r: by_rank[r][step] for r in range(WORLD)})
        assert abs(cost - traced_us) <= _TRACE_SLACK_US * CALLS_PER_STEP, (step, steps[step], traced_us)
    # A window's steps share out its cost: they sum to it.
    assert sum(s["cost_us"] for s in top["steps"]) == pytest.approx(top["by_window"]["1"], abs=0.01)

    text = _summary(str(out))
    line = next(line for line in text.splitlines() if line.startswith("    by step: "))
    named = line.removeprefix("    by step: ").split(", ")
    assert {named[0].split(" ")[1], named[1].split(" ")[1]} == {str(s) for s in DELAYED}, line
    rows = list(csv.DictReader(io.StringIO(_summary(str(out), "--format", "csv", "--table", "impact"))))
    mine = [(int(r["step"]), float(r["part_cost_us"]), float(r["part_share"]))
            for r in rows if r["rank"] == str(CULPRIT) and r["step"]]
    assert mine == [(s["step"], s["cost_us"], s["share"]) for s in top["steps"]]


def test_the_merged_trace_gives_the_same_steps(job, tmp_path):
    """The window markers carry each rank's steps: the summary of the merged trace finds the
    figures of the directory's, also with the ranks' timelines (and their ProfilerStep slices) left
    out; the culprit's per-step track samples each step once, and the window's end."""
    from commtag.merge.pftrace.tracecounts import count

    out, _ = job
    from_dir = orjson.loads(_summary(str(out), "--format", "json"))
    top = from_dir["impact"][0]
    assert top["rank"] == CULPRIT
    for extra in ((), ("--detail", "none")):
        merged = tmp_path / f"merged{len(extra)}.pftrace"
        done = subprocess.run([sys.executable, "-m", "commtag", "merge", str(out), "-o", str(merged), *extra],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        checked = subprocess.run([sys.executable, "-m", "commtag", "validate", str(merged)], capture_output=True,
                                 text=True, timeout=300)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        png = tmp_path / f"plot{len(extra)}.png"
        from_trace = orjson.loads(_summary(str(merged), "--format", "json", "--plot", str(png)))
        assert from_trace["impact"] == from_dir["impact"], extra
        assert from_trace["impact_outside_steps"] == from_dir["impact_outside_steps"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        tracks = count(merged).counter_tracks
        assert tracks[f"impact per step: what rank {CULPRIT}'s lateness cost the step (ms)"] == len(top["steps"]) + 1
        per_step = [name for name in tracks if name.startswith("impact per step: ")]
        assert len(per_step) == sum(1 for r in from_dir["impact"] if r["cost_us"] > 0 and r["steps"]), per_step

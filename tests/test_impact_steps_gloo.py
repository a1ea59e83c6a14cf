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
#: How far commtag's step costs may differ from the same replay done here on the files' times: the
#: merge's clock alignment of ranks on one host, and the traces' microsecond rounding.
_REPLAY_SLACK_US = 20.0


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


def _trace_steps(out: Path) -> dict[int, float]:
    """By step: what the culprit's lateness cost it, replayed here from the files alone as the
    analysis states it (commtag.merge.analysis.impact): the k-th ``gloo:all_reduce`` work of every
    rank is one collective; where the culprit's work started last, it starts instead as early as
    the next-latest one did, but no earlier than its own previous work's end; every member's end
    moves as the collective's last start does, and each later work of a rank as its previous one."""
    works, first_event, step_spans = [], 0.0, []
    for rank in range(WORLD):
        (path,) = out.glob(f"rank{rank}.*.pt.trace.json.gz")
        events = [e for e in orjson.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
        works.append(sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] == "gloo:all_reduce"))
        if rank == CULPRIT:
            first_event = min(e["ts"] for e in events)
        step_spans.append(sorted((e["ts"], int(e["name"].split("#")[1])) for e in events
                                 if e["name"].startswith("ProfilerStep#")))
    count = len(works[0])
    assert count == len(RECORDED) * CALLS_PER_STEP and all(len(w) == count for w in works)
    moved = [0.0] * count
    for c in range(count):
        starts = sorted((works[r][c][0], r) for r in range(WORLD))
        (last, late), (before, _) = starts[-1], starts[-2]
        cut = last - before if late == CULPRIT and before >= first_event else 0.0
        arrivals = []
        for r in range(WORLD):
            start = works[r][c][0]
            ended = [(works[r][j][1], j) for j in range(count) if j != c and works[r][j][1] <= start]
            previous = max(ended)[1] if ended else None
            arrival = start + (moved[previous] if previous is not None else 0.0)
            if r == late and cut:
                arrival -= cut if previous is None else min(cut, start - works[r][previous][1])
            arrivals.append(arrival)
        moved[c] = max(arrivals) - last
    by_step: dict[int, list[int]] = {}
    for c in range(count):
        first, rank = min((works[r][c][0], r) for r in range(WORLD))
        step = max(n for ts, n in step_spans[rank] if ts <= first)
        by_step.setdefault(step, []).append(c)
    costs, earlier_before = {}, 0.0
    for step, calls in sorted(by_step.items()):
        ends = {c: max(works[r][c][1] for r in range(WORLD)) for c in calls}
        earlier = max(ends.values()) - max(ends[c] + moved[c] for c in calls)
        costs[step] = earlier - earlier_before
        earlier_before = earlier
    return costs


def test_each_delayed_step_costs_what_the_culprit_slept_there_and_no_other_step_costs_more_than_noise(job):
    out, records = job
    slept = records[CULPRIT]["slept_ns"]
    replayed = _trace_steps(out)
    assert sorted(replayed) == list(RECORDED)
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
        # Every step, delayed or not, costs what the same replay done on the files' own times gives
        # it: a step without a sleep costs only what the machine made the culprit late there.
        assert abs(cost - replayed[step]) <= _REPLAY_SLACK_US * CALLS_PER_STEP, (step, steps[step], replayed)
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

"""What a late rank cost, and all-to-all traffic, on real 4-rank gloo jobs (tests/straggler_world.py).

The truth is what each job recorded it did: how long its culprit really slept,
when each rank arrived at each collective (one host clock for all ranks) and
how many elements each rank sent each peer. commtag's figures come from the
profiler's traces and commtag's annotations only.
"""

from __future__ import annotations

import csv
import io
import statistics
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from straggler_world import STEPS, WORLD, run_straggler_world

pytestmark = pytest.mark.slow

CULPRIT = 2
DELAY_S = 0.05
_PAIRS = ((0, 1), (2, 3))
#: Per call, how far the job's clock (read just before the call) and the profiler's op start may
#: disagree on a rank's arrival: the call's own way into the op, ms on a loaded 2-core machine.
_CLOCK_SLACK_US = 1000.0


@pytest.fixture(scope="module")
def culprit_job(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("culprit")
    return out, run_straggler_world(out, CULPRIT, DELAY_S)


@pytest.fixture(scope="module")
def quiet_job(tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("quiet")
    return out, run_straggler_world(out)


def _summary(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "commtag", "summary", *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _measured_leads(records: list[dict]) -> dict[int, int]:
    """Rank -> its summed lead (ns) over the next-latest member at the calls it arrived last to,
    by the job's own clock. At the barrier opening the window only the part after the late
    rank's profiler started counts: the time before it is the profilers' start-up spread, which no
    trace covers (commtag counts no lead its late rank's trace does not cover)."""
    leads = dict.fromkeys(range(WORLD), 0)
    for call in range(len(records[0]["arrivals"])):
        if call % 4 == 2:  # the barrier, then a step's world all_reduce, pair all_reduce and two all-to-alls
            groups = _PAIRS
        else:
            groups = (tuple(range(WORLD)),)
        for members in groups:
            arrivals = sorted((records[r]["arrivals"][call], r) for r in members)
            (last, rank), (before, _) = arrivals[-1], arrivals[-2]
            if call == 0:
                before = max(before, records[rank]["profiling_ns"])
            leads[rank] += max(0, last - before)
    return leads


def test_the_culprit_costs_about_what_it_slept(culprit_job):
    out, records = culprit_job
    slept_us = records[CULPRIT]["slept_ns"] / 1000
    assert slept_us >= STEPS * DELAY_S * 1e6
    doc = orjson.loads(_summary(str(out), "--format", "json"))
    impact = doc["impact"]
    assert impact[0]["rank"] == CULPRIT, impact
    assert abs(impact[0]["cost_us"] - slept_us) <= 0.35 * slept_us, (impact[0], slept_us)
    assert impact[0]["share"] == pytest.approx(impact[0]["cost_us"] / doc["impact_profiled_us"], rel=1e-3)
    assert impact[0]["by_op"]["allreduce"] >= 0.65 * slept_us
    # No other rank cost more than all the lateness the job's clock saw besides the culprit's.
    leads = _measured_leads(records)
    noise_us = sum(lead for rank, lead in leads.items() if rank != CULPRIT) / 1000
    noise_us += _CLOCK_SLACK_US * len(records[0]["arrivals"])
    assert all(row["cost_us"] <= noise_us for row in impact[1:]), (impact, leads)
    text = _summary(str(out))
    assert f"  rank {CULPRIT}: {impact[0]['cost_us'] / 1000:.2f} ms" in text
    table = list(csv.DictReader(io.StringIO(_summary(str(out), "--format", "csv", "--table", "impact"))))
    mine = [row for row in table if row["rank"] == str(CULPRIT)]
    assert [float(row["cost_us"]) for row in mine if row["op"] == row["window"] == ""] == [impact[0]["cost_us"]]
    assert {row["op"]: float(row["part_cost_us"]) for row in mine if row["op"]} == impact[0]["by_op"]
    # One profiled window: its cost is the whole cost.
    assert impact[0]["by_window"] == {"1": impact[0]["cost_us"]}


def test_without_a_culprit_no_rank_costs_more_than_the_measured_noise(quiet_job, culprit_job):
    out, records = quiet_job
    assert all(r["slept_ns"] == 0 for r in records)
    # The noise: all the lateness the job's clock saw, on every rank together. (Per rank, the
    # clock read before a call and the profiler's op start differ by a loaded machine's ms.)
    leads = _measured_leads(records)
    noise_us = sum(leads.values()) / 1000 + _CLOCK_SLACK_US * len(records[0]["arrivals"])
    impact = orjson.loads(_summary(str(out), "--format", "json"))["impact"]
    assert all(row["cost_us"] <= noise_us for row in impact), (impact, leads)
    culprit = orjson.loads(_summary(str(culprit_job[0]), "--format", "json"))["impact"][0]
    assert culprit["cost_us"] > 2 * noise_us


def _window_all_to_alls(doc: dict, collective: str = "all_to_allv") -> list[dict]:
    found = [a for a in doc["all_to_all"] if a["collective"] == collective]
    assert len(found) == STEPS
    return found


def test_all_to_all_matrix_is_what_each_rank_sent(culprit_job):
    out, records = culprit_job
    doc = orjson.loads(_summary(str(out), "--format", "json"))
    sent = [records[r]["sent"] for r in range(WORLD)]
    sent_bytes = [4 * sum(row) for row in sent]
    imbalance = max(sent_bytes) / (sum(sent_bytes) / WORLD)
    for a in _window_all_to_alls(doc):
        assert a["ranks"] == list(range(WORLD))
        assert a["matrix"] == sent
        assert a["sent_bytes"] == sent_bytes
        assert a["size_imbalance"] == pytest.approx(imbalance)
        assert a["not_recorded"] is None
    # all_to_all of tensor lists: its split sizes are the tensors' element counts.
    sent_list = [records[r]["sent_list"] for r in range(WORLD)]
    for a in _window_all_to_alls(doc, "all_to_all"):
        assert a["matrix"] == sent_list
        assert a["size_imbalance"] == pytest.approx(max(map(sum, sent_list)) / (sum(map(sum, sent_list)) / WORLD))
    text = _summary(str(out))
    list_imbalance = max(map(sum, sent_list)) / (sum(map(sum, sent_list)) / WORLD)
    p50 = statistics.median([imbalance] * STEPS + [list_imbalance] * STEPS)
    worst = max(imbalance, list_imbalance)
    assert f"{2 * STEPS} instances; imbalance p50 {p50:.2f}, worst {worst:.2f}" in text
    rows = list(csv.DictReader(io.StringIO(_summary(str(out), "--format", "csv", "--table", "all_to_all"))))
    rows = [r for r in rows if r["collective"] == "all_to_allv"]
    assert len(rows) == STEPS * WORLD * WORLD
    assert {(int(r["sender"]), int(r["receiver"]), int(r["elements"])) for r in rows} == {
        (i, j, sent[i][j]) for i in range(WORLD) for j in range(WORLD)}


def test_merged_trace_carries_the_impact_track_and_reads_back_the_same(culprit_job, tmp_path):
    from commtag.merge.pftrace.tracecounts import count
    from pftrace_reader import read

    out, _ = culprit_job
    merged = tmp_path / "merged.pftrace"
    done = subprocess.run([sys.executable, "-m", "commtag", "merge", str(out), "-o", str(merged)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    checked = subprocess.run([sys.executable, "-m", "commtag", "validate", str(merged)], capture_output=True,
                             text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # the impact tracks break no import rule
    from_dir = orjson.loads(_summary(str(out), "--format", "json"))
    from_trace = orjson.loads(_summary(str(merged), "--format", "json", "--plot", str(tmp_path / "plot.png")))
    assert from_trace["impact"] == from_dir["impact"]
    assert from_trace["all_to_all"] == from_dir["all_to_all"]
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    counts = count(merged)
    parsed = read(merged)  # the strict reader the merge tests use: the counts agree with it
    assert counts.slices == sum(not s.instant for s in parsed.slices) > 0
    assert counts.instants == sum(s.instant for s in parsed.slices)
    assert counts.flows == len({f for s in parsed.slices for f in (*s.flows_out, *s.flows_in)}) > 0
    assert counts.args >= sum(len(s.args) for s in parsed.slices)
    track = f"impact: without rank {CULPRIT}'s lateness, ends earlier by (ms)"
    assert counts.counter_tracks[track] >= STEPS
    # Counters grow with a group's collectives, not with its ranks: a busbw track per group,
    # two samples (start, end) per instance, whatever the group's size.
    per_group: dict[str, int] = {}
    for c in from_dir["collectives"]:
        if c["busbw_gbps"] is not None:
            per_group[c["lane"]] = per_group.get(c["lane"], 0) + 1
    for lane, instances in per_group.items():
        assert counts.counter_tracks[f"busbw {lane} (GB/s)"] <= 2 * instances
    impact_samples = sum(n for name, n in counts.counter_tracks.items() if name.startswith("impact:"))
    assert impact_samples <= len(from_dir["impact"]) * (len(from_dir["collectives"]) + 1)

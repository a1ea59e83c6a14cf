"""--steps on a real 3-rank gloo job whose ranks number their profiler steps apart
(tests/uneven_steps_world.py: the culprit calls prof.step() once more than its peers and is late
in the others' step 3): steps are matched by the Seqs of their collectives, the merge says so,
and the straggler of that step is found on every rank's same work; a selection that cuts a
collective's members is said to be outside the selection, never that a rank did not record it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gloo_world import NOISE_BOUND
from uneven_steps_world import CALLS_PER_STEP, CULPRIT, DELAYED_STEP, WORLD, run_uneven_steps_world

pytestmark = pytest.mark.slow

DELAY_S = 0.3
_DISAGREE = "ProfilerStep#N numbers disagree: rank 1 numbers the same work 1 step above rank 0's"


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uneven")
    records = run_uneven_steps_world(out, DELAY_S)
    assert records[CULPRIT]["slept_ns"] >= DELAY_S * 1e9
    return out


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commtag", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_steps_keep_the_same_work_on_every_rank_and_find_its_straggler(job, tmp_path, jobs):
    merged = tmp_path / "step3.pftrace"
    done = _run("merge", str(job), "-o", str(merged), "--steps", str(DELAYED_STEP), "-j", jobs)
    assert done.returncode == 0, done.stderr
    assert _DISAGREE in done.stderr and "matched by the Seqs of the collectives" in done.stderr, done.stderr
    summary = _run("summary", str(merged), "--format", "json")
    assert summary.returncode == 0, summary.stderr
    doc = orjson.loads(summary.stdout)
    calls = doc["collectives"]
    assert len(calls) == CALLS_PER_STEP and not doc["findings"], doc
    assert all(c["ranks"] == list(range(WORLD)) and not c["missing_ranks"] for c in calls), calls
    assert len({c["seq"] for c in calls}) == CALLS_PER_STEP  # one iteration's calls, the same on every rank
    late = max(calls, key=lambda c: c["skew_us"])
    assert late["straggler"] and late["last_rank"] == CULPRIT and late["skew_us"] >= 0.9 * DELAY_S * 1e6, calls
    assert late["seq"] == max(c["seq"] for c in calls)  # the step's second call, where it slept
    # Another call's straggler, if any, is one the machine's load made, within its noise.
    assert all(c["skew_us"] < NOISE_BOUND * DELAY_S * 1e6 for c in calls if c["straggler"] and c is not late), calls


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_whole_merge_and_the_summary_say_the_step_numbers_disagree(job, tmp_path, jobs):
    """Without --steps every event is kept, and the merge and the summary of the folder still say
    that the ranks number their steps apart, and how --steps would match them."""
    done = _run("merge", str(job), "-o", str(tmp_path / "all.pftrace"), "-j", jobs)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "disagree" in line]
    assert len(said) == 1 and _DISAGREE in said[0] and "matched by the Seqs" in said[0], done.stderr
    summary = _run("summary", str(job))
    assert summary.returncode == 0 and _DISAGREE in summary.stderr, summary.stderr


def test_a_window_cutting_a_straggler_says_its_peers_are_outside_the_selection(job, tmp_path):
    """A --window starting just before the culprit's late arrival keeps its call and leaves out its
    peers', which started 0.3 s earlier: the summary says the selection left them out."""
    from commtag.merge.inputs.selection import event_range

    whole = orjson.loads(_run("summary", str(job), "--format", "json").stdout)
    # The culprit's sleep, not a straggler the machine's load made of another call.
    late = next(c for c in whole["collectives"]
                if c["straggler"] and c["last_rank"] == CULPRIT and c["skew_us"] >= 0.9 * DELAY_S * 1e6)
    origin = event_range((path, 0) for path in job.glob("*.pt.trace.json.gz"))[0]
    arrival_ms = (late["start_ns"] + late["skew_us"] * 1000 - origin) / 1e6
    window = f"{arrival_ms - 1:.3f}:{arrival_ms + 1:.3f}"
    merged = tmp_path / "window.pftrace"
    done = _run("merge", str(job), "-o", str(merged), "--window", window)
    assert done.returncode == 0, done.stderr
    summary = _run("summary", str(merged))
    assert summary.returncode == 0, summary.stderr
    assert "incomplete because a member rank's part lies outside the selection (--window " in summary.stdout, \
        summary.stdout
    assert "did not record" not in summary.stdout, summary.stdout
    doc = orjson.loads(_run("summary", str(merged), "--format", "json").stdout)
    cut = next(c for c in doc["collectives"] if (c["lane"], c["seq"]) == (late["lane"], late["seq"]))
    assert cut["ranks"] == [CULPRIT] and cut["missing_ranks"] and not doc["findings"], doc

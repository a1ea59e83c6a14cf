"""The merge's views on real gloo traces: --steps, --window.

A 4-rank gloo job (tests/views_world.py) profiled over steps 1-3 with
several process groups, merged whole and with a selection; what a user
checks in the file: the chosen steps and nothing else, on every rank, lanes
included, and every event read either written or counted as left out.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import orjson
import pytest

from commtag.merge.analysis.hook import MergeAnalysis
from commtag.merge.engine.budget import estimate, upper_bound
from commtag.merge.inputs.load import discover
from merging import merge
from commtag.merge.pftrace.readback import read_instances
from commtag.merge.inputs.selection import (
    OUTSIDE_SELECTION, Selection, file_spans, parse_detail, parse_numbers, parse_window,
)
from commtag.merge.pftrace.validate import validate_file
from gloo_world import run_world
from pftrace_reader import lane_of, read
from torchrun_merge import torchrun_merge
from views_world import PROFILED_STEPS, calls_per_step, profiled_steps

pytestmark = pytest.mark.slow  # a real gloo world, the CLI in subprocesses, torchrun


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("views4")
    run_world(profiled_steps, 4, str(out))
    return out


@pytest.fixture(scope="module")
def whole(traces: Path, tmp_path_factory: pytest.TempPathFactory):
    result = merge(traces, tmp_path_factory.mktemp("whole") / "all.pftrace", progress=False, analysis=MergeAnalysis())
    return result, read(result.output)


def _merge(traces: Path, out: Path, selection: Selection):
    hook = MergeAnalysis()
    result = merge(traces, out, progress=False, selection=selection, analysis=hook)
    assert validate_file(out) == []
    return result, read(out), hook


def _rank_of(parsed, slice_) -> int:
    return int(parsed.process_of(slice_.track).process.process_name.split(" ")[1])


def _owner(parsed, slice_):
    """The rank a slice belongs to: its lane slice's "commtag rank", else its process's; None for neither."""
    if "commtag rank" in slice_.args and "commtag pg uid" in slice_.args:
        return int(slice_.args["commtag rank"])
    return _rank_of(parsed, slice_) if parsed.process_of(slice_.track) is not None else None


def _steps_by_rank(parsed) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for s in parsed.slices:
        if s.name.startswith("ProfilerStep#"):
            out.setdefault(_rank_of(parsed, s), set()).add(int(s.name.split("#")[1]))
    return out


def _lane_counts(parsed) -> Counter:
    """(rank, lane-name kind) -> lane slices, kind as views_world.calls_per_step names it."""
    counts: Counter = Counter()
    for s in parsed.slices:
        if "commtag pg uid" in s.args and "commtag rank" in s.args and not s.instant:
            lane = str(s.args["commtag lane"])
            kind = next(k for k in calls_per_step(1) if k in lane)
            counts[(int(s.args["commtag rank"]), kind)] += 1
    return counts


def _step_spans(parsed) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, step) -> (start, start of the rank's next step or its last event's end)."""
    marks: dict[int, list[tuple[int, int]]] = {}
    last: dict[int, int] = {}
    for s in parsed.slices:
        rank = _rank_of(parsed, s) if parsed.process_of(s.track) is not None else None
        if rank is None:
            continue
        last[rank] = max(last.get(rank, 0), s.end)
        if s.name.startswith("ProfilerStep#"):
            marks.setdefault(rank, []).append((s.ts, int(s.name.split("#")[1])))
    out = {}
    for rank, found in marks.items():
        found.sort()
        for k, (ts, step) in enumerate(found):
            out[(rank, step)] = (ts, found[k + 1][0] if k + 1 < len(found) else last[rank] + 1)
    return out


def test_the_job_recorded_three_steps_on_every_rank(whole) -> None:
    _, parsed = whole
    assert _steps_by_rank(parsed) == {r: set(PROFILED_STEPS) for r in range(4)}
    expected = {(r, kind): sum(calls_per_step(s)[kind] for s in PROFILED_STEPS)
                for r in range(4) for kind in calls_per_step(1)}
    assert _lane_counts(parsed) == expected


@pytest.mark.parametrize("spec", ["2", "1,3"])
def test_steps_keep_exactly_the_chosen_steps_lanes_included(traces: Path, whole, tmp_path: Path, spec: str) -> None:
    chosen = parse_numbers(spec, "--steps")
    result, parsed, hook = _merge(traces, tmp_path / "steps.pftrace", Selection(steps=chosen))
    assert _steps_by_rank(parsed) == {r: set(chosen) for r in range(4)}
    assert _lane_counts(parsed) == {(r, kind): sum(calls_per_step(s)[kind] for s in chosen)
                                    for r in range(4) for kind in calls_per_step(1)}
    # every slice of a rank starts inside one of its chosen steps, and nothing of those steps is lost
    spans = _step_spans(whole[1])

    def in_chosen(parsed_, s) -> bool:
        rank = _owner(parsed_, s)
        return any(spans[(rank, n)][0] <= s.ts < spans[(rank, n)][1] for n in chosen)

    assert all(in_chosen(parsed, s) for s in parsed.slices if _owner(parsed, s) is not None)
    assert (sorted((s.name, s.ts) for s in whole[1].slices
                   if _owner(whole[1], s) is not None and not s.instant and in_chosen(whole[1], s))
            == sorted((s.name, s.ts) for s in parsed.slices if _owner(parsed, s) is not None and not s.instant))
    # what was left out is counted, per rank
    for account in result.accounts:
        assert account.left_out[OUTSIDE_SELECTION] > 0
        assert account.read == account.written + sum(account.left_out.values())
    # the steps left out between 1 and 3 are not taken for missing collectives
    assert not hook.result.desyncs


def _job_events(traces: Path) -> tuple[int, int]:
    """The first start and last end (ns) of any rank's slices and instants, read from the files."""
    spans = []
    for path in traces.glob("*.pt.trace.json.gz"):
        trace = orjson.loads(gzip.decompress(path.read_bytes()))
        base = trace["baseTimeNanoseconds"]
        timed = [e for e in trace["traceEvents"] if e.get("ph") in ("X", "i")]
        spans += [(round(e["ts"] * 1000) + base, round((e["ts"] + e.get("dur", 0)) * 1000) + base) for e in timed]
    return min(s[0] for s in spans), max(s[1] for s in spans)


def test_window_counts_from_the_jobs_first_event(traces: Path, whole, tmp_path: Path) -> None:
    """torch's CPU traces put baseTimeNanoseconds weeks before their events: --window 0:N must
    still keep the job's first N ms, and a window past the events say where they lie."""
    first, last = _job_events(traces)
    assert min(s.ts for s in whole[1].slices) == first
    result, parsed, _ = _merge(traces, tmp_path / "start.pftrace", Selection(window=parse_window("0:1")))
    assert parsed.slices and all(first <= s.ts < first + 10**6 for s in parsed.slices)
    assert min(s.ts for s in parsed.slices) == first
    proc = subprocess.run([sys.executable, "-m", "commtag", "merge", str(traces), "-o", str(tmp_path / "none.pftrace"),
                           "--window", f"{(last - first) / 1e6 + 1}:{(last - first) / 1e6 + 2}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        f"keeps no event of any rank (START_MS:END_MS count from the job's first event; events lie from 0 to "
        f"{(last - first) / 1e6:.3f} ms)"), proc.stderr


def test_window_keeps_what_starts_in_it_on_every_rank(traces: Path, whole, tmp_path: Path) -> None:
    earliest = _job_events(traces)[0]
    spans = _step_spans(whole[1])
    start = min(spans[(r, 2)][0] for r in range(4))
    end = max(spans[(r, 2)][1] for r in range(4))
    window = parse_window(f"{(start - earliest) / 1e6}:{(end - earliest) / 1e6}")
    low, high = earliest + window[0], earliest + window[1]
    result, parsed, _ = _merge(traces, tmp_path / "window.pftrace", Selection(window=window))
    expected = sorted((i.rank, i.pg_uid, i.seq) for i in whole[0].instances if low <= i.start_ns < high)
    assert sorted((i.rank, i.pg_uid, i.seq) for i in result.instances) == expected
    assert len(expected) >= 4 * sum(calls_per_step(2).values())
    assert all(low <= s.ts < high for s in parsed.slices)
    assert sorted(s.name for s in whole[1].slices if low <= s.ts < high and not s.instant) == sorted(
        s.name for s in parsed.slices if not s.instant)
    assert sum(1 for s in parsed.slices if s.name == "ProfilerStep#2") == 4


def test_a_bad_spec_is_one_line_and_exit_2(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "bad.pftrace"
    for option in (["--steps", "2-x"], ["--window", "5"], ["--window", "9:3"], ["--steps", "1", "--window", "0:5"],
                   ["--detail", "0,x"], ["--window", "0:inf"], ["--max-output", "0.1"]):
        proc = subprocess.run([sys.executable, "-m", "commtag", "merge", str(traces), "-o", str(out), *option],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (option, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert not out.exists()


@pytest.mark.parametrize(("option", "said"), [
    (["--steps", "9"], "--steps 9 keeps no event of any rank (rank 0's "),
    (["--steps", "7-9", "--detail", "none"], "--steps 7-9 keeps no event of any rank (rank 0's "),
    (["--window", "100000:200000"], "--window 100000:200000 keeps no event of any rank"),
    (["--detail", "7"], "--detail names rank 7, which no trace here holds (ranks 0-3)"),
    (["--detail", "0,4-5"], "--detail names ranks 4-5, which no trace here holds (ranks 0-3)"),
])
def test_a_selection_of_nothing_is_one_line_and_exit_2(traces: Path, tmp_path: Path, option: list[str],
                                                       said: str) -> None:
    """Steps or a window no rank has, or a --detail rank not in the job: an error, not an empty
    trace or a trace silently without the timeline asked for; the earlier output stays."""
    out = tmp_path / "merged.pftrace"
    out.write_bytes(b"an earlier merge")
    proc = subprocess.run([sys.executable, "-m", "commtag", "merge", str(traces), "-o", str(out), *option],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (option, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"commtag merge: error: {traces}: {said}"), line
    if option[0] == "--steps":
        assert line.endswith("holds steps 1-3)"), line
    assert out.read_bytes() == b"an earlier merge" and [p.name for p in tmp_path.iterdir()] == [out.name]


def _renumbered(traces: Path, out: Path, rank: int, shift: int) -> Path:
    """A copy of the job where ``rank``'s ProfilerStep#N are named N + shift (as a rank of
    another schedule would record them), without that rank's sidecar: no Seq of its collectives
    can then match its steps to its peers', so its file truly lacks their numbers; the path of
    that rank's trace."""
    out.mkdir()
    renamed = None
    for path in traces.iterdir():
        data = path.read_bytes()
        if path.name.endswith(".commtag.json") and orjson.loads(data)["rank"] == rank:
            continue
        trace = orjson.loads(gzip.decompress(data)) if path.name.endswith(".pt.trace.json.gz") else None
        if trace is not None and trace["distributedInfo"]["rank"] == rank:
            for e in trace["traceEvents"]:
                if str(e.get("name", "")).startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + shift}"
            data, renamed = gzip.compress(orjson.dumps(trace)), out / path.name
        (out / path.name).write_bytes(data)
    assert renamed is not None
    return renamed


@pytest.mark.parametrize("options", [["-j", "2", "--max-output", "none"], ["-j", "1", "--max-output", "estimate"]])
def test_a_file_without_the_steps_is_said_once(traces: Path, whole, tmp_path: Path, options: list[str]) -> None:
    """The notice for a rank whose file lacks the chosen steps comes once: also when another -j worker
    merged that rank, and when the size estimate sampled it first."""
    renamed = _renumbered(traces, tmp_path / "job", 3, 10)
    job = renamed.parent
    if options[-1] == "estimate":  # a limit the cheap upper bound exceeds: the estimate samples every rank
        limit = whole[0].output.stat().st_size
        assert upper_bound(discover([job], None)) > limit
        options = [*options[:-1], str(limit)]
    proc = subprocess.run([sys.executable, "-m", "commtag", "merge", str(job), "-o", str(tmp_path / "m.pftrace"),
                           "--no-progress", "--steps", "2", *options], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "none of --steps 2 is in it" in line]
    assert said == [f"commtag merge: notice: {renamed}: none of --steps 2 is in it (it holds steps 11-13); "
                    "its events are left out"], proc.stderr


def _timeline_slices(parsed) -> Counter:
    """rank -> slices on its CPU threads and GPU streams (not lanes, not commtag's own tracks)."""
    counts: Counter = Counter()
    for s in parsed.slices:
        if parsed.process_of(s.track) is not None and "commtag rank" not in s.args and not s.instant:
            counts[_rank_of(parsed, s)] += 1
    return counts


def test_detail_0_writes_threads_of_rank_0_only_and_every_rank_lanes(traces: Path, whole, tmp_path: Path) -> None:
    result, parsed, _ = _merge(traces, tmp_path / "detail0.pftrace", Selection(detail=parse_detail("0")))
    full = _timeline_slices(whole[1])
    assert _timeline_slices(parsed) == {0: full[0]}
    thread_rows = {_rank_of(parsed, s) for s in parsed.slices if "CPU threads" in parsed.name_path(s.track)}
    assert thread_rows == {0}
    assert _lane_counts(parsed) == _lane_counts(whole[1])
    assert sorted(p.process.process_name.split(" ")[1] for p in parsed.processes()) == ["0", "1", "2", "3"]
    for account in result.accounts:
        assert account.read == account.written + sum(account.left_out.values())
        assert (account.written > 0) == (account.rank == 0)


def test_detail_none_writes_every_lane_slice_and_no_op(traces: Path, whole, tmp_path: Path) -> None:
    result, parsed, _ = _merge(traces, tmp_path / "none.pftrace", Selection(detail=parse_detail("none")))
    assert not _timeline_slices(parsed)
    names = {s.name for s in parsed.slices}
    assert not any(n.startswith(("c10d::", "gloo:", "aten::", "ProfilerStep")) for n in names)
    assert _lane_counts(parsed) == _lane_counts(whole[1])
    lanes = [(s.args["commtag rank"], s.args["commtag pg uid"], s.args["Seq"], s.ts) for s in parsed.slices
             if "commtag rank" in s.args and "commtag pg uid" in s.args]
    assert sorted(lanes) == sorted((s.args["commtag rank"], s.args["commtag pg uid"], s.args["Seq"], s.ts)
                                   for s in whole[1].slices if "commtag rank" in s.args and "commtag pg uid" in s.args)
    assert all(a.written == 0 and a.left_out["timeline not written (--detail)"] > 0 for a in result.accounts)


def _heads(parsed) -> list:
    """The process-group view's groups: top-level tracks outside every process, in their order."""
    heads = [d for d in parsed.tracks.values() if not d.HasField("parent_uuid") and not d.HasField("process")
             and any(c.parent_uuid == d.uuid for c in parsed.tracks.values() if c.HasField("parent_uuid"))]
    return sorted(heads, key=lambda d: d.sibling_order_rank)


def test_group_view_has_a_row_per_member_holding_its_lane_slices_and_flows(whole) -> None:
    result, parsed = whole
    assert validate_file(result.output) == []
    heads = _heads(parsed)
    names = [h.name for h in heads]
    assert names[0] == "PG 0 (default_pg) [0, 1, 2, 3]"
    assert names == ["PG 0 (default_pg) [0, 1, 2, 3]", "PG 1 (tp) [0, 1]", "PG 2 (tp) [2, 3]", "PG 3 (dp) [0, 2]",
                     "PG 4 (dp) [1, 3]"]
    assert max(h.sibling_order_rank for h in heads) < min(p.sibling_order_rank for p in parsed.processes())
    by_row: dict[tuple[int, str], list] = {}
    for s in parsed.slices:
        where = lane_of(parsed, s)
        if where is not None and not s.instant:
            by_row.setdefault(where, []).append(s)
    for head in heads:
        members = [int(r) for r in head.name.split("[")[1].rstrip("]").split(",")]
        rows = sorted((d for d in parsed.tracks.values() if d.parent_uuid == head.uuid and d.HasField("parent_uuid")),
                      key=lambda d: d.sibling_order_rank)
        assert [d.name for d in rows] == [f"rank {r}" for r in members] + [f"busbw {head.name} (GB/s)"]
        kind = next(k for k in calls_per_step(1) if k in head.name)
        for rank in members:
            slices = by_row[(rank, head.name)]
            # as many slices as the rank made calls on the group, each its own with its lane's args
            assert len(slices) == sum(calls_per_step(s)[kind] for s in PROFILED_STEPS)
            assert len(slices) == sum(1 for i in result.instances if i.rank == rank and i.lane_name == head.name)
            assert all(s.args["commtag rank"] == rank and s.args["commtag lane"] == head.name for s in slices)
    # flows: every member of a collective is linked to the others, and each slice to its rank's c10d op
    op_flows = {(f, _rank_of(parsed, s)) for s in parsed.slices if s.name.startswith("c10d::")
                and parsed.process_of(s.track) is not None for f in s.flows_out}
    view = [s for rows in by_row.values() for s in rows]
    assert all(any((f, s.args["commtag rank"]) in op_flows for f in s.flows_in) for s in view)
    for s in view:
        peers = [p for p in view if p is not s and p.args["commtag pg uid"] == s.args["commtag pg uid"]
                 and p.args["Seq"] == s.args["Seq"]]
        linked = set(s.flows_out) | set(s.flows_in)
        assert all(linked & (set(p.flows_out) | set(p.flows_in)) for p in peers)
    # nothing is drawn twice: no lane slices inside the processes
    assert not [s for s in parsed.slices if parsed.process_of(s.track) is not None and "commtag rank" in s.args
                and "commtag pg uid" in s.args]


def test_summary_and_readback_count_each_collective_once(traces: Path, whole) -> None:
    result, _ = whole
    assert len(read_instances(result.output)) == len(result.instances) == 4 * 12
    merged, directory = (
        subprocess.run([sys.executable, "-m", "commtag", "summary", str(source), "--format", "csv"],
                       capture_output=True, text=True, timeout=300)
        for source in (result.output, traces))
    assert merged.returncode == directory.returncode == 0, merged.stderr + directory.stderr
    assert merged.stdout == directory.stdout
    counts = {row["lane"]: int(row["count"]) for row in csv.DictReader(io.StringIO(merged.stdout))}
    assert counts == {"PG 0 (default_pg) [0, 1, 2, 3]": 6, "PG 1 (tp) [0, 1]": 3, "PG 2 (tp) [2, 3]": 3,
                      "PG 3 (dp) [0, 2]": 3, "PG 4 (dp) [1, 3]": 3}


@pytest.mark.parametrize("options", [[], ["--steps", "2,3", "--detail", "0,3"], ["--detail", "none"]])
def test_torchrun_writes_the_same_views(traces: Path, tmp_path: Path, options: list[str]) -> None:
    single, double = tmp_path / "single.pftrace", tmp_path / "double.pftrace"
    one = subprocess.run([sys.executable, "-m", "commtag.merge", str(traces), "-o", str(single), "--no-progress",
                          *options], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    two = torchrun_merge([str(traces), "-o", str(double), "--no-progress", *options])
    assert two.returncode == 0, two.stderr[-3000:]
    assert validate_file(double) == []
    first, second = read(single), read(double)
    assert second.tracks == first.tracks
    assert second.slices == first.slices
    assert len(_heads(second)) == 5


@pytest.mark.parametrize("selection", [None, Selection(detail=frozenset()), Selection(steps=frozenset({2})),
                                       Selection(detail=frozenset({0}), steps=frozenset({1, 3}))])
def test_size_estimate_is_within_a_quarter_with_each_view(traces: Path, tmp_path: Path, selection) -> None:
    ranks = discover([traces], None)
    spans = file_spans(selection, None, []) if selection else None
    guess = estimate(ranks, selection, spans).total(selection)
    _, parsed, _ = _merge(traces, tmp_path / "sized.pftrace", selection or Selection())
    real = (tmp_path / "sized.pftrace").stat().st_size
    assert 0.75 * real <= guess <= 1.25 * real, (guess, real)


def _merge_within(traces: Path, out: Path, limit: int, *extra: str) -> subprocess.CompletedProcess:
    """``commtag merge`` with ``--max-output limit`` (and ``extra``), as a user runs it."""
    return subprocess.run([sys.executable, "-m", "commtag", "merge", str(traces), "-o", str(out), "--max-output",
                           str(limit), *extra], capture_output=True, text=True, timeout=300)


def test_max_output_stops_before_writing_and_names_what_fits(traces: Path, whole, tmp_path: Path) -> None:
    out = tmp_path / "merged.pftrace"
    out.write_bytes(b"an earlier merge")
    limit = whole[0].output.stat().st_size // 2
    proc = _merge_within(traces, out, limit)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"commtag merge: error: {out}: the merged trace would take about ")
    assert f"above --max-output {limit / 1e3:.2f} kB" in line
    assert out.read_bytes() == b"an earlier merge" and sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    advice = re.search(r"(--detail \S+) \(about", line)
    assert advice, line
    fitted = _merge_within(traces, out, limit, *advice.group(1).split())
    assert fitted.returncode == 0, fitted.stderr
    assert out.stat().st_size <= limit


def test_max_output_below_the_lanes_alone_names_detail_none_with_steps(traces: Path, tmp_path: Path) -> None:
    """A big job whose lanes alone exceed the limit: no --detail alone fits, but the comm view of
    fewer steps does, and the advice says so (the README's first command for a big job)."""
    # A step's lanes fit, not all (a step's are more than a third: each rank interns its names once).
    limit = int(sum(estimate(discover([traces], None)).lanes.values()) * 3 / 4)
    out = tmp_path / "merged.pftrace"
    proc = _merge_within(traces, out, limit)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    advice = re.search(r"; (--detail none --steps \S+) \(about [^)]*\) would fit$", line)
    assert advice, line
    fitted = _merge_within(traces, out, limit, *advice.group(1).split())
    assert fitted.returncode == 0, fitted.stderr
    assert out.stat().st_size <= limit


def test_torchrun_workers_all_stop_above_max_output(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged.pftrace"
    proc = torchrun_merge([str(traces), "-o", str(out), "--no-progress", "--max-output", "1000"])
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if line.startswith("commtag merge: error:")]
    assert len(said) == 1 and "above --max-output 1.00 kB" in said[0], proc.stderr[-2000:]
    assert not list(tmp_path.iterdir())

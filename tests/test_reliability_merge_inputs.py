"""Bad merge inputs: one clear line naming the file and the problem, exit code 2, nothing written.

Every case starts from the real traces and sidecars of a 4-rank gloo run
(conftest's shared ``gloo_run``: commtag installed, torch.profiler on), damages one thing the way it happens
to users (a copy cut short, a file from another run, a hand edit), and runs
``commtag merge`` as a user would. A trace whose sidecar is missing merges
with a notice; ``--skip-bad-ranks`` merges what is left and says what it
skipped and why.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
import struct
from pathlib import Path
from typing import Callable

import orjson
import pytest

from commtag.constants import SCHEMA_VERSION
from commtag.cli import main
from commtag.merge.pftrace.validate import validate_file
from gloo_world import PROFILED_GROUPS_WORLD
from pftrace_reader import read

pytestmark = pytest.mark.slow

WORLD = PROFILED_GROUPS_WORLD
#: The rank most cases damage, and every rank but it.
DAMAGED = 2
OTHERS = [r for r in range(WORLD) if r != DAMAGED]
OUT = "merged.pftrace"


@pytest.fixture(scope="module")
def run_dir(gloo_run: Path) -> Path:
    out = gloo_run
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"rank{r}.step0.pt.trace.json.gz" for r in range(WORLD)] + [f"rank{r}.step0.commtag.json" for r in range(WORLD)]
    )
    return out


@pytest.fixture
def traces(run_dir: Path, tmp_path: Path) -> Path:
    """A fresh copy of the run's files for one case to damage."""
    return Path(shutil.copytree(run_dir, tmp_path / "traces"))


def _trace(d: Path, rank: int) -> Path:
    return d / f"rank{rank}.step0.pt.trace.json.gz"


def _sidecar(d: Path, rank: int) -> Path:
    return d / f"rank{rank}.step0.commtag.json"


def _edit_trace(path: Path, edit: Callable[[dict], object]) -> None:
    data = orjson.loads(gzip.decompress(path.read_bytes()))
    edit(data)
    path.write_bytes(gzip.compress(orjson.dumps(data)))


def _edit_sidecar(path: Path, edit: Callable[[dict], object]) -> None:
    data = orjson.loads(path.read_bytes())
    edit(data)
    path.write_bytes(orjson.dumps(data))


def _first(events: list, ph: str = "X", prefix: str = "c10d::") -> dict:
    return next(e for e in events if e.get("ph") == ph and str(e.get("name", "")).startswith(prefix))


def _merge(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str], str]:
    code = main(["merge", "--no-progress", *args])
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line], captured.out


# ---------------------------------------------------------------------------
# The matrix: (damage, the file the error must name, words of the problem).


def _empty(d: Path) -> tuple[Path, str]:
    for p in list(d.iterdir()):
        p.unlink()
    return d, "no PyTorch profiler trace"


def _sidecar_without_trace(d: Path) -> tuple[Path, str]:
    _trace(d, 1).unlink()
    return _sidecar(d, 1), "trace_file 'rank1.step0.pt.trace.json.gz' is not among the input traces"


def _truncated_gzip(d: Path) -> tuple[Path, str]:
    raw = _trace(d, 2).read_bytes()
    _trace(d, 2).write_bytes(raw[: len(raw) // 2])
    return _trace(d, 2), "truncated"


def _truncated_big_gzip(d: Path) -> tuple[Path, str]:
    # Larger than discovery's head read: the cut is only seen when the whole file is read.
    def pad(t: dict) -> None:
        t["traceEvents"] += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": i, "args": {"name": os.urandom(16).hex()}}
                             for i in range(20_000)]
    _edit_trace(_trace(d, 2), pad)
    raw = _trace(d, 2).read_bytes()
    assert len(raw) > 200_000
    # The cut leaves deflate data where the trailer was: fix its last 4 bytes so the case does not
    # depend on the random padding (a plausible size here; an impossible one below).
    _trace(d, 2).write_bytes(raw[: len(raw) - 1000 - 4] + struct.pack("<I", 3 * len(raw)))
    return _trace(d, 2), "truncated or corrupt gzip"


def _truncated_gzip_impossible_trailer(d: Path) -> tuple[Path, str]:
    # A cut file whose last 4 bytes read as 4 GiB of JSON, more than its size can inflate to: said
    # as the cut it is, not as an output too big for --max-output.
    _truncated_big_gzip(d)
    raw = _trace(d, 2).read_bytes()
    _trace(d, 2).write_bytes(raw[:-4] + b"\xff\xff\xff\xff")
    return _trace(d, 2), "truncated or corrupt gzip"


def _invalid_json_trace(d: Path) -> tuple[Path, str]:
    text = gzip.decompress(_trace(d, 1).read_bytes())
    _trace(d, 1).write_bytes(gzip.compress(text[: len(text) * 2 // 3]))
    return _trace(d, 1), "not valid JSON"


def _invalid_json_sidecar(d: Path) -> tuple[Path, str]:
    raw = _sidecar(d, 0).read_bytes()
    _sidecar(d, 0).write_bytes(raw[: len(raw) // 2])
    return _sidecar(d, 0), "invalid sidecar"


def _not_a_trace(d: Path) -> tuple[Path, str]:
    _trace(d, 1).write_bytes(gzip.compress(b"\x00garbage, not JSON"))
    return _trace(d, 1), "neither"


def _trace_wrong_shape(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 1), lambda t: t.update(traceEvents={"ph": "X"}))
    return _trace(d, 1), "no traceEvents list"


def _event_wrong_shape(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 2), lambda t: t["traceEvents"].insert(5, ["ph", "X"]))
    return _trace(d, 2), "traceEvents[5] is not an object"


def _args_wrong_shape(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 0), lambda t: _first(t["traceEvents"]).update(args=[1, 2]))
    return _trace(d, 0), "args is not an object"


def _sidecar_wrong_shape(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 1), lambda s: s.update(collectives={"Seq": 1}))
    return _sidecar(d, 1), "invalid sidecar: collectives"


def _same_rank_twice(d: Path) -> tuple[Path, str]:
    copy = d / "rank1.step0.copy.pt.trace.json.gz"
    shutil.copy(_trace(d, 1), copy)
    return _trace(d, 1), f"claims rank 1 like {copy}, and their times overlap"


def _two_sidecars_one_trace(d: Path) -> tuple[Path, str]:
    shutil.copy(_sidecar(d, 1), d / "rank1.step0.zcopy.commtag.json")
    return d / "rank1.step0.zcopy.commtag.json", "annotates the same trace"


def _other_run_id(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 2), lambda s: s.update(run_id="another-run"))
    return _sidecar(d, 2), "run id 'another-run' differs"


def _other_world_size(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 1), lambda t: t["distributedInfo"].update(world_size=8))
    return _trace(d, 1), f"world size 8 differs from {WORLD}"


def _absurd_world_size(d: Path) -> tuple[Path, str]:
    # Every rank up to the claim that has no file would be listed as absent: 2**62 of them. All
    # traces agree on it and no sidecar says otherwise, as in a public trace of another project.
    for rank in range(WORLD):
        _sidecar(d, rank).unlink()
        _edit_trace(_trace(d, rank), lambda t: t["distributedInfo"].update(world_size=2**62))
    return _trace(d, 0), f"distributedInfo.world_size {2**62} is more ranks than a merged trace can hold"


def _absurd_sidecar_world_size(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 1), lambda s: s.update(world_size=2**62))
    return _sidecar(d, 1), f"world_size {2**62} is more ranks than a merged trace can hold"


def _newer_schema(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 0), lambda s: s.update(schema_version=99))
    return _sidecar(d, 0), "schema version 99 is newer than this commtag supports"


def _nan_duration(d: Path) -> tuple[Path, str]:
    # What Python's json module writes for float('nan'): not JSON, and said so.
    text = gzip.decompress(_trace(d, 1).read_bytes())
    text = text.replace(b'"dur":', b'"dur":NaN,"was":', 1)
    _trace(d, 1).write_bytes(gzip.compress(text))
    return _trace(d, 1), "not valid JSON"


def _nan_in_sidecar(d: Path) -> tuple[Path, str]:
    raw = re.sub(rb'"start_ns":\d+', b'"start_ns":NaN', _sidecar(d, 1).read_bytes(), count=1)
    _sidecar(d, 1).write_bytes(raw)
    return _sidecar(d, 1), "invalid sidecar: collectives.0.start_ns: Input should be a finite number"


def _negative_ts(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 2), lambda t: _first(t["traceEvents"]).update(ts=-12.5))
    return _trace(d, 2), "ts -12.5 is not a finite non-negative number"


def _string_ts(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 2), lambda t: _first(t["traceEvents"]).update(ts="NaN"))
    return _trace(d, 2), "ts 'NaN' is not a finite non-negative number"


def _absurd_ts(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 0), lambda t: _first(t["traceEvents"]).update(ts=1e30))
    return _trace(d, 0), "outside int64 nanoseconds"


def _negative_dur(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 1), lambda t: _first(t["traceEvents"], prefix="gloo:").update(dur=-3))
    return _trace(d, 1), "dur -3 is not a duration"


def _absurd_dur(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 1), lambda t: _first(t["traceEvents"]).update(dur=1e15))
    return _trace(d, 1), "is not a duration in [0, 1 day]"


def _negative_sidecar_time(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 2), lambda s: s["collectives"][0].update(start_ns=-1))
    return _sidecar(d, 2), "collectives.0.start_ns"


def _absurd_sidecar_time(d: Path) -> tuple[Path, str]:
    raw = re.sub(rb'"end_ns":\d+', b'"end_ns":%d' % 2**70, _sidecar(d, 2).read_bytes(), count=1)
    _sidecar(d, 2).write_bytes(raw)
    return _sidecar(d, 2), "collectives.0.end_ns: Input should be less than 9223372036854775808"


def _sidecar_end_before_start(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 2), lambda s: s["collectives"][0].update(end_ns=s["collectives"][0]["start_ns"] - 1))
    return _sidecar(d, 2), "before start_ns"


def _event_without_ts(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 0), lambda t: _first(t["traceEvents"], prefix="gloo:").pop("ts"))
    return _trace(d, 0), "missing 'ts'"


def _event_without_pid(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 0), lambda t: _first(t["traceEvents"]).pop("pid"))
    return _trace(d, 0), "missing 'pid'"


def _pid_wrong_type(d: Path) -> tuple[Path, str]:
    _edit_trace(_trace(d, 2), lambda t: _first(t["traceEvents"]).update(pid=[7]))
    return _trace(d, 2), "pid [7] is not a number or name"


def _annotation_without_seq(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 1), lambda s: s["collectives"][1]["annotation"].pop("Seq"))
    return _sidecar(d, 1), "collectives.1.annotation.Seq: Field required"


def _sidecar_of_another_rank(d: Path) -> tuple[Path, str]:
    # The sidecar names rank 2's trace but says rank 0 (a hand-made mix-up).
    def swap(s: dict) -> None:
        s["trace_file"] = "rank2.step0.pt.trace.json.gz"
    _sidecar(d, 2).unlink()
    _edit_sidecar(_sidecar(d, 0), swap)
    return _sidecar(d, 0), "sidecar is for rank 0 but its trace is rank 2"


CASES = [
    _empty, _sidecar_without_trace, _truncated_gzip, _truncated_big_gzip, _truncated_gzip_impossible_trailer,
    _invalid_json_trace,
    _invalid_json_sidecar, _not_a_trace, _trace_wrong_shape, _event_wrong_shape, _args_wrong_shape,
    _sidecar_wrong_shape, _same_rank_twice, _two_sidecars_one_trace, _other_run_id, _other_world_size,
    _absurd_world_size, _absurd_sidecar_world_size,
    _newer_schema, _nan_duration, _nan_in_sidecar, _negative_ts, _string_ts, _absurd_ts, _negative_dur,
    _absurd_dur, _negative_sidecar_time, _absurd_sidecar_time, _sidecar_end_before_start, _event_without_ts,
    _event_without_pid, _pid_wrong_type, _annotation_without_seq, _sidecar_of_another_rank,
]


@pytest.mark.parametrize("damage", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_bad_input_one_line_naming_file_exit_2_nothing_written(damage, traces: Path, tmp_path: Path, capsys):
    named, problem = damage(traces)
    before = {p.name: p.read_bytes() for p in traces.iterdir()}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, err, out = _merge(capsys, str(traces), "-o", str(out_dir / OUT))
    assert code == 2, (err, out)
    assert len(err) == 1, err
    assert err[0].startswith(f"commtag merge: error: {named}: "), err
    assert problem in err[0], err
    assert out == ""
    assert list(out_dir.iterdir()) == []  # no output, no temporary left behind
    assert {p.name: p.read_bytes() for p in traces.iterdir()} == before  # inputs untouched


def test_trace_without_sidecar_merges_with_a_notice(traces: Path, capsys):
    _sidecar(traces, 2).unlink()
    code, err, out = _merge(capsys, str(traces))
    assert code == 0, err
    notices = [line for line in err if not line.startswith("commtag merge: rank ")]  # not the per-rank accounts
    assert notices == [f"commtag merge: notice: {_trace(traces, 2)}: no commtag sidecar; merged from the trace alone"]
    assert len(err) == len(notices) + WORLD
    merged = traces / OUT
    assert out.startswith(f"{merged}: {WORLD} ranks") and validate_file(merged) == []
    parsed = read(merged)
    procs = sorted(d.process.process_name.split(" · ")[0] for d in parsed.processes())
    assert procs == [f"rank {r}" for r in range(WORLD)]
    # Rank 2 keeps its own events (gloo work included); only commtag's lane slices need the sidecar.
    gloo = {parsed.name_path(s.track)[0].split(" · ")[0] for s in parsed.slices if s.name.startswith("gloo:")}
    assert gloo == {f"rank {r}" for r in range(WORLD)}
    lanes = {s.args["commtag rank"] for s in parsed.slices if "commtag rank" in s.args}
    assert lanes == set(OTHERS)


def test_an_event_at_torchs_unset_time_is_left_out_counted_and_listed(traces: Path, capsys):
    """torch's profiler can write an event still running as the profile ended at the largest int64 ns
    (a gloo work's ``gloo:all_reduce`` at a window's end, seen on torch 2.13 under load): its ts plus the
    trace's base reads INT64_MAX. Not bad input: that event is left out, counted and, with --verbose,
    listed; the rest of the rank is merged."""
    unset_ns = (1 << 63) - 1

    def stuck(t: dict) -> None:
        base = t.get("baseTimeNanoseconds", 0)
        _first(t["traceEvents"], prefix="gloo:").update(ts=(unset_ns - base) / 1000)

    _edit_trace(_trace(traces, 1), stuck)
    code, err, out = _merge(capsys, str(traces), "--verbose")
    assert code == 0, err
    reason = "user_annotation events at torch's unset time (still running or not begun as the profile ended)"
    account = next(line for line in err if line.startswith("commtag merge: rank 1:"))
    assert f"1 {reason}" in account, account
    listed = [line for line in err if "unset time" in line and "traceEvents[" in line]
    assert len(listed) == 1 and str(_trace(traces, 1)) in listed[0] and "'gloo:" in listed[0], listed
    assert validate_file(traces / OUT) == []


def _skip_case_truncated(d: Path) -> list[tuple[Path, str]]:
    raw = _trace(d, 2).read_bytes()
    _trace(d, 2).write_bytes(raw[: len(raw) // 2])
    return [(_trace(d, 2), "truncated gzip"), (_sidecar(d, 2), "is not among the input traces")]


def _skip_case_other_run(d: Path) -> list[tuple[Path, str]]:
    _edit_sidecar(_sidecar(d, 2), lambda s: s.update(run_id="another-run"))
    return [(_sidecar(d, 2), "ranks from different runs")]


def _skip_case_bad_event(d: Path) -> list[tuple[Path, str]]:
    _edit_trace(_trace(d, 2), lambda t: _first(t["traceEvents"]).update(ts=-1))
    return [(_trace(d, 2), "rank 2 skipped: traceEvents"), (_sidecar(d, 2), "its trace 'rank2.step0.pt.trace.json.gz' was skipped")]


@pytest.mark.parametrize("damage", [_skip_case_truncated, _skip_case_other_run, _skip_case_bad_event])
def test_skip_bad_ranks_merges_the_rest_and_says_why(damage, traces: Path, capsys):
    expected = damage(traces)
    strict_code, _, _ = _merge(capsys, str(traces))
    assert strict_code == 2 and not (traces / OUT).exists()

    code, err, out = _merge(capsys, str(traces), "--skip-bad-ranks")
    assert code == 0, err
    skipped = [line for line in err if line.startswith("commtag merge: skipped: ")]
    assert len(skipped) == len(expected), err
    for line, (path, why) in zip(skipped, expected):
        assert line.startswith(f"commtag merge: skipped: {path}: ") and why in line, line
    merged = traces / OUT
    assert out.startswith(f"{merged}: {WORLD - 1} ranks") and validate_file(merged) == []
    parsed = read(merged)
    procs = sorted(d.process.process_name.split(" · ")[0] for d in parsed.processes())
    assert procs == [f"rank {r}" for r in OTHERS]
    # The ranks left still meet on their groups, linked by flows.
    lanes = [s for s in parsed.slices if "commtag rank" in s.args]
    assert {s.args["commtag rank"] for s in lanes} == set(OTHERS)
    assert {f for s in lanes for f in s.flows_out} & {f for s in lanes for f in s.flows_in}


@pytest.mark.parametrize("align", ["none", "collectives"])
def test_skip_bad_ranks_merges_a_trace_whose_sidecar_fails_alone(align: str, traces: Path, capsys):
    # Discovery reads only a sidecar's head (run, rank, trace): this one fails later, in full.
    _edit_sidecar(_sidecar(traces, 2), lambda s: s["collectives"][0].update(start_ns=-1))
    code, err, _ = _merge(capsys, str(traces), "--align", align)
    assert code == 2 and not (traces / OUT).exists()
    assert err == [f"commtag merge: error: {_sidecar(traces, 2)}: invalid sidecar: collectives.0.start_ns: "
                   "Input should be greater than or equal to 0"]

    code, err, out = _merge(capsys, str(traces), "--align", align, "--skip-bad-ranks")
    assert code == 0, err
    skipped = [line for line in err if line.startswith("commtag merge: skipped: ")]
    assert skipped == [f"commtag merge: skipped: {_sidecar(traces, 2)}: invalid sidecar: collectives.0.start_ns: "
                       "Input should be greater than or equal to 0"]  # once, though --align reads it twice
    assert out.startswith(f"{traces / OUT}: {WORLD} ranks")
    parsed = read(traces / OUT)
    assert sorted(d.process.process_name.split(" · ")[0] for d in parsed.processes()) == [f"rank {r}" for r in range(WORLD)]
    # rank 2's trace is there, without the annotations only its sidecar had
    assert {s.args["commtag rank"] for s in parsed.slices if "commtag rank" in s.args} == set(OTHERS)


def test_a_rank_skipped_at_its_last_event_leaves_the_next_ranks_intact(traces: Path, capsys):
    # The ranks a worker merges share one packet sequence: the names rank 0 interned before
    # failing must not be lost to, or misread by, the ranks after it.
    def own_slices(merged: Path) -> list[tuple]:
        parsed = read(merged)  # strict: a dangling interned id raises
        rows = []
        for s in parsed.slices:
            path = parsed.name_path(s.track)
            if path[0].split(" · ")[0] in [f"rank {r}" for r in range(1, WORLD)] and path[1] != "commtag markers":
                rows.append((tuple(path), s.ts, s.end, s.name, sorted(s.args.items(), key=str), s.depth))
        return rows

    code, err, _ = _merge(capsys, str(traces))
    assert code == 0, err
    whole = own_slices(traces / OUT)
    (traces / OUT).unlink()
    _edit_trace(_trace(traces, 0), lambda t: [e for e in t["traceEvents"] if e.get("ph") == "X"][-1].update(ts=-1))
    code, err, out = _merge(capsys, str(traces), "--skip-bad-ranks")
    assert code == 0, err
    assert out.startswith(f"{traces / OUT}: {WORLD - 1} ranks") and validate_file(traces / OUT) == []
    rest = own_slices(traces / OUT)
    assert len(rest) >= 20 and rest == whole


def test_skip_bad_ranks_with_nothing_left_is_still_an_error(traces: Path, capsys):
    for rank in range(WORLD):
        _edit_trace(_trace(traces, rank), lambda t: t.update(traceEvents=None))
    code, err, _ = _merge(capsys, str(traces), "--skip-bad-ranks")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"commtag merge: error: {traces}: no rank left to merge (skipped "), err
    for rank in range(WORLD):  # the one line still says what was skipped and why
        assert f"{_trace(traces, rank)}: rank {rank} skipped: not a profiler trace" in err[0]
    assert not (traces / OUT).exists()


#: An existing folder in which nobody may create a file, root included (Linux sysfs).
SYSFS_NO_NEW_FILES = Path("/sys/kernel")


@pytest.mark.parametrize("where", ["missing-dir", "through-a-file", "read-only-dir"])
def test_unwritable_output_directory(where: str, traces: Path, tmp_path: Path, capsys):
    if where == "missing-dir":
        out = tmp_path / "no" / "such" / OUT
    elif where == "through-a-file":
        (tmp_path / "a-file").write_text("x")
        out = tmp_path / "a-file" / OUT
    elif os.geteuid() == 0:  # root writes into a mode-555 folder: sysfs takes no new file, root's included
        out = SYSFS_NO_NEW_FILES / OUT
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out = ro / OUT
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, err, _ = _merge(capsys, str(traces), "-o", str(out))
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"commtag merge: error: {out}: cannot write the output"), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_exit_code_and_message_from_the_real_command(traces: Path):
    """The same contract through ``python -m commtag.merge``, as scripts and CI call it."""
    _edit_sidecar(_sidecar(traces, 1), lambda s: s.update(schema_version=7))
    proc = subprocess.run([sys.executable, "-m", "commtag.merge", str(traces)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"commtag merge: error: {_sidecar(traces, 1)}: invalid sidecar: schema_version: Value error, sidecar "
        f"schema version 7 is newer than this commtag supports ({SCHEMA_VERSION}); upgrade commtag"
    ]
    assert not (traces / OUT).exists()

"""Which files the merge reads, which rank each is, and which run they come from.

The inputs are the real traces and sidecars of two 3-rank gloo runs (commtag
installed, torch.profiler on), laid out or altered the way users meet them:
ranks in subfolders, one trace given by path, a trace that names no rank, a
file of another run among the rest, a clock shifted by centuries. Public
traces written by other projects are read from tests/data/public. Every refusal is
checked as a user sees it: exit code 2, one line naming the file, no output.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Callable

import orjson
import pytest

from commtag.cli import main
from commtag.constants import TRACE_SUFFIX, sidecar_name_for
from commtag.merge.pftrace.validate import validate_file
from commtag.testing import PUBLIC_TRACES as PUBLIC
from gloo_world import profiled_pair_job, run_world
from pftrace_reader import read

WORLD = 3
OUT = "merged.pftrace"
NAMELESS = PUBLIC / "edge-cases" / "hta_no_distributed_info.json.gz"


def _profiled_steps(rank: int, world_size: int, out_dir: str) -> None:
    """Two profiled steps, each its own trace and sidecar per rank (rank<R>.step1, rank<R>.step2)."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    commtag.install()
    pair = dist.new_group([0, 1])
    t = torch.ones(16)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=1, repeat=2),
                 on_trace_ready=commtag.trace_handler(out_dir)) as prof:
        for _ in range(2):
            dist.all_reduce(t)
            if rank < 2:
                dist.all_reduce(t, group=pair)
            dist.barrier()
            prof.step()
    commtag.uninstall()


def _run(tmp_path_factory: pytest.TempPathFactory, name: str, body: Callable = profiled_pair_job) -> Path:
    out = tmp_path_factory.mktemp(name)
    run_world(body, WORLD, str(out))
    return out


@pytest.fixture(scope="module")
def run_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory, "run_a")


@pytest.fixture(scope="module")
def steps_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(tmp_path_factory, "steps_a", _profiled_steps)


@pytest.fixture(scope="module")
def steps_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another run of the same program: the same file names, another run id and time."""
    return _run(tmp_path_factory, "steps_b", _profiled_steps)


@pytest.fixture
def steps(steps_a: Path, tmp_path: Path) -> Path:
    """A fresh copy of the two-step run's files."""
    return Path(shutil.copytree(steps_a, tmp_path / "steps"))


@pytest.fixture
def traces(run_a: Path, tmp_path: Path) -> Path:
    """A fresh copy of run A's files for one case to alter."""
    return Path(shutil.copytree(run_a, tmp_path / "traces"))


def _trace(d: Path, rank: int) -> Path:
    return d / f"rank{rank}.step0.pt.trace.json.gz"


def _sidecar(d: Path, rank: int) -> Path:
    return d / f"rank{rank}.step0.commtag.json"


def _second_step(d: Path, rank: int) -> tuple[Path, Path]:
    """The trace and sidecar of a rank's second profiled step, whatever the step is named."""
    first, second = sorted(d.glob(f"rank{rank}.step*{TRACE_SUFFIX}"))
    return second, second.with_name(sidecar_name_for(second.name))


def _edit_trace(path: Path, edit: Callable[[dict], object]) -> None:
    data = orjson.loads(gzip.decompress(path.read_bytes()))
    edit(data)
    path.write_bytes(gzip.compress(json.dumps(data).encode()))  # json: orjson cannot write ints above 64 bits


def _edit_sidecar(path: Path, edit: Callable[[dict], object]) -> None:
    data = orjson.loads(path.read_bytes())
    edit(data)
    path.write_bytes(orjson.dumps(data))


def _merge(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str], str]:
    """Exit code, stderr lines other than the per-rank event accounts (what discovery said), stdout."""
    code = main(["merge", "--no-progress", *args])
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() if line and not _ACCOUNT.match(line)]
    return code, said, captured.out


_ACCOUNT = re.compile(r"commtag merge: rank \d+: \d+ events read, \d+ written")


def _refused(capsys: pytest.CaptureFixture, out: Path, *args: str) -> str:
    """Run a merge that must be refused; return its one error line (after the prefix)."""
    code, err, stdout = _merge(capsys, *args, "-o", str(out))
    assert code == 2, (err, stdout)
    assert len(err) == 1 and err[0].startswith("commtag merge: error: "), err
    assert stdout == "" and not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]  # no temporary left
    return err[0][len("commtag merge: error: "):]


def _ranks_and_lanes(merged: Path) -> tuple[list[str], set[int]]:
    """The merged processes, and the ranks whose commtag lane slices (from sidecars) are there."""
    assert validate_file(merged) == []
    parsed = read(merged)
    procs = sorted(d.process.process_name.split(" · ")[0] for d in parsed.processes())
    return procs, {s.args["commtag rank"] for s in parsed.slices if "commtag rank" in s.args}


# ---------------------------------------------------------------------------
# --rank-pattern errors, the rule a failed match cites, --rank N.


@pytest.mark.parametrize("pattern, problem", [
    ("(", "--rank-pattern: '(' is not a valid regular expression (missing ), unterminated subpattern at position 0)"),
    ("rank", "--rank-pattern: 'rank' has no capture group for the rank"),
    ("()", f"{NAMELESS}: --rank-pattern '()' takes '' from the file name, which is not a rank number"),
    (r"hta_(\w+)", f"{NAMELESS}: --rank-pattern 'hta_(\\w+)' takes 'no_distributed_info' from the file name, "
                   "which is not a rank number"),
])
def test_a_bad_rank_pattern_is_one_line_not_a_traceback(pattern: str, problem: str, tmp_path: Path, capsys):
    assert _refused(capsys, tmp_path / OUT, str(NAMELESS), "--rank-pattern", pattern) == problem


def test_a_rank_pattern_that_does_not_match_cites_itself(tmp_path: Path, capsys):
    line = _refused(capsys, tmp_path / OUT, str(NAMELESS), "--rank-pattern", r"job-(\d+)")
    assert line == (f"{NAMELESS}: cannot tell the rank: no distributedInfo.rank in the trace, no sidecar, and the "
                    r"file name does not match --rank-pattern 'job-(\d+)'; a single trace takes --rank N")
    line = _refused(capsys, tmp_path / OUT, str(NAMELESS))
    assert "does not match rank<N>/rank-<N>/rank_<N>/worker<N>" in line and line.endswith("takes --rank N")


@pytest.mark.slow
def test_rank_option_merges_a_single_trace_that_names_no_rank(traces: Path, tmp_path: Path, capsys):
    # A real trace that says no rank: distributedInfo gone, no sidecar, a plain name.
    plain = tmp_path / "trace.json.gz"
    shutil.copy(_trace(traces, 1), plain)
    _edit_trace(plain, lambda t: t.pop("distributedInfo"))
    out = tmp_path / OUT
    assert "cannot tell the rank" in _refused(capsys, out, str(plain))

    code, err, stdout = _merge(capsys, str(plain), "--rank", "2", "-o", str(out))
    assert code == 0, err
    assert stdout.startswith(f"{out}: 1 ranks")
    assert _ranks_and_lanes(out) == (["rank 2"], set())

    out.unlink()
    public = tmp_path / OUT.replace(".", "-public.")
    code, err, _ = _merge(capsys, str(NAMELESS), "--rank", "5", "-o", str(public))
    assert code == 0, err
    assert _ranks_and_lanes(public)[0] == ["rank 5"]


@pytest.mark.slow
def test_rank_option_is_refused_where_it_cannot_apply(traces: Path, tmp_path: Path, capsys):
    out = tmp_path / OUT
    assert _refused(capsys, out, str(traces), "--rank", "1") == \
        "--rank: gives the rank of a single trace, but 3 traces were found"
    assert _refused(capsys, out, str(_trace(traces, 1)), "--rank", "2") == \
        f"{_trace(traces, 1)}: --rank 2 contradicts rank 1 that the trace names"
    assert _refused(capsys, out, str(NAMELESS), "--rank", "-1") == "--rank: -1 is not a rank (0 to 16777215)"


def _summary_ranks(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[int], str]:
    """Exit code, the ranks `commtag summary --format json` reports, and its stderr."""
    code = main(["summary", "--format", "json", *args])
    captured = capsys.readouterr()
    return code, orjson.loads(captured.out)["ranks"] if code == 0 else [], captured.err


def test_summary_takes_the_rank_options_its_error_cites(tmp_path: Path, capsys):
    # The error summary prints for a trace naming no rank cites --rank-pattern and --rank: a
    # user who follows it must not get "unrecognized arguments" back.
    code, _, err = _summary_ranks(capsys, str(NAMELESS))
    assert code == 2 and "--rank-pattern REGEX" in err and "takes --rank N" in err
    assert _summary_ranks(capsys, str(NAMELESS), "--rank", "5") == (0, [5], "")
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(NAMELESS, folder / "node7.json.gz")
    assert _summary_ranks(capsys, str(folder), "--rank-pattern", r"node(\d+)") == (0, [7], "")
    code, _, err = _summary_ranks(capsys, str(folder), "--rank-pattern", "(")
    assert code == 2 and err.startswith("commtag summary: error: --rank-pattern: '(' is not a valid regular expression")


# ---------------------------------------------------------------------------
# Ranks in subfolders; a trace given by path takes the sidecar beside it.


def _into_subfolders(traces: Path, job: Path, sidecars: bool) -> None:
    """Each rank's files in a folder of its own, under one name: r<R>/trace.json.gz, r<R>/commtag.json."""
    for rank in range(WORLD):
        folder = job / f"r{rank}"
        folder.mkdir(parents=True)
        shutil.copy(_trace(traces, rank), folder / "trace.json.gz")
        if sidecars:
            shutil.copy(_sidecar(traces, rank), folder / "commtag.json")
            _edit_sidecar(folder / "commtag.json", lambda s: s.update(trace_file="trace.json.gz"))


@pytest.mark.slow
@pytest.mark.parametrize("sidecars", [False, True], ids=["traces-only", "with-sidecars"])
def test_ranks_in_subfolders_merge_from_their_parent(sidecars: bool, traces: Path, tmp_path: Path, capsys):
    top = tmp_path / "runs"
    _into_subfolders(traces, top / "job", sidecars)
    out = tmp_path / OUT
    code, err, stdout = _merge(capsys, str(top), "-o", str(out))
    assert code == 0, err
    assert stdout.startswith(f"{out}: 3 ranks")
    # Each sidecar annotated the trace in its own folder: every rank has its lanes.
    assert _ranks_and_lanes(out) == (["rank 0", "rank 1", "rank 2"], {0, 1, 2} if sidecars else set())
    notices = [line for line in err if "no commtag sidecar" in line]
    assert len(notices) == (0 if sidecars else WORLD), err
    # The same, each folder given: three files of one name are three traces.
    out.unlink()
    code, err, stdout = _merge(capsys, *(str(top / "job" / f"r{r}") for r in range(WORLD)), "-o", str(out))
    assert code == 0, err
    assert _ranks_and_lanes(out) == (["rank 0", "rank 1", "rank 2"], {0, 1, 2} if sidecars else set())


@pytest.mark.slow
def test_the_json_output_inside_an_input_folder_is_not_an_input(traces: Path, capsys):
    # A visible folder below the input would be read by the next merge (or summary) without --json:
    # refused. A hidden one is never searched.
    code, err, _ = _merge(capsys, str(traces), "--json", str(traces / "annotated"))
    assert code == 2 and len(err) == 1 and "--json's folder lies where the merge reads its inputs" in err[0], err
    assert not (traces / "annotated").exists()
    for _ in range(2):  # the second merge finds the first one's --json files below its input, and leaves them
        code, err, stdout = _merge(capsys, str(traces), "--json", str(traces / ".annotated"))
        assert code == 0, err
        assert stdout.startswith(f"{traces / OUT}: 3 ranks")
    assert sorted(p.name for p in (traces / ".annotated").iterdir()) == sorted(_trace(traces, r).name
                                                                               for r in range(WORLD))


@pytest.mark.slow
def test_a_sidecar_pairs_with_the_trace_in_its_own_folder(traces: Path, tmp_path: Path, capsys):
    job = tmp_path / "job"
    _into_subfolders(traces, job, sidecars=True)
    (job / "r2" / "commtag.json").unlink()  # rank 2 has none; r0's and r1's must not be taken for it
    code, err, _ = _merge(capsys, str(job), "-o", str(tmp_path / OUT))
    assert code == 0, err
    assert err == [f"commtag merge: notice: {job / 'r2' / 'trace.json.gz'}: no commtag sidecar; merged from the "
                   "trace alone"]
    assert _ranks_and_lanes(tmp_path / OUT)[1] == {0, 1}


def _others_absent(merged: int) -> str:
    """The merge's notice when one rank's trace is merged alone: the others have none."""
    from commtag.merge.records import Coverage

    alone = Coverage({merged: []}, WORLD).describe_absent()
    return f"commtag merge: notice: {alone}"


@pytest.mark.slow
def test_one_trace_given_by_path_takes_the_sidecar_beside_it(traces: Path, tmp_path: Path, capsys):
    out = tmp_path / OUT
    code, err, stdout = _merge(capsys, str(_trace(traces, 1)), "-o", str(out))
    assert code == 0 and err == [_others_absent(1)], err
    assert stdout.startswith(f"{out}: 1 ranks, 7 collective slices")
    assert _ranks_and_lanes(out) == (["rank 1"], {1})
    # The other sidecars beside it (of ranks 0 and 2) are not its own and are left alone.
    code, err, _ = _merge(capsys, str(_trace(traces, 2)), "-o", str(out))
    assert code == 0 and err == [_others_absent(2)], err
    assert _ranks_and_lanes(out) == (["rank 2"], {2})


@pytest.mark.slow
def test_a_broken_sidecar_beside_the_trace_given_is_an_error(traces: Path, tmp_path: Path, capsys):
    _sidecar(traces, 1).write_bytes(_sidecar(traces, 1).read_bytes()[:100])
    line = _refused(capsys, tmp_path / OUT, str(_trace(traces, 1)))
    assert line.startswith(f"{_sidecar(traces, 1)}: invalid sidecar"), line
    # A broken sidecar of another rank beside it is not this trace's business.
    shutil.copy(_sidecar(traces, 1), _sidecar(traces, 0))
    _sidecar(traces, 1).unlink()
    code, err, _ = _merge(capsys, str(_trace(traces, 2)), "-o", str(tmp_path / OUT))
    assert code == 0 and err == [_others_absent(2)], err


# ---------------------------------------------------------------------------
# Absurd clocks are bad input.

CENTURIES_NS = 5_500_000_000 * 10**9  # would make a summary call a rank 5.5e9 s late


@pytest.mark.slow
@pytest.mark.parametrize("base", [2**63 + 5, 2**64 + 5, -5])
def test_a_base_time_outside_int64_is_bad_input(base: int, traces: Path, tmp_path: Path, capsys):
    _edit_trace(_trace(traces, 1), lambda t: t.update(baseTimeNanoseconds=base))
    line = _refused(capsys, tmp_path / OUT, str(traces))
    shown = base if base >= 0 else repr(str(base))
    assert line == f"{_trace(traces, 1)}: baseTimeNanoseconds {shown} is not a time in int64 nanoseconds"

    code, err, stdout = _merge(capsys, str(traces), "--skip-bad-ranks", "-o", str(tmp_path / OUT))
    assert code == 0, err
    assert [line for line in err if line.startswith("commtag merge: skipped: ")] == \
        [f"commtag merge: skipped: {_trace(traces, 1)}: baseTimeNanoseconds {shown} is not a time in int64 nanoseconds",
         f"commtag merge: skipped: {_sidecar(traces, 1)}: its trace {_trace(traces, 1).name!r} was skipped"]
    assert _ranks_and_lanes(tmp_path / OUT) == (["rank 0", "rank 2"], {0, 2})


@pytest.mark.slow
def test_a_clock_shifted_by_centuries_is_bad_input(traces: Path, tmp_path: Path, capsys):
    _edit_trace(_trace(traces, 2), lambda t: t.update(baseTimeNanoseconds=t["baseTimeNanoseconds"] + CENTURIES_NS))
    line = _refused(capsys, tmp_path / OUT, str(traces))
    assert line.startswith(f"{_trace(traces, 2)}: its clock is absurd: it ends at 22"), line
    assert line.endswith("days after this machine's clock (check its baseTimeNanoseconds and ts)"), line
    # The summary reads the same traces: the same line, not a rank 5.5e9 s late.
    assert main(["summary", str(traces)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"commtag summary: error: {line}\n"

    code, err, _ = _merge(capsys, str(traces), "--skip-bad-ranks", "-o", str(tmp_path / OUT))
    assert code == 0, err
    skipped = [line for line in err if line.startswith("commtag merge: skipped: ")]
    assert skipped == [f"commtag merge: skipped: {_trace(traces, 2)}: rank 2 skipped: {line.split(': ', 1)[1]}",
                       f"commtag merge: skipped: {_sidecar(traces, 2)}: its trace {_trace(traces, 2).name!r} was skipped"]
    assert _ranks_and_lanes(tmp_path / OUT) == (["rank 0", "rank 1"], {0, 1})


def test_a_public_trace_shifted_by_centuries_is_bad_input(tmp_path: Path, capsys):
    public = PUBLIC / "edge-cases" / "tracelens_vllm_hipgraph_replay.json.gz"
    shifted = tmp_path / "rank0.json.gz"
    shutil.copy(public, shifted)
    _edit_trace(shifted, lambda t: t.update(baseTimeNanoseconds=t["baseTimeNanoseconds"] + CENTURIES_NS))
    line = _refused(capsys, tmp_path / OUT, str(shifted))
    assert line.startswith(f"{shifted}: its clock is absurd: it ends at 22"), line
    code, err, _ = _merge(capsys, str(public), "-o", str(tmp_path / OUT))  # as written, it merges
    assert code == 0, err


# ---------------------------------------------------------------------------
# --skip-bad-ranks skips by file, blames the right file, keeps runs apart.


def _skipped(err: list[str]) -> list[str]:
    return [line[len("commtag merge: skipped: "):] for line in err if line.startswith("commtag merge: skipped: ")]


def _lane_slices(merged: Path, rank: int) -> list[tuple]:
    """The commtag lane slices of one rank: what its sidecars annotated, in order."""
    parsed = read(merged)
    return sorted((s.ts, s.name, s.args.get("Seq")) for s in parsed.slices if s.args.get("commtag rank") == rank)


@pytest.mark.slow
def test_one_bad_step_file_leaves_out_that_file_not_its_rank(steps: Path, tmp_path: Path, capsys):
    reference = Path(shutil.copytree(steps, tmp_path / "reference"))
    for path in _second_step(reference, 1):
        path.unlink()
    trace, sidecar = _second_step(steps, 1)
    code, err, _ = _merge(capsys, str(reference), "-o", str(tmp_path / "reference.pftrace"))
    assert code == 0, err

    def damage(t: dict) -> None:
        next(e for e in t["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("gloo:"))["ts"] = -1
    _edit_trace(trace, damage)
    line = _refused(capsys, tmp_path / OUT, str(steps))
    assert line.startswith(f"{trace}: traceEvents[") and "ts -1 is not a finite" in line, line

    code, err, stdout = _merge(capsys, str(steps), "--skip-bad-ranks", "-o", str(tmp_path / OUT))
    assert code == 0, err
    assert _skipped(err) == [f"{trace}: left out of rank 1: {line.split(': ', 1)[1]}",
                             f"{sidecar}: its trace {trace.name!r} was skipped"]
    assert stdout.startswith(f"{tmp_path / OUT}: 3 ranks")
    assert _ranks_and_lanes(tmp_path / OUT) == (["rank 0", "rank 1", "rank 2"], {0, 1, 2})
    # Rank 1 is exactly what its good step makes of it.
    ones = _lane_slices(tmp_path / OUT, 1)
    assert ones and ones == _lane_slices(tmp_path / "reference.pftrace", 1)


@pytest.mark.slow
def test_a_step_file_of_another_run_is_kept_apart(steps: Path, steps_b: Path, tmp_path: Path, capsys):
    # Rank 1's second trace is overwritten by the same file of a later run; its sidecar is this run's.
    trace, sidecar = _second_step(steps, 1)
    shutil.copy(steps_b / trace.name, trace)
    line = _refused(capsys, tmp_path / OUT, str(steps))
    assert line.startswith(f"{trace}: its sidecar {sidecar} records "), line
    assert line.endswith(": the two come from different runs"), line

    code, err, _ = _merge(capsys, str(steps), "--skip-bad-ranks", "-o", str(tmp_path / OUT))
    assert code == 0, err
    assert _skipped(err) == [f"{trace}: left out of rank 1: {line.split(': ', 1)[1]}",
                             f"{sidecar}: its trace {trace.name!r} was skipped"]
    assert _ranks_and_lanes(tmp_path / OUT) == (["rank 0", "rank 1", "rank 2"], {0, 1, 2})
    # Nothing of the other run is in the merge: rank 1's slices (absolute ns) all end before it began.
    later = orjson.loads(gzip.decompress((steps_b / trace.name).read_bytes()))
    later_start = later["baseTimeNanoseconds"] + round(
        min(e["ts"] for e in later["traceEvents"] if e.get("ph") == "X") * 1000)
    parsed = read(tmp_path / OUT)
    ones = [s for s in parsed.slices if parsed.name_path(s.track)[0].split(" · ")[0] == "rank 1"]
    assert ones and max(s.end for s in ones) < later_start


@pytest.mark.slow
def test_a_sidecar_naming_another_ranks_trace_is_the_one_blamed(traces: Path, tmp_path: Path, capsys):
    _edit_sidecar(_sidecar(traces, 0), lambda s: s.update(trace_file=_trace(traces, 2).name))
    assert _refused(capsys, tmp_path / OUT, str(traces)) == \
        f"{_sidecar(traces, 0)}: sidecar is for rank 0 but its trace is rank 2"

    code, err, stdout = _merge(capsys, str(traces), "--skip-bad-ranks", "-o", str(tmp_path / OUT))
    assert code == 0, err
    assert _skipped(err) == [f"{_sidecar(traces, 0)}: sidecar is for rank 0 but its trace is rank 2"]
    assert stdout.startswith(f"{tmp_path / OUT}: 3 ranks")
    # Rank 2 keeps its own sidecar; rank 0, whose sidecar was the bad file, merges from its trace alone.
    assert _ranks_and_lanes(tmp_path / OUT) == (["rank 0", "rank 1", "rank 2"], {1, 2})
    assert f"commtag merge: notice: {_trace(traces, 0)}: no commtag sidecar; merged from the trace alone" in err


def test_public_ranks_keep_their_good_step_when_another_is_bad(tmp_path: Path, capsys):
    dlrm = PUBLIC / "param-dlrm-8rank"
    for src in dlrm.iterdir():
        (tmp_path / src.name).symlink_to(src)
    # A second step of worker 1, after the first, with one event that has no time.
    first = next(dlrm.glob("worker1_step_12.*"))
    trace = orjson.loads(gzip.decompress(first.read_bytes()))
    span = max(e["ts"] + e.get("dur", 0) for e in trace["traceEvents"] if "ts" in e) - \
        min(e["ts"] for e in trace["traceEvents"] if "ts" in e)
    for e in trace["traceEvents"]:
        if "ts" in e:
            e["ts"] += span + 1000
    bad = next(e for e in trace["traceEvents"] if e.get("ph") == "X")
    bad.pop("ts")
    second = tmp_path / "worker1_step_13.1694128201999.pt.trace.json.gz"
    second.write_bytes(gzip.compress(orjson.dumps(trace)))
    out = tmp_path.parent / f"{tmp_path.name}.pftrace"
    code, err, stdout = _merge(capsys, str(tmp_path), "--skip-bad-ranks", "-o", str(out))
    assert code == 0, err
    skipped = _skipped(err)
    assert len(skipped) == 1 and skipped[0].startswith(f"{second}: left out of rank 1: traceEvents["), skipped
    assert "missing 'ts'" in skipped[0]
    assert stdout.startswith(f"{out}: 8 ranks")
    assert _ranks_and_lanes(out)[0] == [f"rank {r}" for r in range(8)]


# ---------------------------------------------------------------------------
# Files that may be of another run: a warning, and --strict refuses (exit 2).

DAY_NS = 86_400 * 10**9


def _warned(capsys: pytest.CaptureFixture, out: Path, inputs: Path, expected: list[tuple[Path, str]]) -> None:
    """The merge writes its output with one warning line per suspect file; --strict refuses the first."""
    code, err, stdout = _merge(capsys, str(inputs), "-o", str(out))
    assert code == 0, err
    warnings = [line for line in err if line.startswith("commtag merge: warning: ")]
    assert len(warnings) == len(expected), err
    for line, (path, words) in zip(warnings, expected):
        assert line.startswith(f"commtag merge: warning: {path}: ") and words in line, line
    assert stdout.startswith(f"{out}: ") and validate_file(out) == []
    before = out.read_bytes()
    code, err, stdout = _merge(capsys, str(inputs), "--strict", "-o", str(out))
    assert code == 2 and stdout == "", err
    assert err == [f"commtag merge: error: {warnings[0][len('commtag merge: warning: '):]} (--strict refuses it)"]
    assert out.read_bytes() == before  # the earlier output is left as it was
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    # `commtag summary` of the folder reads the files as the merge does (one code path), and warns alike.
    assert main(["summary", str(inputs), "--format", "json"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line]
    assert said == [line.replace("commtag merge: ", "commtag summary: ", 1) for line in warnings], said


@pytest.mark.slow
def test_a_step_file_from_weeks_before_is_warned_about(steps: Path, steps_b: Path, tmp_path: Path, capsys):
    # Rank 1's second step comes from another run, three weeks earlier, without its sidecar.
    trace, sidecar = _second_step(steps, 1)
    sidecar.unlink()
    shutil.copy(steps_b / trace.name, trace)
    _edit_trace(trace, lambda t: t.update(baseTimeNanoseconds=t["baseTimeNanoseconds"] - 21 * DAY_NS))
    _warned(capsys, tmp_path / OUT, steps, [(trace, "rank 1: its events lie 21.0 days from those of the other files")])


@pytest.mark.slow
def test_a_rank_days_apart_from_the_others_is_warned_about(traces: Path, tmp_path: Path, capsys):
    for path in (_trace(traces, 2), _sidecar(traces, 2)):  # its clock three days behind, sidecar and all
        if path.name.endswith(".gz"):
            _edit_trace(path, lambda t: t.update(baseTimeNanoseconds=t["baseTimeNanoseconds"] - 3 * DAY_NS))
        else:
            _edit_sidecar(path, lambda s: [c.update(start_ns=c["start_ns"] - 3 * DAY_NS, end_ns=c["end_ns"] - 3 * DAY_NS)
                                           for c in s["collectives"]])
    _warned(capsys, tmp_path / OUT, traces, [(_trace(traces, 2), "rank 2: its events lie 3.0 days from")])


@pytest.mark.slow
def test_hosts_that_differ_are_warned_about(steps: Path, tmp_path: Path, capsys):
    # Rank 0's trace says another machine than its sidecar; rank 1's second step another machine
    # than its first (trace and sidecar agreeing).
    _edit_trace(_trace(steps, 0), lambda t: t.update(host_name="node-7"))
    trace, sidecar = _second_step(steps, 1)
    _edit_trace(trace, lambda t: t.update(host_name="node-9"))
    _edit_sidecar(sidecar, lambda s: s.update(host="node-9"))
    _warned(capsys, tmp_path / OUT, steps, [
        (_trace(steps, 0), "its host_name 'node-7' differs from host"),
        (trace, f"rank 1 ran on {orjson.loads(_sidecar(steps, 1).read_bytes())['host']!r} in {_trace(steps, 1)} but "
                "on 'node-9' here"),
    ])


@pytest.mark.slow
def test_files_of_one_rank_from_two_processes_are_warned_about(steps: Path, tmp_path: Path, capsys):
    # Rank 1's second step was written by another process on other devices, on the same host
    # and within the hour (a run of another machine type, copied into the folder).
    first = _trace(steps, 1)
    trace, sidecar = _second_step(steps, 1)
    pid = orjson.loads(_sidecar(steps, 1).read_bytes())["pid"]
    _edit_sidecar(sidecar, lambda s: s.update(pid=pid + 1))
    _edit_trace(first, lambda t: t.update(deviceProperties=[{"id": 0, "name": "NVIDIA B300"}]))
    _edit_trace(trace, lambda t: t.update(deviceProperties=[{"id": 0, "name": "AMD Instinct MI300X"}]))
    expected = [(trace, f"rank 1 was process {pid} in {first} but process {pid + 1} here: files of one rank that "
                        "cannot come from one process"),
                (trace, f"rank 1 ran on NVIDIA B300 in {first} but on AMD Instinct MI300X here: files of one rank "
                        "that cannot come from one process")]
    _warned(capsys, tmp_path / OUT, steps, expected)


@pytest.mark.slow
def test_one_profile_claimed_by_two_ranks_is_warned_about(traces: Path, tmp_path: Path, capsys):
    # Traces named by rank (no distributedInfo, no sidecar), one of them a copy of another.
    named = tmp_path / "named"
    named.mkdir()
    for rank in (0, 1):
        shutil.copy(_trace(traces, rank), named / f"rank{rank}.json.gz")
        _edit_trace(named / f"rank{rank}.json.gz", lambda t: t.pop("distributedInfo"))
    shutil.copy(named / "rank0.json.gz", named / "rank2.json.gz")
    _warned(capsys, tmp_path / OUT, named, [(named / "rank2.json.gz", "rank 2's trace is a copy of")])


def test_a_public_rank_days_apart_is_warned_about(tmp_path: Path, capsys):
    dlrm = tmp_path / "dlrm"
    dlrm.mkdir()
    for src in (PUBLIC / "param-dlrm-8rank").iterdir():
        (dlrm / src.name).symlink_to(src)
    shifted = next(dlrm.glob("worker3_*"))
    shifted.unlink()
    # Old format: absolute epoch-µs ts, no baseTimeNanoseconds. Worker 3's clock two days ahead.
    shutil.copy(PUBLIC / "param-dlrm-8rank" / shifted.name, shifted)
    _edit_trace(shifted, lambda t: [e.update(ts=e["ts"] + 2 * 86_400 * 10**6) for e in t["traceEvents"] if "ts" in e])
    _warned(capsys, tmp_path / OUT, dlrm, [(shifted, "rank 3: its events lie 2.0 days from")])


def test_public_traces_of_two_machines_as_one_rank_are_warned_about(tmp_path: Path, capsys):
    # Two public rank-0 traces, a B200 run and an MI300X run, copied into one folder.
    mix = tmp_path / "mix"
    mix.mkdir()
    for name in ("tracelens_b200_eager_trace.json.gz", "tracelens_mi300_rccl_resnet.json.gz"):
        (mix / name).symlink_to(PUBLIC / "eager-nccl-metadata" / name)
    b200, mi300 = mix / "tracelens_b200_eager_trace.json.gz", mix / "tracelens_mi300_rccl_resnet.json.gz"
    _warned(capsys, tmp_path / OUT, mix, [
        (mi300, "rank 0: its events lie 27.5 days from those of the other files"),
        (mi300, f"rank 0 ran on 8 NVIDIA B200 in {b200} but on 8 AMD Instinct MI300X here: files of one rank that "
                "cannot come from one process"),
    ])

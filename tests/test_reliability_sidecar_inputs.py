"""Bad sidecars and odd input folders: the same contract as every bad merge input.

Each case starts from the real traces and sidecars of a 4-rank gloo run (conftest's shared
``gloo_run``), damages one sidecar (or the folder) the way it happens to users, and runs
``commtag merge`` as a user would: one line naming the file and the problem, exit 2,
nothing written; with ``--skip-bad-ranks`` the bad sidecar is left out, said so, and its
trace merged alone.
"""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path
from typing import Callable

import orjson
import pytest

from commtag.cli import main
from commtag.constants import MAX_NELEMS
from commtag.schema import CollectiveAnnotation
from gloo_world import PROFILED_GROUPS_WORLD
from pftrace_reader import read

pytestmark = pytest.mark.slow

WORLD = PROFILED_GROUPS_WORLD
OUT = "merged.pftrace"
#: 2255-01-01 in ns: below int64's limit, centuries after any run.
YEAR_2255_NS = 9_025_000_000 * 10**9


@pytest.fixture
def traces(gloo_run: Path, tmp_path: Path) -> Path:
    """A fresh copy of the run's files for one case to damage."""
    return Path(shutil.copytree(gloo_run, tmp_path / "traces"))


def _trace(d: Path, rank: int) -> Path:
    return d / f"rank{rank}.step0.pt.trace.json.gz"


def _sidecar(d: Path, rank: int) -> Path:
    return d / f"rank{rank}.step0.commtag.json"


def _edit_sidecar(path: Path, edit: Callable[[dict], object]) -> None:
    data = orjson.loads(path.read_bytes())
    edit(data)
    path.write_text(json.dumps(data))  # the json module: it writes integers beyond 64 bits too


def _merge(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, list[str], str]:
    code = main(["merge", "--no-progress", *args])
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line], captured.out


def _set_times(index: int, start: int, end: int) -> Callable[[dict], object]:
    return lambda s: s["collectives"][index].update(start_ns=start, end_ns=end)


# ---------------------------------------------------------------------------
# The matrix: (damage, the sidecar the error must name, words of the problem).


def _sidecar_time_at_5_ns(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 1), _set_times(0, 5, 5))
    return _sidecar(d, 1), "collectives.0: start_ns 5 (1970-01-01 00:00:00 UTC) is before its trace's baseTimeNanoseconds"


def _sidecar_time_in_2255(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 1), _set_times(2, YEAR_2255_NS, YEAR_2255_NS + 1000))
    return _sidecar(d, 1), "collectives.2: end_ns 9025000000000001000 (2255-"


def _sidecar_call_lasting_days(d: Path) -> tuple[Path, str]:
    def stretch(s: dict) -> None:
        call = s["collectives"][1]
        call["end_ns"] = call["start_ns"] + 3 * 86_400 * 10**9
    _edit_sidecar(_sidecar(d, 2), stretch)
    return _sidecar(d, 2), "collectives.1: lasts 3.0 days, more than the 1 day a call may take"


def _absurd_element_count(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 3), lambda s: s["collectives"][0]["annotation"].update({"In msg nelems": 10**30}))
    return _sidecar(d, 3), f"collectives.0.annotation.In msg nelems: Input should be less than or equal to {MAX_NELEMS}"


def _sidecar_of_another_world_size(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 2), lambda s: s.update(world_size=8))  # its trace says 4, as every other file
    return _sidecar(d, 2), f"world size 8 differs from {WORLD} of the other files: a sidecar of another run"


def _host_not_utf8(d: Path) -> tuple[Path, str]:
    raw = _sidecar(d, 1).read_bytes()
    host = orjson.dumps(orjson.loads(raw)["host"])
    _sidecar(d, 1).write_bytes(raw.replace(b'"host":' + host, b'"host":"node\xff7"', 1))
    offset = _sidecar(d, 1).read_bytes().index(b"\xff")
    return _sidecar(d, 1), f"invalid sidecar: not UTF-8 text (byte 0xff at offset {offset})"


def _record_twice(d: Path) -> tuple[Path, str]:
    count = len(orjson.loads(_sidecar(d, 0).read_bytes())["collectives"])
    _edit_sidecar(_sidecar(d, 0), lambda s: s["collectives"].append(s["collectives"][3]))
    return _sidecar(d, 0), f"invalid sidecar: collectives.{count} repeats collectives.3 (one call recorded twice)"


def _truncated_sidecar(d: Path) -> tuple[Path, str]:
    raw = _sidecar(d, 3).read_bytes()
    _sidecar(d, 3).write_bytes(raw[: len(raw) // 2])
    return _sidecar(d, 3), "invalid sidecar: not valid JSON (EOF while parsing"


def _seq_beyond_int64(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 1), lambda s: s["collectives"][2]["annotation"].update({"Seq": 2**70}))
    return _sidecar(d, 1), f"collectives.2.annotation.Seq: Input should be less than or equal to {2**63 - 1}"


def _schema_version_zero(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 0), lambda s: s.update(schema_version=0))
    return _sidecar(d, 0), "schema_version: Input should be greater than or equal to 1"


def _schema_version_text(d: Path) -> tuple[Path, str]:
    _edit_sidecar(_sidecar(d, 0), lambda s: s.update(schema_version="2"))
    return _sidecar(d, 0), "schema_version: Input should be a valid integer"


def _group_rank_outside_world(d: Path) -> tuple[Path, str]:
    def outside(s: dict) -> None:
        pg = next(pg for pg in s["process_groups"] if pg["ranks"] == [0, 1, 2, 3])
        pg["ranks"] = [0, 1, 2, 99]
        for call in s["collectives"]:
            if call["annotation"]["commtag pg uid"] == pg["uid"]:
                call["annotation"]["Process Group Ranks"] = "[0, 1, 2, 99]"
    _edit_sidecar(_sidecar(d, 2), outside)
    return _sidecar(d, 2), f"rank 99 is outside world_size {WORLD}"


def _record_rank_outside_world(d: Path) -> tuple[Path, str]:
    def outside(s: dict) -> None:
        annotation = next(c["annotation"] for c in s["collectives"] if c["annotation"]["Group size"] == WORLD)
        annotation["Process Group Ranks"] = "[0, 1, 2, 99]"
    _edit_sidecar(_sidecar(d, 3), outside)
    return _sidecar(d, 3), "Process Group Ranks: [0, 1, 2, 99] are not the members [0, 1, 2, 3] of group"


CASES = [_sidecar_time_at_5_ns, _sidecar_time_in_2255, _sidecar_call_lasting_days, _absurd_element_count,
         _sidecar_of_another_world_size, _host_not_utf8, _record_twice, _truncated_sidecar, _seq_beyond_int64,
         _schema_version_zero, _schema_version_text, _group_rank_outside_world, _record_rank_outside_world]


@pytest.mark.parametrize("damage", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_bad_sidecar_one_line_exit_2_and_skipped_alone(damage, traces: Path, tmp_path: Path, capsys):
    named, problem = damage(traces)
    before = {p.name: p.read_bytes() for p in traces.iterdir()}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, err, out = _merge(capsys, str(traces), "-o", str(out_dir / OUT))
    assert code == 2, (err, out)
    assert len(err) == 1 and err[0].startswith(f"commtag merge: error: {named}: "), err
    assert problem in err[0] and ": :" not in err[0], err
    assert out == "" and list(out_dir.iterdir()) == []  # no output, no temporary left behind
    assert {p.name: p.read_bytes() for p in traces.iterdir()} == before

    code, err, out = _merge(capsys, str(traces), "-o", str(out_dir / OUT), "--skip-bad-ranks")
    assert code == 0, err
    skipped = [line for line in err if line.startswith("commtag merge: skipped: ")]
    assert len(skipped) == 1 and skipped[0].startswith(f"commtag merge: skipped: {named}: ") and problem in skipped[0]
    assert out.startswith(f"{out_dir / OUT}: {WORLD} ranks"), out  # its trace merged alone
    assert {p.name: p.read_bytes() for p in traces.iterdir()} == before


def test_the_schema_bounds_element_counts() -> None:
    properties = CollectiveAnnotation.model_json_schema(by_alias=True)["properties"]
    assert properties["In msg nelems"]["maximum"] == properties["Out msg nelems"]["maximum"] == MAX_NELEMS


def test_a_sidecar_time_just_inside_the_bounds_merges(traces: Path, capsys) -> None:
    """The bounds are a trace's: a call ending within a day of this machine's clock is a run's, not absurd."""
    soon = time.time_ns() + 3600 * 10**9
    _edit_sidecar(_sidecar(traces, 1), _set_times(0, soon, soon + 1000))
    code, err, _ = _merge(capsys, str(traces))
    assert code == 0, err
    assert not [line for line in err if "skipped" in line or "error" in line], err
    assert read(traces / OUT).slices


def test_a_dangling_link_in_a_folder_is_left_out_with_a_notice(traces: Path, tmp_path: Path, capsys) -> None:
    link = traces / "rank7.step0.pt.trace.json.gz"
    link.symlink_to(tmp_path / "gone.pt.trace.json.gz")
    code, err, out = _merge(capsys, str(traces))
    assert code == 0, err
    assert f"commtag merge: notice: {link}: a symbolic link to {tmp_path / 'gone.pt.trace.json.gz'}, which does " \
           "not exist; left out" in err
    assert out.startswith(f"{traces / OUT}: {WORLD} ranks"), out


def test_summary_of_a_folder_leaves_a_dangling_link_out_with_the_merges_notice(traces: Path, tmp_path: Path,
                                                                                capsys) -> None:
    code = main(["summary", str(traces), "--format", "json"])
    whole = capsys.readouterr()
    assert code == 0, whole.err
    link = traces / "rank7.step0.pt.trace.json.gz"
    link.symlink_to(tmp_path / "gone.pt.trace.json.gz")
    code = main(["summary", str(traces), "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"commtag summary: notice: {link}: a symbolic link to {tmp_path / 'gone.pt.trace.json.gz'}, which does " \
           "not exist; left out" in captured.err
    assert captured.out == whole.out  # the same summary: the link adds nothing and takes nothing away


def test_a_file_named_gz_that_is_not_gzip(traces: Path, capsys) -> None:
    """A plain trace named .json.gz is read as what it is; plain text that is no trace is said not to be gzip."""
    plain = _trace(traces, 1)
    plain.write_bytes(gzip.decompress(plain.read_bytes()))
    code, err, out = _merge(capsys, str(traces))
    assert code == 0 and out.startswith(f"{traces / OUT}: {WORLD} ranks"), err
    (traces / OUT).unlink()
    plain.write_bytes(b'{"note": "a copy went wrong"}')
    code, err, out = _merge(capsys, str(traces))
    assert code == 2 and len(err) == 1, err
    assert err[0] == (f"commtag merge: error: {plain}: named .gz but is not gzip, and its text is neither a trace "
                      "nor a sidecar (no traceEvents, no commtag kind)")
    assert not (traces / OUT).exists()


def test_a_seq_beyond_int64_is_the_same_error_in_every_mode(traces: Path, tmp_path: Path, capsys) -> None:
    named, problem = _seq_beyond_int64(traces)
    for command in (["merge", "--no-progress", str(traces), "-o", str(tmp_path / OUT), "-j", "1"],
                    ["merge", "--no-progress", str(traces), "-o", str(tmp_path / OUT), "-j", "2"],
                    ["summary", str(traces), "--format", "json"]):
        assert main(command) == 2, command
        captured = capsys.readouterr()
        err = [line for line in captured.err.splitlines() if line]
        assert len(err) == 1 and f"{named}: " in err[0] and problem in err[0], (command, err)
        assert captured.out == "", command
    assert not (tmp_path / OUT).exists()


def test_a_recorded_call_an_hour_outside_its_trace_is_left_out_with_a_notice(traces: Path, tmp_path: Path) -> None:
    """One call of rank 2's sidecar starts an hour after its trace ends: it is said (file, record) and
    left out, not aligned to the trace (a 3,600 s skew); the rest merges, and no finding blames rank 2
    for the call it lacks. -j 1 and -j 2 say the same."""
    from commtag.merge import merge

    hour = 3600 * 10**9
    calls = orjson.loads(_sidecar(traces, 2).read_bytes())["collectives"]
    at = next(i for i, c in enumerate(calls) if c["annotation"]["Group size"] == WORLD and i > 0)
    _edit_sidecar(_sidecar(traces, 2), _set_times(at, calls[at]["start_ns"] + hour, calls[at]["end_ns"] + hour))
    one = merge(traces, tmp_path / "one.pftrace", jobs=1, analysis=True)
    said = [n for n in one.notices if "outside the trace's" in n]
    assert len(said) == 1 and said[0].startswith(f"rank 2: {_sidecar(traces, 2).with_name(_trace(traces, 2).name)}"), \
        one.notices
    assert "1 of its sidecar's recorded calls start more than 1 s outside" in said[0] and f"collectives.{at} " in said[0]
    from merging import matched

    assert max(m.skew_ns or 0 for m in matched(one)) < hour // 2
    assert not [f for f in one.analysis.findings if 2 in f.ranks], [f.message for f in one.analysis.findings]
    two = merge(traces, tmp_path / "two.pftrace", jobs=2, analysis=True)
    assert sorted(two.notices) == sorted(one.notices)

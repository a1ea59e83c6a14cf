"""Flight Recorder dumps beside the profile of the same job: each dump's entries join the profiled
calls by (rank, group, Seq), in `commtag summary` (text and JSON) and `commtag merge`; the entries
outside the profile are counted, not dropped silently, and the dumps' hangs are reported with it."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from commtag.cli import main

#: Per rank, the profiled collectives: three all_reduces of the world, and three of the pair (0, 1).
PROFILED = {0: 6, 1: 6, 2: 3}
#: What each kind of dump says of a call that returned.
OUTCOME = {"torch": "ended", "commtag": "completed"}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fr_join_world import run_profiled_and_dumped

    out = tmp_path_factory.mktemp("fr_join")
    run_profiled_and_dumped(out)
    return out


def _folder(job: Path, tmp_path: Path, dumps: str, pattern: str) -> Path:
    folder = tmp_path / dumps
    shutil.copytree(job / "trace", folder)
    for dump in (job / dumps).glob(pattern):
        shutil.copy(dump, folder)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("dumps,pattern", [("torch", "fr_*"), ("commtag", "commtag_fr_*")])
def test_dump_entries_join_the_profiled_calls(job: Path, tmp_path: Path, dumps: str, pattern: str, capsys) -> None:
    folder = _folder(job, tmp_path, dumps, pattern)
    assert main(["summary", str(folder), "--format", "json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    joined = report["fr_join"]
    assert joined["joined"] == sum(PROFILED.values())
    assert joined["disagreements"] == [] and joined["instances_without_entry"] == 0
    # The world's all_reduce before the profile and the one after it, on every rank.
    assert joined["entries_outside_profile"] == 2 * len(PROFILED)
    calls = joined["calls"]
    assert {r: sum(1 for c in calls if c["rank"] == r) for r in PROFILED} == PROFILED
    assert {(c["pg"], c["seq"]) for c in calls if c["rank"] == 2} == {("0", 2), ("0", 3), ("0", 4)}
    # torch's gloo dumps say "scheduled" and retired (ended); commtag's say completed.
    assert {(c["collective"], c["outcome"]) for c in calls} == {("allreduce", OUTCOME[dumps])}
    assert report["hangs"] == [] and report["collectives"]
    assert main(["summary", str(folder)]) == 0
    text = capsys.readouterr().out
    assert f"by (rank, group, Seq): {sum(PROFILED.values())} joined; 6 outside the profile" in text


@pytest.mark.slow
def test_merge_of_traces_and_dumps_reports_the_join(job: Path, tmp_path: Path, capsys) -> None:
    folder = _folder(job, tmp_path, "commtag", "commtag_fr_*")
    assert main(["merge", str(folder), "-o", str(tmp_path / "out.pftrace")]) == 0
    err = capsys.readouterr().err
    assert f"by (rank, group, Seq): {sum(PROFILED.values())} joined" in err
    assert (tmp_path / "out.pftrace").stat().st_size > 0


@pytest.mark.slow
def test_an_entry_whose_op_differs_from_the_profiled_call_is_named_not_joined(job: Path, tmp_path: Path,
                                                                              capsys) -> None:
    import pickle

    from commtag.merge.hangs.dumps import load_plain_pickle

    folder = _folder(job, tmp_path, "torch", "fr_*")
    doc = load_plain_pickle((folder / "fr_2").read_bytes())
    changed = next(e for e in doc["entries"] if e["collective_seq_id"] == 3 and e["process_group"][0] == "0")
    changed["profiling_name"] = "gloo:broadcast"
    (folder / "fr_2").write_bytes(pickle.dumps(doc))
    assert main(["summary", str(folder), "--format", "json"]) == 0
    joined = orjson.loads(capsys.readouterr().out)["fr_join"]
    assert joined["joined"] == sum(PROFILED.values()) - 1
    assert joined["disagreements"] == ["rank 2 group 0 Seq 3: the dump says broadcast, the profile allreduce"]
    assert (2, "0", 3) not in {(c["rank"], c["pg"], c["seq"]) for c in joined["calls"]}


@pytest.mark.slow
def test_an_unreadable_dump_beside_traces_stops_the_merge_before_it_writes(job: Path, tmp_path: Path,
                                                                           capsys) -> None:
    folder = _folder(job, tmp_path, "torch", "fr_*")
    (folder / "fr_1").write_bytes(b"\x80\x02not a pickle")
    target = tmp_path / "out.pftrace"
    assert main(["merge", str(folder), "-o", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fr_1" in err[0] and "Traceback" not in err[0]
    assert not target.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["torch"]

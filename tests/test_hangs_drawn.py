"""Flight Recorder dumps beside the profile of the same job, drawn on the merged trace: each profiled
collective whose entry a dump holds carries the entry's state on its lane slice (marked in flight
where the dump holds it so), and the rank missing from the dumps' hang gets a marker on its row.
Read back from the .pftrace of a real gloo job; the trace validates."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from commtag.cli import main
from commtag.merge.hangs.dumps import load_plain_pickle
from commtag.vocab import ANN_FR_DUMP, ANN_FR_END, ANN_FR_OUTCOME, ANN_FR_STATE, ANN_MARKER, PG_NAME_KEY
from commtag.vocab import flight_recorder as fr

#: Per dump kind: the state and outcome a call that returned has ("scheduled" and retired on torch's gloo).
RETURNED = {"torch": ("scheduled", "ended"), "commtag": ("completed", "completed")}
#: The profiled lane slices: the hung group's three all_reduces and one of the world, on each of 3 ranks.
PROFILED = 3 * 4


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fr_hang_profiled_world import run_profiled_then_hung

    out = tmp_path_factory.mktemp("fr_drawn")
    run_profiled_then_hung(out)
    return out


def _merged(job: Path, tmp_path: Path, dumps: str, pattern: str, jobs: str = "2") -> tuple[Path, object]:
    from pftrace_reader import read

    folder = tmp_path / dumps
    shutil.copytree(job / "trace", folder)
    for dump in (job / dumps).glob(pattern):
        shutil.copy(dump, folder)
    target = tmp_path / f"{dumps}.pftrace"
    assert main(["merge", str(folder), "-o", str(target), "-j", jobs]) == 0
    assert main(["validate", str(target)]) == 0
    return folder, read(target)


def _lane_slices(parsed) -> dict[tuple[int, str, int], dict[str, object]]:
    """(rank, group name, Seq) -> the args of its slice on the group's lane."""
    from pftrace_reader import lane_of

    found = {}
    for s in parsed.slices:
        lane = lane_of(parsed, s)
        if lane is not None and PG_NAME_KEY in s.args:  # a collective's slice (not the lane's kernel summary)
            found[(lane[0], str(s.args[PG_NAME_KEY]), int(s.args["Seq"]))] = s.args
    return found


def _hang_markers(parsed) -> list[tuple[str, object]]:
    return [(parsed.name_path(s.track)[0], s) for s in parsed.slices if s.args.get(ANN_MARKER) == "hang"]


@pytest.mark.slow
@pytest.mark.parametrize("dumps,pattern", [("torch", "fr_*"), ("commtag", "commtag_fr_*")])
def test_each_profiled_slice_carries_its_dump_state_and_the_missing_rank_its_hang_marker(
        job: Path, tmp_path: Path, dumps: str, pattern: str, capsys) -> None:
    _, parsed = _merged(job, tmp_path, dumps, pattern)
    capsys.readouterr()
    slices = _lane_slices(parsed)
    assert len(slices) == PROFILED
    state, outcome = RETURNED[dumps]
    for (rank, _, _), args in slices.items():
        assert (args[ANN_FR_STATE], args[ANN_FR_OUTCOME]) == (state, outcome)
        assert str(args[ANN_FR_DUMP]).endswith(f"fr_{rank}") and ANN_FR_END not in args
    markers = _hang_markers(parsed)
    assert len(markers) == 1
    process, marker = markers[0]
    assert process.startswith("rank 2 ")
    assert marker.name == "hang: never entered all_reduce Seq 4 of group 1" and marker.args["waiting ranks"] == "0,1"
    # Drawn when rank 0 or 1 entered the call, after the last profiled call of the group on every rank.
    last_profiled = max(s.ts for s in parsed.slices if s.args.get(PG_NAME_KEY) == "1")
    assert marker.ts > last_profiled


@pytest.mark.slow
def test_a_call_a_dump_holds_in_flight_is_marked_so_on_its_slice(job: Path, tmp_path: Path, capsys) -> None:
    """commtag's rings dumped while ranks 0 and 1 waited in the world's all_reduce for rank 2."""
    _, parsed = _merged(job, tmp_path, "midway", "commtag_fr_*", jobs="1")
    capsys.readouterr()
    slices = _lane_slices(parsed)
    world = {rank: args for (rank, pg, _), args in slices.items() if pg == "0"}
    for rank in (0, 1):
        assert world[rank][ANN_FR_END] == fr.FR_IN_FLIGHT and world[rank][ANN_FR_OUTCOME] == fr.FR_IN_FLIGHT
    assert ANN_FR_STATE not in world[2]  # rank 2 dumped before it entered: its ring does not hold the call
    assert all(args[ANN_FR_OUTCOME] == "completed" and ANN_FR_END not in args
               for (_, pg, _), args in slices.items() if pg == "1")
    (process, marker), = _hang_markers(parsed)
    assert process.startswith("rank 2 ") and marker.name == "hang: never entered all_reduce Seq 1 of group 0"


@pytest.mark.slow
def test_an_entry_whose_op_differs_from_the_profiled_call_is_not_drawn(job: Path, tmp_path: Path, capsys) -> None:
    folder = tmp_path / "changed"
    shutil.copytree(job / "trace", folder)
    for dump in (job / "torch").glob("fr_*"):
        shutil.copy(dump, folder)
    doc = load_plain_pickle((folder / "fr_1").read_bytes())
    changed = next(e for e in doc["entries"] if e["collective_seq_id"] == 2 and e["process_group"][0] == "1")
    changed["profiling_name"] = "gloo:broadcast"
    (folder / "fr_1").write_bytes(pickle.dumps(doc))
    target = tmp_path / "changed.pftrace"
    assert main(["merge", str(folder), "-o", str(target)]) == 0
    assert "not joined: rank 1 group 1 Seq 2: the dump says broadcast, the profile allreduce" in capsys.readouterr().err
    from pftrace_reader import read

    slices = _lane_slices(read(target))
    assert ANN_FR_STATE not in slices[(1, "1", 2)]
    assert all(ANN_FR_STATE in args for key, args in slices.items() if key != (1, "1", 2))


@pytest.mark.slow
def test_a_missing_rank_without_a_profile_gets_no_marker_and_the_merge_says_so(job: Path, tmp_path: Path,
                                                                               capsys) -> None:
    folder = tmp_path / "two"
    shutil.copytree(job / "trace", folder, ignore=shutil.ignore_patterns("rank2.*"))
    for dump in (job / "torch").glob("fr_*"):
        shutil.copy(dump, folder)
    target = tmp_path / "two.pftrace"
    assert main(["merge", str(folder), "-o", str(target)]) == 0
    assert "no hang marker drawn for rank 2: the merge has no profiled call of theirs" in capsys.readouterr().err
    from pftrace_reader import read

    parsed = read(target)
    assert _hang_markers(parsed) == [] and len(_lane_slices(parsed)) == PROFILED - 4

"""`commtag export-fr` of a finished 4-rank gloo job: torch's own analyzer (fr_trace) reads the dumps
and finds nothing wrong, as commtag does; a size changed on one rank is a desync to both."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from commtag.cli import main
from commtag.merge.hangs.dumps import load_plain_pickle
from commtag.vocab import ANN_FR_STATE, ANN_REPLAY


def _fr_trace(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_torchs_analyzer_reads_the_export_and_agrees(gloo_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "fr"
    assert main(["export-fr", str(gloo_run), "-o", str(out)]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"{out}: 4 Flight Recorder dumps")
    # The job's one send/recv is on the 4-rank world: left out, and said.
    assert "left out 2: send/recv on a group of more than two ranks" in said.err
    assert sorted(p.name for p in out.iterdir()) == [f"commtag_export_rank_{r}" for r in range(4)]
    analyzed = _fr_trace(out)
    assert analyzed.returncode == 0, analyzed.stderr
    assert "mismatch" not in (analyzed.stdout + analyzed.stderr).lower()
    assert "Not all ranks" not in analyzed.stdout + analyzed.stderr
    assert main(["summary", str(out), "--format", "json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["hangs"] == [] and report["fr_desyncs"] == []
    assert {g["pg"]: g["members"] for g in report["fr_groups"]}["0"] == [0, 1, 2, 3]

    # The same dumps, rank 3's first all_reduce on the world made larger: both name rank 3.
    path = out / "commtag_export_rank_3"
    doc = load_plain_pickle(path.read_bytes())
    first = next(e for e in doc["entries"] if e["process_group"][0] == "0")
    first["input_sizes"] = first["output_sizes"] = [[first["input_sizes"][0][0] * 2]]
    path.write_bytes(pickle.dumps(doc, protocol=2))
    analyzed = _fr_trace(out)
    assert analyzed.returncode == 0
    told = analyzed.stdout + analyzed.stderr
    assert f"Collective sequence number: {first['collective_seq_id']} has errors" in told
    assert "SIZE_OR_SYNTAX_MISMATCH" in told and "group info: 0:default_pg" in told
    assert main(["summary", str(out), "--format", "json"]) == 0
    desyncs = orjson.loads(capsys.readouterr().out)["fr_desyncs"]
    assert [(d["pg"], d["seq"], d["kind"], d["ranks"]) for d in desyncs] == [("0", first["collective_seq_id"], "size", [3])]


def test_export_never_writes_over_a_dump(tmp_path: Path, capsys) -> None:
    out = tmp_path / "fr"
    out.mkdir()
    (out / "commtag_export_rank_0").write_bytes(b"mine")
    from commtag.merge.hangs.export import export_fr
    from commtag.merge.errors import MergeInputError
    from commtag.merge.records import CollectiveInstance

    instance = CollectiveInstance(rank=0, pg_uid="u", is_p2p=False, seq=1, replay=None, collective="allreduce",
                                  in_nelems=4, out_nelems=4, dtype="Float", group_size=1, group_ranks=(0,),
                                  start_ns=1, end_ns=2, source="gloo", lane_name="x")
    with pytest.raises(MergeInputError, match="exists already"):
        export_fr([instance], out)
    assert (out / "commtag_export_rank_0").read_bytes() == b"mine"
    assert sorted(p.name for p in out.iterdir()) == ["commtag_export_rank_0"]


@pytest.mark.slow
def test_graph_replays_are_numbered_per_group_in_time_order(public_traces: Path, tmp_path: Path, capsys) -> None:
    """A generated 4-rank NCCL job with CUDA-graph replays (commtag.testing.scaleset): each replay gets
    the next Seq of its group, its capture Seq and replay index kept beside; fr_trace finds nothing."""
    job = tmp_path / "job"
    made = subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", "4", "--events", "24000",
                           "--ranks-per-node", "1", "-o", str(job)], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    out = tmp_path / "fr"
    assert main(["export-fr", str(job), "-o", str(out)]) == 0
    capsys.readouterr()
    analyzed = _fr_trace(out)
    assert analyzed.returncode == 0, analyzed.stderr
    told = analyzed.stdout + analyzed.stderr
    assert "has errors" not in told and "Not all ranks" not in told
    for rank in range(4):
        entries = load_plain_pickle((out / f"commtag_export_rank_{rank}").read_bytes())["entries"]
        replays = [e for e in entries if "commtag_replay" in e]
        assert replays and all(isinstance(e["commtag_capture_seq"], int) for e in replays)
        for group in {e["process_group"] for e in replays}:
            seqs = [e["collective_seq_id"] for e in entries if e["process_group"] == group]
            assert seqs == list(range(1, len(seqs) + 1))
    # Beside the job's traces, every exported collective joins its own instance, a replay by its capture
    # Seq and replay index: none is taken for another call.
    collectives = 0
    for dump in out.iterdir():
        shutil.copy(dump, job)
        collectives += sum(1 for e in load_plain_pickle(dump.read_bytes())["entries"] if not e["is_p2p"])
    assert main(["summary", str(job), "--format", "json"]) == 0
    join = orjson.loads(capsys.readouterr().out)["fr_join"]
    assert (len(join["calls"]), join["disagreements"], join["entries_outside_profile"]) == (collectives, [], 0)
    # The merge draws the same join: every exported collective's state on its own lane slice, replays
    # included (the time-order numbering is not taken for the Seq of another call).
    from pftrace_reader import lane_of, read

    target = tmp_path / "job.pftrace"
    assert main(["merge", str(job), "-o", str(target), "-j", "1", "--no-progress"]) == 0
    capsys.readouterr()
    parsed = read(target)
    drawn = [s for s in parsed.slices if ANN_FR_STATE in s.args]
    assert all(lane_of(parsed, s) is not None for s in drawn)
    assert len(drawn) == collectives
    assert any(ANN_REPLAY in s.args for s in drawn)


def test_a_rank_that_never_reached_a_replay_is_numbered_like_the_others(tmp_path: Path) -> None:
    """Rank 1 stopped after Seq 50 of a group whose graph rank 0 then replayed: both ranks' calls on the
    group are numbered in time order, so the hang is rank 1 missing from replay 0, not a Seq of its own."""
    from commtag.merge.hangs import diagnose, read_dumps
    from commtag.merge.hangs.export import export_fr
    from commtag.merge.records import CollectiveInstance

    def call(rank: int, seq: int, replay: int | None, start: int) -> CollectiveInstance:
        return CollectiveInstance(rank=rank, pg_uid="u", is_p2p=False, seq=seq, replay=replay, collective="allreduce",
                                  in_nelems=4, out_nelems=4, dtype="Float", group_size=2, group_ranks=(0, 1),
                                  start_ns=start, end_ns=start + 1, source="nccl-kernel", lane_name="x")

    export_fr([call(0, 50, None, 10), call(0, 50, 0, 20), call(0, 51, None, 30), call(1, 50, None, 10)], tmp_path)
    (hang,) = diagnose(read_dumps(tmp_path)).hangs
    assert (hang.seq, hang.collective, hang.capture_seq, hang.replay, hang.entered, hang.missing) == (
        2, "all_reduce", 50, 0, [0], [1])

"""Every Flight Recorder dump shape torch 2.11-2.15 writes is read: each release's NCCL dumps (generated
field by field as that release's writer writes them, commtag.testing.fr_dumps) and torch 2.15's c10d
hook's dumps of an nccl2 job are diagnosed alike, with no notice and no false desync; a version newer
than those known is read and said in one notice."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from commtag.cli import main
from commtag.merge.hangs import diagnose, read_dumps
from commtag.merge.hangs.dumps import load_plain_pickle
from commtag.testing.fr_dumps import PREFIX, Job, expected_stuck, write_dumps
from commtag.vocab import flight_recorder as fr

#: 16 ranks, TP groups of 4; rank 5 never enters its step-2 reduce_scatter (call 7 of its schedule).
SHAPE = {"world": 16, "tp": 4, "steps": 4, "stuck": {5: 7}}
#: What each shape's hang in the DP group is called (the hook records the list form).
SCATTER = {"nccl": "_reduce_scatter_base", "nccl2": "reduce_scatter"}
RELEASES = [(release, "nccl") for release in fr.FR_WRITERS] + [(fr.FR_HOOK_RELEASE, "nccl2")]


def _summary(capsys, folder: Path) -> dict:
    assert main(["summary", str(folder), "--format", "json"]) == 0
    return orjson.loads(capsys.readouterr().out)


@pytest.mark.parametrize("release,backend", RELEASES)
def test_each_releases_dumps_are_read_without_a_notice(tmp_path: Path, release: str, backend: str, capsys) -> None:
    job = Job(**SHAPE, release=release, backend=backend)
    write_dumps(job, tmp_path)
    doc = load_plain_pickle((tmp_path / f"{PREFIX}0").read_bytes())
    version = fr.FR_WRITERS[release][0]
    assert doc[fr.FR_VERSION] == version
    for entry in doc[fr.FR_ENTRIES]:  # the release's keys in its writer's order, those it always writes there
        assert list(entry) == [k for k in fr.FR_ENTRY_KEYS[version] if k in entry]
        assert set(fr.FR_ENTRY_KEYS[version]) - set(entry) <= fr.FR_SOMETIMES_KEYS
        assert entry[fr.E_PROFILING_NAME].startswith(f"{backend}:")
    report = _summary(capsys, tmp_path)
    assert report["fr_notices"] == [] and report["fr_desyncs"] == []
    assert report["stuck_ranks"] == expected_stuck(job) == [5]
    hangs = {(h["pg"], h["seq"], h["collective"], tuple(h["missing"]), tuple(h["entered"])) for h in report["hangs"]}
    assert ("6", 5, SCATTER[backend], (5,), (1, 9, 13)) in hangs
    assert ("2", 4, "all_reduce", (5,), (4, 6, 7)) in hangs


def test_the_hooks_calls_in_flight_are_scheduled_and_not_ended(tmp_path: Path) -> None:
    """torch 2.15's hook never retires a call the backend never reported complete: it reads "scheduled"."""
    write_dumps(Job(**SHAPE, release=fr.FR_HOOK_RELEASE, backend="nccl2"), tmp_path)
    diagnosis = diagnose(read_dumps(tmp_path))
    waiting = {r: p for h in diagnosis.hangs for r, p in h.last.items() if r in h.entered}
    assert waiting and all(p.state == fr.STATE_SCHEDULED and p.outcome == fr.FR_IN_FLIGHT for p in waiting.values())


def test_a_hooks_list_form_all_gather_of_the_wrong_size_is_still_a_desync(tmp_path: Path, capsys) -> None:
    write_dumps(Job(**SHAPE, release=fr.FR_HOOK_RELEASE, backend="nccl2"), tmp_path)
    import pickle

    path = tmp_path / f"{PREFIX}2"
    doc = load_plain_pickle(path.read_bytes())
    gather = next(e for e in doc[fr.FR_ENTRIES] if e[fr.E_PROFILING_NAME] == "nccl2:all_gather")
    gather[fr.E_OUTPUT_SIZES] = gather[fr.E_OUTPUT_SIZES][:-1]  # one shard short
    path.write_bytes(pickle.dumps(doc, protocol=2))
    desyncs = _summary(capsys, tmp_path)["fr_desyncs"]
    assert [(d["pg"], d["seq"], d["kind"], d["ranks"]) for d in desyncs] == [("7", gather[fr.E_SEQ], "size", [2])]


@pytest.mark.parametrize("version,said", [("2.11", "newer than any"), ("3.0", "newer than any"), ("2.7", "not one")])
def test_a_version_other_than_those_known_is_read_and_said_once(tmp_path: Path, version: str, said: str,
                                                               capsys) -> None:
    import pickle

    write_dumps(Job(**SHAPE), tmp_path)
    for path in tmp_path.iterdir():
        doc = load_plain_pickle(path.read_bytes())
        doc[fr.FR_VERSION] = version
        doc["a_later_key"] = {"x": 1}
        for entry in doc[fr.FR_ENTRIES]:
            entry["a_later_entry_key"] = [1, 2]
        path.write_bytes(pickle.dumps(doc, protocol=2))
    report = _summary(capsys, tmp_path)
    assert report["fr_notices"] == [f"Flight Recorder dump version '{version}' (0-15) is {said} commtag knows "
                                    f"({', '.join(fr.FR_KNOWN_VERSIONS)}): read by the keys it knows"]
    assert report["stuck_ranks"] == [5] and report["fr_desyncs"] == []


def test_profiling_names_split_at_the_last_colon_and_a_recv_from_any_source_names_no_peer() -> None:
    assert fr.split_profiling_name("nccl2:all_reduce") == ("nccl2", "all_reduce", None)
    assert fr.split_profiling_name(f"{fr.FR_HOOK_UNKNOWN_BACKEND}:send 0->1") == ("c10d", "send", "0->1")
    assert fr.split_profiling_name("my:backend:recv 3<-?") == ("my:backend", "recv", "3<-?")
    assert fr.p2p_peer("recv", "3<-?") is None and fr.p2p_peer("recv", "3<-1") == 1


def test_a_barrier_is_named_as_each_backend_records_it() -> None:
    """ProcessGroupNCCL records its barrier as an all_reduce titled "nccl:all_reduce_barrier" (a string
    of torch's libtorch_cuda.so); gloo as "gloo:barrier": a profiled barrier joins its dump entry by it."""
    assert fr.profiling_name("nccl", fr.fr_op("nccl", "barrier")) == "nccl:all_reduce_barrier"
    assert fr.profiling_name("gloo", fr.fr_op("gloo", "barrier")) == "gloo:barrier"


@pytest.mark.parametrize("release,backend", RELEASES)
def test_each_releases_json_dumps_are_read_a_rank_with_an_empty_ring_included(tmp_path: Path, release: str,
                                                                                backend: str, capsys) -> None:
    """torch's JSON leaves ``entries`` out of an empty ring's dump: rank 5, stuck before its first call."""
    job = Job(world=16, tp=4, steps=2, stuck={5: 0}, release=release, backend=backend)
    write_dumps(job, tmp_path, as_json=True)
    assert fr.FR_ENTRIES not in orjson.loads((tmp_path / f"{PREFIX}5").read_bytes())
    report = _summary(capsys, tmp_path)
    assert report["fr_notices"] == [] and report["stuck_ranks"] == expected_stuck(job) == [5]
    assert ("2", 1, "all_reduce", (5,)) in {(h["pg"], h["seq"], h["collective"], tuple(h["missing"]))
                                            for h in report["hangs"]}


@pytest.mark.slow
def test_a_real_torch_json_dump_of_a_rank_that_made_no_call_is_read(tmp_path: Path, capsys) -> None:
    from fr_hang_profiled_world import run_never_entered

    run_never_entered(tmp_path)
    assert fr.FR_ENTRIES not in orjson.loads((tmp_path / "fr_2").read_bytes())
    report = _summary(capsys, tmp_path)
    assert [(h["pg"], h["seq"], h["entered"], h["missing"]) for h in report["hangs"]] == [("0", 1, [0, 1], [2])]

"""`commtag summary` of Flight Recorder dumps: a real gloo hang read from torch's own dumps (pickle
and JSON), and the dumps it refuses or reads with a notice."""

from __future__ import annotations

import datetime
import pickle
from pathlib import Path

import orjson
import pytest

from commtag.cli import main

HANG = {"pg": "0", "seq": 4, "collective": "all_reduce", "entered": [0, 1], "missing": [2]}


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-rank gloo job whose rank 2 never enters the world's 4th all_reduce; torch's dumps."""
    from hang_world import run_hang_world

    out = tmp_path_factory.mktemp("hung")
    assert run_hang_world("skip_fourth_all_reduce", 3, out) == [0, 0, 0]
    return out


def _summary(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["summary", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
@pytest.mark.parametrize("form", ["torch", "torch_json"])
def test_torch_dumps_name_the_rank_that_never_entered(hung_job: Path, form: str, capsys) -> None:
    code, out, err = _summary(capsys, str(hung_job / form), "--format", "json")
    assert code == 0, err
    report = orjson.loads(out)
    assert [{k: h[k] for k in HANG} for h in report["hangs"]] == [HANG]
    last = report["hangs"][0]["last"]
    assert {r: (p["seq"], p["collective"]) for r, p in last.items()} == {
        "0": (4, "all_reduce"), "1": (4, "all_reduce"), "2": (3, "all_reduce")}
    assert report["stuck_ranks"] == [2]
    assert report["findings"][0]["kind"] == "hang" and report["findings"][0]["ranks"] == [2]
    code, text, _ = _summary(capsys, str(hung_job / form))
    assert code == 0
    assert text.splitlines()[1].startswith("stuck: rank 2 never entered all_reduce Seq 4 of group 0, "
                                           "which ranks 0-1 wait in")


def _entry(seq: int, name: str = "nccl:all_reduce", sizes=((8,),), **extra) -> dict:
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": 1000 * seq,
            "input_sizes": [list(s) for s in sizes], "output_sizes": [list(s) for s in sizes],
            "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "completed", "retired": True,
            "is_p2p": False, **extra}


def _write(folder: Path, rank: int, doc: dict, as_json: bool = False) -> None:
    folder.mkdir(exist_ok=True)
    data = orjson.dumps(doc) if as_json else pickle.dumps(doc, protocol=2)
    (folder / f"nccl_trace_rank_{rank}").write_bytes(data)


def test_a_dump_that_needs_a_class_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    _write(tmp_path, 0, {"version": "2.10", "entries": [_entry(1)], "pg_config": {}})
    _write(tmp_path, 1, {"version": "2.10", "entries": [_entry(1, when=datetime.date(2026, 1, 1))]})
    code, out, err = _summary(capsys, str(tmp_path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{tmp_path / 'nccl_trace_rank_1'}: " in err and "datetime.date" in err


def test_a_newer_version_and_unknown_keys_are_read_and_said(tmp_path: Path, capsys) -> None:
    for rank in range(2):
        entries = [_entry(s, future_key=[1, 2]) for s in range(1, 4 if rank == 0 else 3)]
        _write(tmp_path, rank, {"version": "2.99", "entries": entries, "future": {"x": 1}}, as_json=True)
    code, out, _ = _summary(capsys, str(tmp_path), "--format", "json")
    assert code == 0
    report = orjson.loads(out)
    assert [(h["seq"], h["entered"], h["missing"]) for h in report["hangs"]] == [(3, [0], [1])]
    assert any("'2.99'" in n for n in report["fr_notices"])


def test_members_disagreeing_on_a_collective_are_desyncs(tmp_path: Path, capsys) -> None:
    _write(tmp_path, 0, {"version": "2.10", "entries": [_entry(1), _entry(2)]})
    _write(tmp_path, 1, {"version": "2.10", "entries": [_entry(1, sizes=((4,),)), _entry(2, "nccl:broadcast")]})
    code, out, _ = _summary(capsys, str(tmp_path), "--format", "json")
    assert code == 0
    report = orjson.loads(out)
    assert [(d["seq"], d["kind"], d["ranks"]) for d in report["fr_desyncs"]] == [(1, "size", [1]), (2, "op", [1])]
    assert report["hangs"] == []

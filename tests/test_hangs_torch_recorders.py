"""torch's recorders saved beside commtag's dump, each in its own file: the default one (gloo's), the
legacy ProcessGroupNCCL's (CUDA builds) and, from torch 2.15, each backend torch's c10d hook records.

torch 2.15 and a CUDA build cannot run here (torch 2.13, CPU): their dump functions are stood in for by
functions with exactly their signatures, cited where each is defined, and the calls made to them and
the files written are checked. The default recorder's save is checked on a real gloo job."""

from __future__ import annotations

import logging
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import orjson
import pytest

from commtag.cli import main

from commtag.merge.hangs import find_dumps, read_dumps
from commtag.merge.hangs.dumps import read_dump
from commtag.runtime.failopen import reset
from commtag.vocab import flight_recorder as fr
from commtag.runtime.record.torchdumps import (Recorders, parameter_names, recorder_prefix, recorders_in_use,
                                               save_torch_dumps)


def _payload(recorder: str) -> bytes:
    """A dump whose one group names the recorder it came from."""
    return pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [],
                         "recorder": recorder}, protocol=2)


class Calls(list):
    """The dump calls a stand-in received: (function, its arguments by name)."""


def c10d_2_15(calls: Calls) -> SimpleNamespace:
    """torch 2.15.0's ``_dump_fr_trace``, as its torch/_C/_distributed_c10d.pyi (lines 1244-1249) types it:
    ``(includeCollectives: bool | None = None, includeStackTraces: bool | None = None,
    onlyActive: bool | None = None, backend: str = "gloo") -> bytes``."""

    def _dump_fr_trace(includeCollectives: Optional[bool] = None, includeStackTraces: Optional[bool] = None,
                       onlyActive: Optional[bool] = None, backend: str = "gloo") -> bytes:
        calls.append(("_dump_fr_trace", dict(includeCollectives=includeCollectives,
                                             includeStackTraces=includeStackTraces, onlyActive=onlyActive,
                                             backend=backend)))
        return _payload(backend)

    return SimpleNamespace(_dump_fr_trace=_dump_fr_trace)


def c10d_2_13(calls: Calls, cuda: bool = False) -> SimpleNamespace:
    """torch 2.13's ``_dump_fr_trace`` (its docstring's first line, as pybind11 writes it on this
    machine's torch 2.13.0: ``(includeCollectives: bool | None = None, includeStackTraces: bool | None =
    None, onlyActive: bool | None = None) -> bytes``) and, for a CUDA build, ``_dump_nccl_trace``
    (torch/csrc/distributed/c10d/init.cpp binds it under USE_C10D_NCCL with py::arg includeCollectives,
    includeStackTraces and onlyActive, each an optional bool; ProcessGroupNCCL.hpp ``dump_nccl_trace``)."""

    def _dump_fr_trace(includeCollectives: Optional[bool] = None, includeStackTraces: Optional[bool] = None,
                       onlyActive: Optional[bool] = None) -> bytes:
        calls.append(("_dump_fr_trace", dict(includeCollectives=includeCollectives,
                                             includeStackTraces=includeStackTraces, onlyActive=onlyActive)))
        return _payload("gloo")

    def _dump_nccl_trace(includeCollectives: Optional[bool] = None, includeStackTraces: Optional[bool] = None,
                         onlyActive: Optional[bool] = None) -> bytes:
        calls.append(("_dump_nccl_trace", dict(includeCollectives=includeCollectives,
                                               includeStackTraces=includeStackTraces, onlyActive=onlyActive)))
        return _payload("nccl")

    return SimpleNamespace(_dump_fr_trace=_dump_fr_trace, **({"_dump_nccl_trace": _dump_nccl_trace} if cuda else {}))


EVERYTHING = dict(includeCollectives=True, includeStackTraces=True, onlyActive=False)


def _saved(folder: Path) -> dict[str, str]:
    return {path.name: pickle.loads(path.read_bytes())["recorder"] for path in sorted(folder.iterdir())}


def test_torch_2_15_dumps_each_hooked_backend_by_name_beside_the_default_recorder(tmp_path: Path) -> None:
    calls = Calls()
    saved = save_torch_dumps(tmp_path, 3, c10d_2_15(calls), Recorders(hooked=("my-backend", "nccl2")))
    assert calls == [("_dump_fr_trace", {**EVERYTHING, "backend": "gloo"}),
                     ("_dump_fr_trace", {**EVERYTHING, "backend": "my-backend"}),
                     ("_dump_fr_trace", {**EVERYTHING, "backend": "nccl2"})]
    assert _saved(tmp_path) == {"torch_fr_3": "gloo", "torch_fr_my-backend_3": "my-backend",
                                "torch_fr_nccl2_3": "nccl2"}
    assert [p.name for p in saved] == ["torch_fr_3", "torch_fr_my-backend_3", "torch_fr_nccl2_3"]


def test_a_cuda_build_dumps_the_legacy_nccl_recorder_into_its_own_file(tmp_path: Path) -> None:
    calls = Calls()
    save_torch_dumps(tmp_path, 5, c10d_2_13(calls, cuda=True), Recorders(legacy_nccl=True))
    assert calls == [("_dump_fr_trace", EVERYTHING), ("_dump_nccl_trace", EVERYTHING)]
    assert _saved(tmp_path) == {"torch_fr_5": "gloo", "torch_fr_nccl_5": "nccl"}


def test_a_torch_without_the_backend_keyword_gets_no_backend_call_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reset()
    calls = Calls()
    with caplog.at_level(logging.WARNING, logger="commtag"):
        save_torch_dumps(tmp_path, 0, c10d_2_13(calls), Recorders(hooked=("nccl2",)))
    assert calls == [("_dump_fr_trace", EVERYTHING)]
    assert _saved(tmp_path) == {"torch_fr_0": "gloo"}
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "commtag: saving torch's recorders of nccl2 failed"]
    assert "takes no backend=" in caplog.records[0].getMessage()


def test_a_recorder_that_cannot_be_dumped_is_logged_once_and_the_others_are_saved(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A CUDA-build recorder asked of a CPU build (no _dump_nccl_trace), and a hooked backend whose dump
    raises: the default and the other hooked recorder are still written."""
    reset()
    calls = Calls()
    c10d = c10d_2_15(calls)
    dump = c10d._dump_fr_trace

    def _dump_fr_trace(includeCollectives: Optional[bool] = None, includeStackTraces: Optional[bool] = None,
                       onlyActive: Optional[bool] = None, backend: str = "gloo") -> bytes:
        if backend == "broken":
            raise RuntimeError("no recorder")
        return dump(includeCollectives, includeStackTraces, onlyActive, backend)

    c10d._dump_fr_trace = _dump_fr_trace
    with caplog.at_level(logging.WARNING, logger="commtag"):
        for _ in range(2):
            save_torch_dumps(tmp_path, 1, c10d, Recorders(legacy_nccl=True, hooked=("broken", "nccl2")))
    assert _saved(tmp_path) == {"torch_fr_1": "gloo", "torch_fr_nccl2_1": "nccl2"}
    assert sorted(r.getMessage().split(" (")[0] for r in caplog.records) == [
        "commtag: saving torch's flight-recorder dump torch_fr_broken_<rank> beside commtag's failed",
        "commtag: saving torch's flight-recorder dump torch_fr_nccl_<rank> beside commtag's failed"]


def test_the_backend_keyword_is_read_from_the_running_torchs_own_signature() -> None:
    """The probe reads a pybind11 function's signature from its docstring: torch 2.15's takes backend=,
    2.13's (CI's) does not."""
    import torch
    import torch._C._distributed_c10d as c10d

    hooked = torch.__version__ >= fr.FR_HOOK_RELEASE  # TorchVersion compares as a version, local part aside
    assert parameter_names(c10d._dump_fr_trace) == (("includeCollectives", "includeStackTraces", "onlyActive")
                                                    + (("backend",) if hooked else ()))
    assert parameter_names(c10d_2_15(Calls())._dump_fr_trace)[-1] == "backend"
    assert parameter_names(None) == () and parameter_names(SimpleNamespace(__doc__="Overloaded function.")) == ()


class Group:
    """A process group as the recorders are found from it: its device types and each one's backend name."""

    def __init__(self, **backends: str) -> None:
        self._device_types = [SimpleNamespace(type=device) for device in backends]
        self._backends = backends

    def _get_backend(self, device: Any) -> Any:
        return SimpleNamespace(name=lambda: self._backends[device.type])


def test_the_recorders_in_use_are_read_from_torchs_groups_and_hooks() -> None:
    """torch 2.15's distributed_c10d.py: ``_FR_SELF_RECORDING_BACKENDS`` (lines 2884-2890, with "nccl" added
    where "nccl" builds the legacy ProcessGroupNCCL, lines 973-976) and the hooks parked in
    ``_world.pg_flight_recorder_hooks`` (line 2931) for every group not wholly self-recording."""
    gloo, nccl2, mixed, legacy, lazy = (Group(cpu="gloo"), Group(cuda="nccl2"), Group(cpu="gloo", cuda="nccl2"),
                                        Group(cuda="nccl"), Group(cuda="nccl-lazy"))
    world = SimpleNamespace(pg_map={g: None for g in (gloo, nccl2, mixed, legacy, lazy)},
                            pg_flight_recorder_hooks={nccl2: object(), mixed: object(), lazy: object()})
    torch_2_15 = SimpleNamespace(_world=world, _FR_SELF_RECORDING_BACKENDS={
        "gloo", "nccl-legacy", "xccl", "fake", "undefined", "nccl"})
    assert recorders_in_use(torch_2_15) == Recorders(legacy_nccl=True, hooked=("nccl-lazy", "nccl2"))
    # torch 2.13/2.14: no hooks, so no hooked recorder; the legacy NCCL group is still seen.
    torch_2_13 = SimpleNamespace(_world=SimpleNamespace(pg_map=world.pg_map))
    assert recorders_in_use(torch_2_13) == Recorders(legacy_nccl=True, hooked=())
    assert recorder_prefix("nccl-lazy") == "torch_fr_nccl-lazy_" and recorder_prefix("a/b.c") == "torch_fr_a_b_c_"


def _dump_on_two_groups(rank: int, world_size: int, dump_dir: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import commtag
    from commtag.runtime.record.torchdumps import recorders_in_use

    pair = dist.new_group([0, 1])
    commtag.install(dump_dir=Path(dump_dir))
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(2), group=pair)
    commtag.dump()
    return {"recorders": tuple(recorders_in_use())}


@pytest.mark.slow
def test_a_real_gloo_job_saves_torchs_default_recorder_as_documented(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """gloo records into torch's default recorder alone: its dump is saved as torch_fr_<rank>, nothing else
    of torch's is written, and the summary reads commtag's dumps and names torch's as not read."""
    from gloo_world import run_world

    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert run_world(_dump_on_two_groups, 2, str(tmp_path)) == [{"recorders": (False, ())}] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["commtag_fr_0", "commtag_fr_1", "torch_fr_0", "torch_fr_1"]
    torch_only = tmp_path / "torch_only"
    torch_only.mkdir()
    for rank in range(2):
        shutil.copy(tmp_path / f"torch_fr_{rank}", torch_only)
    torchs = read_dumps(torch_only)
    assert [d.by_commtag for d in torchs] == [False, False]
    assert all(sorted(len(entries) for entries in d.by_group.values()) == [3, 3] for d in torchs)
    assert main(["summary", str(tmp_path), "--format", "json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["flight_recorder_ranks"] == [0, 1] and report["hangs"] == []
    assert [(n["rank"], Path(n["file"]).name, Path(n["read_instead"]).name) for n in report["fr_not_read"]] == [
        (0, "torch_fr_0", "commtag_fr_0"), (1, "torch_fr_1", "commtag_fr_1")]
    assert main(["summary", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "notice: 2 dumps not read (torch_fr_* of ranks 0-1): commtag's dumps of those ranks (commtag_fr_*) are "
        "read, which hold every call commtag saw, whatever the backend (torch's analyzer: fr_trace -p torch_fr_)")


def _entry(group: str, seq: int, backend: str, rank_seq_ns: int) -> dict[str, Any]:
    """An entry as torch's writer lays it out (FlightRecorderDetail.hpp; see commtag.vocab.flight_recorder)."""
    return {"record_id": seq - 1, "pg_id": int(group), "process_group": (group, "default_pg" if group == "0" else
                                                                         "tp"),
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"{backend}:all_reduce",
            "time_created_ns": rank_seq_ns, "input_sizes": [[8]], "output_sizes": [[8]], "input_dtypes": ["Float"],
            "output_dtypes": ["Float"], "state": "scheduled", "retired": True, "is_p2p": False}


def _recorder_dump(folder: Path, name: str, group: str, backend: str, members: list[int], seqs: int) -> None:
    doc = {"version": "2.10", "pg_config": {group: {"name": group, "desc": "", "ranks": str(members)}},
           "pg_status": {}, "entries": [_entry(group, seq, backend, 1000 * seq) for seq in range(1, seqs + 1)]}
    (folder / name).write_bytes(pickle.dumps(doc, protocol=2))


def test_torchs_recorders_alone_are_read_one_prefix_for_the_folder_and_the_rest_named(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """torch's default recorder of ranks 0-2 (the world's group 0 on gloo) and a hooked nccl2 recorder of
    ranks 0, 1 and 3 (group 1, its own Seq): as many ranks have each, so the first prefix in name order,
    the default recorder's, is read for the folder, and no nccl2 dump is mixed in. Rank 3's read with the
    others would make ranks 0 and 1 look missing from group 1, whose entries their dumps read do not hold."""
    for rank in range(3):
        _recorder_dump(tmp_path, f"torch_fr_{rank}", "0", "gloo", [0, 1, 2], 3)
    for rank in (0, 1, 3):
        _recorder_dump(tmp_path, f"torch_fr_nccl2_{rank}", "1", "nccl2", [0, 1, 3], 5 if rank == 3 else 2)
    assert find_dumps(tmp_path) == {rank: tmp_path / f"torch_fr_{rank}" for rank in range(3)}
    assert main(["summary", str(tmp_path), "--format", "json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["flight_recorder_ranks"] == [0, 1, 2] and report["hangs"] == []
    assert [(n["rank"], Path(n["file"]).name, n["read_instead"] and Path(n["read_instead"]).name)
            for n in report["fr_not_read"]] == [(0, "torch_fr_nccl2_0", "torch_fr_0"),
                                                (1, "torch_fr_nccl2_1", "torch_fr_1"), (3, "torch_fr_nccl2_3", None)]
    assert main(["summary", str(tmp_path)]) == 0
    notices = [line for line in capsys.readouterr().out.splitlines() if "not read" in line]
    assert notices == [
        "notice: 2 dumps not read (torch_fr_nccl2_* of ranks 0-1): the torch dumps read are torch_fr_*: each "
        "recorder numbers its own Seq, and two are never mixed (torch's analyzer: fr_trace -p torch_fr_nccl2_)",
        "notice: 1 dump not read (torch_fr_nccl2_* of rank 3): those ranks have none of the prefix read: each "
        "recorder numbers its own Seq, and two are never mixed (torch's analyzer: fr_trace -p torch_fr_nccl2_)"]
    # Where more ranks have the nccl2 recorder's dumps, those are the ones read.
    _recorder_dump(tmp_path, "torch_fr_nccl2_4", "1", "nccl2", [0, 1, 3], 2)
    assert find_dumps(tmp_path) == {rank: tmp_path / f"torch_fr_nccl2_{rank}" for rank in (0, 1, 3, 4)}


_REAL = pytest.importorskip("torch._C._distributed_c10d")
_REAL_HOOKED = "backend" in parameter_names(getattr(_REAL, "_dump_fr_trace", None))
_REAL_NCCL = hasattr(_REAL, "_dump_nccl_trace")


@pytest.mark.skipif(not (_REAL_HOOKED and _REAL_NCCL),
                    reason="the running torch's dumps take no backend= (before 2.15) or it is a CPU build: "
                           "launch/compat.sh runs this on torch 2.15's CUDA build")
def test_the_running_torchs_own_dump_functions_save_each_recorder(tmp_path: Path) -> None:
    """torch's real functions, not stand-ins: the default recorder, the legacy NCCL one and a hooked
    backend's (empty rings: no GPU runs a call here) are each saved under its name and read back."""
    saved = save_torch_dumps(tmp_path, 0, _REAL, Recorders(legacy_nccl=True, hooked=("nccl2",)))
    assert [p.name for p in saved] == ["torch_fr_0", "torch_fr_nccl_0", "torch_fr_nccl2_0"]
    for path in saved:
        dump = read_dump(path, 0)
        assert dump.version == "2.10" and dump.entries == [], path.name

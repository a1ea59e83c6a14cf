"""commtag's own flight recorder on real gloo jobs: a hang in a collective and in a send, each rank's
ring written when its call fails or when it is stopped (SIGTERM while blocked), read by
`commtag summary`; commtag.dump() and SIGUSR1 dump and the job goes on."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import orjson
import pytest

from commtag.cli import main
from commtag.merge.hangs import read_dumps
from pftrace_reader import read

HANG = {"pg": "0", "seq": 4, "collective": "all_reduce", "entered": [0, 1], "missing": [2]}


def _report(capsys: pytest.CaptureFixture, folder: Path) -> dict:
    assert main(["summary", str(folder), "--format", "json"]) == 0
    return orjson.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_a_hung_all_reduce_from_commtags_dumps_and_from_torchs_saved_beside(tmp_path: Path, capsys) -> None:
    from hang_world import run_hang_world

    codes = run_hang_world("commtag_skip_fourth_all_reduce", 3, tmp_path, stop_after_others=True)
    # Ranks 0 and 1 raise gloo's timeout and exit 1; rank 2, blocked, dies by SIGTERM as it would have.
    assert codes == [1, 1, -signal.SIGTERM]
    dumps = tmp_path / "commtag"
    assert sorted(p.name for p in dumps.iterdir()) == [f"{prefix}{r}" for prefix in ("commtag_fr_", "torch_fr_")
                                                         for r in range(3)]
    assert [d.by_commtag for d in read_dumps(dumps)] == [True] * 3
    report = _report(capsys, dumps)
    assert [{k: h[k] for k in HANG} for h in report["hangs"]] == [HANG]
    assert {r: (p["seq"], p["state"], p["error"] is not None) for r, p in report["hangs"][0]["last"].items()} == {
        "0": (4, "started", True), "1": (4, "started", True), "2": (3, "completed", False)}
    assert report["stuck_ranks"] == [2]
    torch_only = tmp_path / "torch_only"
    torch_only.mkdir()
    for rank in range(3):
        shutil.copy(dumps / f"torch_fr_{rank}", torch_only)
    assert [{k: h[k] for k in HANG} for h in _report(capsys, torch_only)["hangs"]] == [HANG]


@pytest.mark.slow
def test_a_pipeline_hung_in_a_send_names_the_stage_that_never_received(tmp_path: Path, capsys) -> None:
    from hang_world import run_hang_world

    assert run_hang_world("pipeline_hangs_in_send", 3, tmp_path, stop_after_others=True)[2] == -signal.SIGTERM
    report = _report(capsys, tmp_path / "commtag")
    hangs = {(h["collective"], h["seq"], tuple(h["entered"]), tuple(h["missing"])) for h in report["hangs"]}
    # Stage 1's 3rd send to stage 2 was never received; stage 0's 4th send then met a stage 1 gone.
    assert ("send 1->2", 3, (1,), (2,)) in hangs
    assert report["stuck_ranks"] == [2]
    assert main(["summary", str(tmp_path / "commtag")]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "stuck: rank 2 never entered its side of send 1->2 p2p Seq 3 of group 0, which rank 1 waits in; "
        "its last call: recv from 1 Seq 2 of group 0, completed")

    # The merge of the dumps alone: every call on its rank's group lane, the hang on rank 2's row.
    output = tmp_path / "hung.pftrace"
    assert main(["merge", str(tmp_path / "commtag"), "-o", str(output)]) == 0
    assert main(["validate", str(output)]) == 0
    parsed = read(output)
    rows = {s.track: [n for n in parsed.name_path(s.track) if n] for s in parsed.slices}  # the root is unnamed
    calls = [s for s in parsed.slices if not s.name.startswith("hang")]
    assert {tuple(rows[s.track]) for s in calls} == {("rank 0", "group 0 (default_pg)"),
                                                     ("rank 1", "group 0 (default_pg)"),
                                                     ("rank 2", "group 0 (default_pg)")}
    failed = [s for s in calls if "error" in s.args]
    assert sorted((rows[s.track][0], s.name) for s in failed) == [("rank 0", "send to 1 #4"), ("rank 1", "send to 2 #3")]
    markers = [s for s in parsed.slices if s.name.startswith("hang")]
    assert sorted((rows[s.track], s.name) for s in markers) == [
        (["rank 1"], "hang: never entered send 0->1 Seq 4 of group 0"),
        (["rank 2"], "hang: never entered send 1->2 Seq 3 of group 0")]


@pytest.mark.slow
def test_dump_and_sigusr1_write_the_bounded_ring_and_the_job_goes_on(tmp_path: Path) -> None:
    from hang_world import run_hang_world

    assert run_hang_world("on_demand_dumps", 2, tmp_path) == [0, 0]
    for rank in range(2):
        seen = json.loads((tmp_path / f"seen_{rank}.json").read_text())
        assert seen["path"] == str(tmp_path / "commtag" / f"commtag_fr_{rank}")
        assert seen["after_dump"] == [1, 2]
        after = seen["after_signal"]  # the ring keeps 4: the newest four calls at the signal
        assert len(after) == 4 and after == list(range(after[0], after[0] + 4)) and after[-1] >= 6
        assert seen["own_handler_calls"] == 1  # the job's own SIGUSR1 handler still ran
        assert seen["result"] == 2.0 ** 8  # every all_reduce ran as without commtag
        assert seen["interrupted"] and seen["reason"] == "signal SIGINT"
        assert seen["ignored_reason"] == "signal SIGINT"  # SIGINT ignored by the job: dumped, and the job went on


def _dump_with_torchs_recorder_as_set(rank: int, world_size: int, dump_dir: str) -> dict[str, object]:
    import os

    import torch
    import torch.distributed as dist

    import commtag

    commtag.install(dump_dir=Path(dump_dir))
    for _ in range(3):
        dist.all_reduce(torch.ones(4))
    commtag.dump()
    return {"variable": os.environ.get("TORCH_FR_BUFFER_SIZE")}


@pytest.mark.slow
@pytest.mark.parametrize("variable", [None, "0"], ids=["unset", "zero"])
def test_torchs_dump_is_saved_beside_whenever_its_recorder_is_on(variable: str | None, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """torch records by default (TORCH_FR_BUFFER_SIZE unset: 2,000 entries), so its dump is saved beside
    commtag's; set to 0 it records nothing, and nothing of torch's is written."""
    from gloo_world import run_world

    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    env = {} if variable is None else {"TORCH_FR_BUFFER_SIZE": variable}
    assert run_world(_dump_with_torchs_recorder_as_set, 2, str(tmp_path), env=env) == [{"variable": variable}] * 2
    names = sorted(p.name for p in tmp_path.iterdir())
    if variable is None:
        assert names == ["commtag_fr_0", "commtag_fr_1", "torch_fr_0", "torch_fr_1"]
        torch_only = tmp_path / "torch_only"
        torch_only.mkdir()
        for rank in range(2):
            shutil.copy(tmp_path / f"torch_fr_{rank}", torch_only)
        torchs = read_dumps(torch_only)
        assert [d.by_commtag for d in torchs] == [False, False] and all(len(d.entries) >= 3 for d in torchs)
    else:
        assert names == ["commtag_fr_0", "commtag_fr_1"]

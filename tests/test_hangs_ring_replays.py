"""commtag's flight recorder keeps CUDA-graph replays: each captured collective a replay runs is kept
as the replay starts, with its capture Seq and the replay's index, so a rank that never entered a
replay is named with both.

No GPU here: two real gloo ranks capture one all_reduce through commtag's own capture hooks
(``hooks.capture_begin_hook``/``capture_end_hook`` over the in-memory graph of
tests/test_capture_bookkeeping.py; gloo runs the call itself) and replay it through ``hooks.replay_hook``,
the entry point that wraps ``CUDAGraph.replay`` on torch before 2.14. Rank 0 replays the graph four
times, rank 1 three times, then each writes its ring (``commtag.dump()``).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from commtag.cli import main
from commtag.merge.hangs.dumps import load_plain_pickle
from commtag.merge.hangs.trace import IN_FLIGHT
from commtag.vocab import flight_recorder as fr
from gloo_world import run_world
from pftrace_reader import read

REPLAYS = {0: 4, 1: 3}
#: The eager all_reduce is Seq 1, the captured one Seq 2 (gloo ran it: gloo's count says 2).
CAPTURE_SEQ = 2


class _Graph:
    """Stands for a torch.cuda.CUDAGraph: the hooks key a capture by the object's identity."""


def _replaying_rank(rank: int, world_size: int, out_dir: str) -> str:
    import torch
    import torch.distributed as dist

    import commtag
    from commtag.runtime import capture
    from commtag.runtime.capture import CaptureTracker
    from commtag.runtime.install import hooks
    from test_capture_bookkeeping import MAIN, FakeGraphAPI

    commtag.install(dump_dir=out_dir)
    api = FakeGraphAPI()
    capture.use_tracker(CaptureTracker(api))
    capture.current_stream = lambda: MAIN  # the in-memory graph's capturing stream
    graph = _Graph()
    dist.all_reduce(torch.ones(4))
    hooks.capture_begin_hook(lambda g: api.begin(MAIN))(graph)
    dist.all_reduce(torch.ones(3))
    hooks.capture_end_hook(lambda g: api.end(MAIN, 0xE1))(graph)
    replay = hooks.replay_hook(lambda g: None)
    for _ in range(REPLAYS[rank]):
        replay(graph)
    path = commtag.dump()
    commtag.uninstall()
    return str(path)


@pytest.mark.slow
def test_a_rank_that_never_entered_a_replay_is_named_with_its_capture_seq_and_replay_index(tmp_path: Path,
                                                                                            capsys) -> None:
    paths = run_world(_replaying_rank, 2, str(tmp_path))
    assert paths == [str(tmp_path / f"commtag_fr_{rank}") for rank in range(2)]

    # Rank 0's ring: the eager call (Seq 1), the captured one (Seq 2), then one entry per replay, each
    # placed after the group's latest Seq and the replays before it, its capture Seq and index beside.
    entries = load_plain_pickle((tmp_path / "commtag_fr_0").read_bytes())[fr.FR_ENTRIES]
    assert [(e[fr.E_SEQ], e.get(fr.CT_CAPTURE_SEQ), e.get(fr.CT_REPLAY), e[fr.E_STATE]) for e in entries] == [
        (1, 1, None, fr.STATE_COMPLETED), (2, 2, None, fr.STATE_COMPLETED),
        *[(CAPTURE_SEQ + 1 + k, CAPTURE_SEQ, k, fr.STATE_SCHEDULED) for k in range(4)]]
    replayed = entries[2:]
    assert {(e[fr.E_PROFILING_NAME], str(e[fr.E_INPUT_SIZES])) for e in replayed} == {("gloo:all_reduce", "[[3]]")}
    assert all(e[fr.E_CREATED_NS] >= entries[1][fr.E_CREATED_NS] for e in replayed)

    assert main(["summary", str(tmp_path), "--format", "json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    (hang,) = report["hangs"]
    assert {k: hang[k] for k in ("pg", "seq", "collective", "capture_seq", "replay", "entered", "missing")} == {
        "pg": "0", "seq": CAPTURE_SEQ + 4, "collective": "all_reduce", "capture_seq": CAPTURE_SEQ, "replay": 3,
        "entered": [0], "missing": [1]}
    assert {r: (p["capture_seq"], p["replay"]) for r, p in hang["last"].items()} == {
        "0": (CAPTURE_SEQ, 3), "1": (CAPTURE_SEQ, 2)}
    assert report["stuck_ranks"] == [1]
    assert main(["summary", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(
        f"stuck: rank 1 never entered all_reduce replay 3 of capture Seq {CAPTURE_SEQ} of group 0, which rank 0 "
        f"waits in; its last call: all_reduce replay 2 of capture Seq {CAPTURE_SEQ} of group 0, in flight")

    # The merge of the dumps: each replayed call on its rank's group lane, drawn in flight to the dump.
    output = tmp_path / "hung.pftrace"
    assert main(["merge", str(tmp_path), "-o", str(output)]) == 0
    assert main(["validate", str(output)]) == 0
    replays = [s for s in read(output).slices if "replay" in s.name]
    assert sorted(s.name for s in replays) == sorted(
        f"all_reduce replay {k} of capture Seq {CAPTURE_SEQ} #{CAPTURE_SEQ + 1 + k}" for r in range(2)
        for k in range(REPLAYS[r]))
    assert {s.args["end"] for s in replays} == {IN_FLIGHT}


def _failing_and_hooked_replays(rank: int, world_size: int, out_dir: str) -> dict:
    """One captured all_reduce, replayed twice: through ``replay_hook`` with a launch that raises, then
    through torch 2.14+'s replay-start and replay-end hooks (commtag's functions torch would call)."""
    import torch
    import torch.distributed as dist

    import commtag
    from commtag.runtime import capture
    from commtag.runtime.capture import CaptureTracker
    from commtag.runtime.install import hooks
    from test_capture_bookkeeping import MAIN, FakeGraphAPI

    commtag.install(dump_dir=out_dir)
    api = FakeGraphAPI()
    capture.use_tracker(CaptureTracker(api))
    capture.current_stream = lambda: MAIN
    graph = _Graph()
    hooks.capture_begin_hook(lambda g: api.begin(MAIN))(graph)
    dist.all_reduce(torch.ones(2))
    hooks.capture_end_hook(lambda g: api.end(MAIN, 0xE1))(graph)

    def launch_fails(g: object) -> None:
        raise RuntimeError("graph launch failed\nsecond line")

    raised = None
    try:
        hooks.replay_hook(launch_fails)(graph)
    except RuntimeError as exc:
        raised = str(exc)
    dump = Path(out_dir) / f"commtag_fr_{rank}"
    after_failure = load_plain_pickle(dump.read_bytes())
    hooks._graph_hooks_live = True  # as torch 2.14+'s hooks registered at install
    try:
        hooks._on_replay_start(graph)
        hooks._on_replay_end(graph)
    finally:
        hooks._graph_hooks_live = False
    commtag.dump()
    after_hooks = load_plain_pickle(dump.read_bytes())
    commtag.uninstall()
    keys = (fr.E_SEQ, fr.CT_CAPTURE_SEQ, fr.CT_REPLAY, fr.E_STATE, fr.CT_ERROR)
    return {"raised": raised, "reason": after_failure[fr.CT_DUMP_REASON],
            "after_failure": [tuple(e.get(k) for k in keys) for e in after_failure[fr.FR_ENTRIES]],
            "after_hooks": [tuple(e.get(k) for k in keys) for e in after_hooks[fr.FR_ENTRIES]]}


@pytest.mark.slow
def test_a_failed_replay_launch_is_dumped_and_torchs_replay_hooks_keep_replays(tmp_path: Path) -> None:
    (seen,) = run_world(_failing_and_hooked_replays, 1, str(tmp_path))
    assert seen["raised"] == "graph launch failed\nsecond line"  # the job's own error, unchanged
    failed = "RuntimeError: graph launch failed"
    assert seen["reason"] == f"exception: {failed}"  # written as the launch failed
    captured = (1, 1, None, fr.STATE_COMPLETED, None)  # the call at capture: Seq 1, kept beside its place
    assert seen["after_failure"] == [captured, (2, 1, 0, fr.STATE_SCHEDULED, failed)]
    assert seen["after_hooks"] == [*seen["after_failure"], (3, 1, 1, fr.STATE_SCHEDULED, None)]

"""The files commtag.trace_handler writes: never over an earlier profile's, named by the steps
they hold, readable by whoever may read the trace.

Two real gloo ranks, the real profiler: two profiles without a schedule
into one directory (one ``with profile()`` per epoch), then scheduled
profiles whose traces are handed over by ``prof.step()`` and by leaving
the ``with`` block, all with the umask the job runs under.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import warnings
from pathlib import Path

import orjson
import pytest

from gloo_world import run_world

pytestmark = pytest.mark.slow

WORLD = 2
UMASK = 0o002
EPOCH_CALLS = (2, 3)


def _write_profiles(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    import commtag

    os.umask(UMASK)
    commtag.install()
    try:
        epochs = Path(out_dir) / "epochs"
        for calls in EPOCH_CALLS:  # no schedule: each trace is handed over at step_num 0
            with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(epochs)):
                for _ in range(calls):
                    dist.all_reduce(torch.ones(4))
        steps = Path(out_dir) / "steps"
        # Handed over by step() at step 4: ProfilerStep#2 and #3.
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                     on_trace_ready=commtag.trace_handler(steps)) as prof:
            for _ in range(5):
                dist.all_reduce(torch.ones(4))
                prof.step()
        # Handed over by stop() in step 4, the third of four active steps: #2 to #4.
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
                     on_trace_ready=commtag.trace_handler(steps)) as prof:
            for step in range(5):
                dist.all_reduce(torch.ones(4))
                if step < 4:
                    prof.step()
        # Every step saves: step() hands over #0 at step 1, then stop() hands over #1 at step 1 too.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "won't be using warmup": meant so here
            every = schedule(wait=0, warmup=0, active=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=every,
                     on_trace_ready=commtag.trace_handler(steps)) as prof:
            dist.all_reduce(torch.ones(4))
            prof.step()
            dist.all_reduce(torch.ones(4))
    finally:
        commtag.uninstall()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profiles")
    run_world(_write_profiles, WORLD, str(out))
    return out


def _profiler_steps(trace: Path) -> list[int]:
    events = orjson.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return sorted(int(m.group(1)) for e in events if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name")))))


def test_profiles_into_one_directory_never_overwrite_and_merge_as_steps_of_the_rank(written: Path) -> None:
    from commtag.merge.engine.shards import analyze
    from merging import merge
    from commtag.sidecarfile import read_sidecar

    epochs = written / "epochs"
    for rank in range(WORLD):
        first = read_sidecar(epochs / f"rank{rank}.step0.commtag.json")
        second = read_sidecar(epochs / f"rank{rank}.step0.2.commtag.json")
        assert (first.trace_file, second.trace_file) == (f"rank{rank}.step0.pt.trace.json.gz",
                                                         f"rank{rank}.step0.2.pt.trace.json.gz")
        assert [len(first.collectives), len(second.collectives)] == list(EPOCH_CALLS)
        assert [rc.annotation.seq for rc in first.collectives + second.collectives] == list(range(1, 6))
    result = merge(epochs)
    assert not result.skipped and not result.notices
    matched = analyze(result.instances).collectives
    assert sorted(m.seq for m in matched) == list(range(1, sum(EPOCH_CALLS) + 1))
    assert all(m.ranks == tuple(range(WORLD)) for m in matched)


def test_files_are_named_by_the_profiler_steps_they_hold(written: Path) -> None:
    steps = written / "steps"
    for rank in range(WORLD):
        traces = sorted(p.name for p in steps.glob(f"rank{rank}.*.pt.trace.json.gz"))
        assert traces == [f"rank{rank}.step{s}.pt.trace.json.gz" for s in ("0", "1", "2-3", "2-4")]
        for name in traces:
            held = _profiler_steps(steps / name)
            label = name.split(".")[1].removeprefix("step")
            first, _, last = label.partition("-")
            assert held == list(range(int(first), int(last or first) + 1)), (name, held)
            assert (steps / name.replace(".pt.trace.json.gz", ".commtag.json")).is_file()


def test_sidecars_get_the_same_mode_as_their_traces(written: Path) -> None:
    sidecars = sorted(written.rglob("rank*.commtag.json"))
    assert sidecars
    for side in sidecars:
        trace = side.with_name(side.name.replace(".commtag.json", ".pt.trace.json.gz"))
        modes = {oct(stat.S_IMODE(p.stat().st_mode)) for p in (side, trace)}
        assert modes == {oct(0o666 & ~UMASK)}, (side.name, modes)

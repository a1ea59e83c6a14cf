"""install()/uninstall() toggled from several threads while a profiled job runs: no false blame.

A rank records only the calls made while commtag is installed, so where the
ranks toggle at different moments one rank has a collective the other has
not. Each rank's sidecar says when commtag was not installed in its window,
and the merge counts those spans as outside the window: the merged real
2-rank gloo job must name no desync, its matched collectives must agree on
what they are (their Seqs agree), and each rank's unwatched time is said.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from gloo_world import run_world

WORLD = 2
CALLS = 150
TOGGLERS = 3


def _body(rank: int, world_size: int, out_dir: str) -> int:
    """Collectives on the main thread while TOGGLERS threads install and uninstall commtag; how many
    it made while profiled."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    t = torch.ones(64)
    gathered = torch.zeros(64 * world_size)
    dist.all_reduce(t)
    stop = threading.Event()

    def toggle(index: int) -> None:
        while not stop.is_set():
            commtag.install()
            time.sleep(0.0005 * (index + 1))
            commtag.uninstall()
            time.sleep(0.0003)

    togglers = [threading.Thread(target=toggle, args=(i,)) for i in range(TOGGLERS)]
    for thread in togglers:
        thread.start()
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        for i in range(CALLS):
            dist.all_reduce(t)
            if i % 5 == 0:
                dist.barrier()
            if i % 7 == 0:
                dist.all_gather_into_tensor(gathered, t)
        stop.set()
        for thread in togglers:
            thread.join()
        commtag.install()
    commtag.uninstall()
    return CALLS + len(range(0, CALLS, 5)) + len(range(0, CALLS, 7))  # the calls made while profiled


def test_more_toggles_than_a_sidecar_holds_join_the_oldest_spans_losing_no_unwatched_time(monkeypatch):
    from commtag.constants import MAX_UNWATCHED_SPANS
    from commtag.runtime.record import recorder

    clock = iter(range(10, 10**9, 10))
    monkeypatch.setattr(recorder, "_now_ns", lambda: next(clock))
    monkeypatch.setattr(recorder, "_off_spans", [])
    monkeypatch.setattr(recorder, "_off_since", None)
    monkeypatch.setattr(recorder, "_resumed_at", None)
    off = []
    for _ in range(3 * MAX_UNWATCHED_SPANS):
        recorder.note_installed(False)
        start = recorder._off_since
        recorder.note_installed(True)  # nothing records: the span ends at the install
        off.append((start, recorder._off_spans[-1][1]))
    recorder.note_installed(False)  # one still open when the window ends
    spans = recorder.unwatched(None, 10**9)
    assert len(spans) <= MAX_UNWATCHED_SPANS and spans == sorted(spans)
    assert all(any(a <= start and end <= b for a, b in spans) for start, end in off)
    assert spans[-1] == (recorder._off_since, 10**9)
    # A window that begins later clips them, and forgets those that ended before it.
    later = off[-5][0]
    assert recorder.unwatched(later, 10**9)[0][0] == later
    assert all(end >= later for _, end in recorder._off_spans)


@pytest.fixture(scope="module")
def toggled(tmp_path_factory) -> tuple[Path, int]:
    out = tmp_path_factory.mktemp("toggled") / "traces"
    calls = run_world(_body, WORLD, str(out))
    return out, calls[0]


@pytest.mark.slow
def test_toggling_leaves_calls_unrecorded_and_says_when(toggled):
    traces, calls = toggled
    for path in sorted(traces.glob("*.commtag.json")):
        sidecar = json.loads(path.read_bytes())
        # The toggling really took calls out of the record, and the sidecar says when.
        assert 0 < len(sidecar["collectives"]) < calls, path.name
        spans = [(u["start_ns"], u["end_ns"]) for u in sidecar["unwatched"]]
        assert spans and spans == sorted(spans) and all(start <= end for start, end in spans), path.name


@pytest.mark.slow
def test_the_merge_blames_no_rank_for_calls_made_while_commtag_was_off(toggled, tmp_path):
    from commtag.merge.analysis.hook import MergeAnalysis
    from merging import matched, merge

    traces, _ = toggled
    result = merge(traces, tmp_path / "merged.pftrace", analysis=MergeAnalysis(), progress=False)
    assert [f.message for f in result.analysis.desyncs] == []
    both = [m for m in matched(result) if len(m.members) == WORLD]
    assert both and all(len({i.collective for i in m.members.values()}) == 1 for m in both)
    said = [n for n in result.notices if "commtag was not installed for" in n]
    assert sorted(n.split(":", 1)[0] for n in said) == ["rank 0", "rank 1"], result.notices

"""``commtag.merge.merge()``: the library call is what ``commtag merge`` does, analysis included.

A library user who calls it with the defaults gets the same file as the
console script, byte for byte (skew, busbw and desync figures on the lane
slices, counters and markers), and bad input as one error type naming the file.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from commtag.merge import MergeFailed, MergeInputError, merge
from commtag.merge.engine import pipeline
from commtag.merge.pftrace.readback import read_trace
from commtag.merge.records import CollectiveInstance, CounterSeries, Coverage, Marker, TraceAnnotations
from commtag.testing import PUBLIC_TRACES
from merging import matched

DLRM = PUBLIC_TRACES / "param-dlrm-8rank"


def _figures(path: Path) -> set[str]:
    """The analysis keys the merged trace carries on its slices."""
    return {key for s in read_trace(path).slices for key in s.args
            if key in ("commtag skew us", "commtag ranks matched")}


@pytest.mark.slow
def test_library_call_writes_what_the_console_script_writes(tmp_path: Path) -> None:
    by_cli = tmp_path / "cli.pftrace"
    done = subprocess.run([sys.executable, "-m", "commtag", "merge", str(DLRM), "-o", str(by_cli), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    result = merge(DLRM, tmp_path / "lib.pftrace", progress=False)

    assert result.output.read_bytes() == by_cli.read_bytes()
    assert result.lead and len(result.ranks) == 8 and result.instances
    assert result.analysis is not None and matched(result)
    assert _figures(result.output) == {"commtag skew us", "commtag ranks matched"}


def test_analysis_false_writes_the_trace_alone(tmp_path: Path) -> None:
    result = merge(DLRM, tmp_path / "bare.pftrace", progress=False, analysis=False)
    assert result.analysis is None and result.instances
    assert _figures(result.output) == set()


def test_a_callers_own_hook_sees_every_instance_and_writes_into_the_trace(tmp_path: Path) -> None:
    """A caller's own analysis hook gets every rank's instances, rank by rank; what it writes into
    their args is on their lane slices, its counter and marker are in the trace, and the
    cross-rank flows are the merge's (those of a merge without analysis)."""
    seen: list[list[int]] = []

    def hook(instances: list[CollectiveInstance], coverage: Coverage) -> TraceAnnotations:
        seen.append([inst.rank for inst in instances])
        for inst in instances:
            inst.args["my figure"] = inst.rank * 10 + 1
        first = instances[0]
        return TraceAnnotations(counters=[CounterSeries(first.rank, "my counter", [(first.start_ns, 1.5)])],
                                markers=[Marker(first.rank, first.start_ns, "my marker", {"why": "mine"})])

    result = merge(DLRM, tmp_path / "hooked.pftrace", progress=False, analysis=hook)
    bare = merge(DLRM, tmp_path / "bare.pftrace", progress=False, analysis=False)
    (ranks,) = seen
    assert ranks == sorted(ranks) and set(ranks) == set(range(8)) and len(ranks) == bare.slices == result.slices
    assert result.analysis is None
    assert result.instances and all(inst.args["my figure"] == inst.rank * 10 + 1 for inst in result.instances)
    hooked, alone = read_trace(result.output), read_trace(bare.output)
    assert [s.name for s in hooked.slices if s.name == "my marker" and s.args.get("why") == "mine"] == ["my marker"]
    assert "my counter" in {t.name for t in hooked.tracks.values()}
    assert sorted(f for s in hooked.slices for f in s.flows_out) == sorted(f for s in alone.slices for f in s.flows_out)
    assert any(s.flows_out for s in hooked.slices)


def test_the_collector_is_paused_for_the_whole_merge_and_left_as_the_caller_had_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge makes millions of objects and no cycles: from its plan (its first step) to the analysis
    (a caller's hook, after every rank is read) no collection runs, not even between ranks; afterwards
    the collector is as the caller left it."""
    collections: list[int] = []
    started: list[int] = []  # the collections counted when each merge made its plan
    between: list[int] = []  # the collections from then until its hook ran
    real_plan = pipeline.make_plan

    def make_plan(*args, **kwargs):
        started.append(len(collections))
        return real_plan(*args, **kwargs)

    def hook(instances: list[CollectiveInstance], coverage: Coverage) -> TraceAnnotations:
        between.append(len(collections) - started[-1])
        return TraceAnnotations()

    def counted(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    monkeypatch.setattr(pipeline, "make_plan", make_plan)
    was = gc.isenabled()
    gc.callbacks.append(counted)
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            merge(DLRM, tmp_path / f"{enabled}.pftrace", progress=False, analysis=hook)
            assert gc.isenabled() is enabled
    finally:
        gc.callbacks.remove(counted)
        gc.enable() if was else gc.disable()
    assert between == [0, 0]


def test_bad_input_raises_one_error_naming_the_file_and_writes_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-traces"
    with pytest.raises(MergeFailed) as failed:
        merge(missing, tmp_path / "out.pftrace", progress=False)
    assert isinstance(failed.value, MergeInputError)
    assert [str(e) for e in failed.value.errors] == [f"{missing}: no such file or directory"]
    assert list(tmp_path.iterdir()) == []


def test_each_option_is_said_once_in_merge_options() -> None:
    # The facade takes MergeOptions' fields as keywords rather than listing them again.
    import inspect
    from dataclasses import fields

    from commtag.merge import MergeOptions

    listed = set(inspect.signature(merge).parameters)
    assert listed.isdisjoint(f.name for f in fields(MergeOptions)), listed
    assert MergeOptions(json_dir="annotated").json_dir == Path("annotated")  # type: ignore[arg-type]


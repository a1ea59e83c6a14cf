"""The cause rules (docs/analysis.md) on instances whose times are set, each rule at its edge:
launch skew, which a real CPU-only gloo job cannot make (its works start as their calls do), and
what makes an instance inconclusive."""

from __future__ import annotations

from commtag.merge.engine.shards import analyze
from commtag.merge.records import CPU_OP_SOURCE, Coverage
from test_analyze import inst


def _cause(members, coverage=None) -> str:
    (m,) = analyze(members, coverage=coverage).collectives
    return m.cause


def _timed(starts_us, dur_us, launches_us=None, **kw):
    return [inst(r, 1, start_us=s, dur_us=d, args=None if launches_us is None else {"commtag launch us": launches_us[r]},
                 **kw) for r, (s, d) in enumerate(zip(starts_us, dur_us))]


def test_late_kernels_after_calls_that_came_together_are_launch_skew() -> None:
    # Every call at 0 us; rank 3's work started 600 us after its call, the others' at once.
    members = _timed([0, 0, 0, 600], [1000, 1000, 1000, 400], launches_us=[0, 0, 0, 600])
    assert _cause(members) == "launch skew"
    # The same times with rank 3's call itself 600 us late: arrival skew.
    assert _cause(_timed([0, 0, 0, 600], [1000, 1000, 1000, 400], launches_us=[0, 0, 0, 0])) == "arrival skew"
    # Calls not known on every rank: the late start is taken for a late arrival.
    assert _cause(_timed([0, 0, 0, 600], [1000, 1000, 1000, 400])) == "arrival skew"


def test_transfer_mixed_and_the_half_span_edges() -> None:
    assert _cause(_timed([0, 0, 0, 100], [1000, 1000, 1000, 900])) == "transfer"
    # Skew 300, transfer 300 of a 600 us span: both reach half: the skew is taken first.
    assert _cause(_timed([0, 0, 0, 300], [600, 600, 600, 300])) == "arrival skew"
    # Skew 250 and transfer 250 of a 600 us span (a member ran on after the last arrival's end): mixed.
    assert _cause(_timed([0, 0, 0, 250], [600, 300, 300, 250])) == "mixed"


def test_what_the_data_cannot_tell_is_inconclusive() -> None:
    # A member missing (rank 3 has no trace of it, its windows cover nothing).
    missing = _timed([0, 0, 100], [1000, 1000, 900])
    assert _cause(missing, Coverage.unknown_windows([0, 1, 2], world_size=4)) == "inconclusive"
    # Timed by the CPU op (no kernel, no work).
    cpu = _timed([0, 0, 0, 600], [1000, 1000, 1000, 400])
    for m in cpu:
        m.source = CPU_OP_SOURCE
    assert _cause(cpu) == "inconclusive"
    # One rank alone.
    assert _cause(_timed([0], [1000], ranks=(0,))) == "inconclusive"

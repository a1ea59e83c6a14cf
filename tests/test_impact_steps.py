"""Each profiler step's part of a late rank's cost, on hand-built instances, figures worked by hand;
the step spans' form on the merged trace's window markers."""

from __future__ import annotations

import pytest

from commtag.merge.engine.shards import analyze
from commtag.merge.records import Coverage
from commtag.merge.steps import StepIndex, decode, encode, step_spans
from commtag.report.sections import impact_csv, impact_lines
from commtag.vocab import ANN_WINDOW_STEPS
from merging import annotations_of
from test_impact_rules import MS, T0, _three_steps, inst


def _steps(*bounds_ms: tuple[int, float, float]) -> list[tuple[int, int, int]]:
    return [(n, T0 + int(start * MS), T0 + int(end * MS)) for n, start, end in bounds_ms]


#: ProfilerStep#5 holds the first all_reduce (0-1 ms), #6 the late one (2-8 ms), #7 the last (9-10 ms).
STEPS = _steps((5, 0, 1.5), (6, 1.5, 8.5), (7, 8.5, 10))
WINDOW = [(T0, T0 + 10 * MS)]


def test_the_late_step_costs_the_lead_and_the_steps_after_it_nothing():
    coverage = Coverage({r: WINDOW for r in range(3)}, 3, {r: STEPS for r in range(3)})
    result = analyze(_three_steps(7, 2), coverage=coverage).impact
    (row,) = result.ranks
    # The window ends 5 ms earlier; the third all_reduce's 5 ms are the second step's, carried on.
    assert row.cost_us == 5000.0 and result.outside_steps == 0
    assert [(s.window, s.step, s.cost_us) for s in row.steps] == [(1, 5, 0.0), (1, 6, 5000.0), (1, 7, 0.0)]
    # The late step's collective time: its first arrival (2 ms) to its end (8 ms).
    assert row.steps[1].share == pytest.approx(5 / 6)
    assert row.to_dict()["steps"][1] == {"window": 1, "step": 6, "cost_us": 5000.0, "share": round(5 / 6, 6)}


def test_a_collective_takes_the_step_of_its_first_arrival_on_the_first_rank_whose_steps_are_known():
    # Rank 0 (first to arrive everywhere) has no steps; ranks 1 and 2 say the first two all_reduces
    # are step 5's and the last step 6's.
    theirs = _steps((5, 0, 8.5), (6, 8.5, 10))
    coverage = Coverage({r: WINDOW for r in range(3)}, 3, {1: theirs, 2: theirs})
    (row,) = analyze(_three_steps(7, 2), coverage=coverage).impact.ranks
    assert [(s.step, s.cost_us) for s in row.steps] == [(5, 5000.0), (6, 0.0)]


def test_a_lead_longer_than_the_time_before_the_arrival_is_cut_to_that_time_and_no_later_step_pays_the_rest():
    # Step 6 holds two all_reduces. Rank 1 arrives 2 ms late to the first (4 ms against 2) and its
    # own work there runs to 7 ms (the others' end at 5); it starts the second at 8 ms, 2.5 ms after
    # the others (5.5), but only 1 ms after its own previous work ended. Without its lateness it
    # arrives at the first at 2 ms, ends it at 5, and starts the second at 5: no earlier than its own
    # previous end. Step 6 then ends 3 ms sooner (at 6, not 9), and step 7 (10-11 ms), where nobody
    # was late, costs nothing; cutting the whole 2.5 ms there would have charged step 7 0.5 ms.
    instances = [inst(r, 1, 0, 1) for r in range(3)]
    instances += [inst(0, 2, 2, 5), inst(1, 2, 4, 7), inst(2, 2, 2, 5)]
    instances += [inst(0, 3, 5.5, 9), inst(1, 3, 8, 9), inst(2, 3, 5.5, 9)]
    instances += [inst(r, 4, 10, 11) for r in range(3)]
    steps = _steps((5, 0, 1.5), (6, 1.5, 9.5), (7, 9.5, 11))
    coverage = Coverage({r: [(T0, T0 + 11 * MS)] for r in range(3)}, 3, {r: steps for r in range(3)})
    (row,) = analyze(instances, coverage=coverage).impact.ranks
    assert (row.rank, row.late_us, row.late_count) == (1, 4500.0, 2)  # its leads, as recorded
    assert row.cost_us == 3000.0
    assert [(s.step, s.cost_us) for s in row.steps] == [(5, 0.0), (6, 3000.0), (7, 0.0)]


def test_a_collective_in_no_step_is_counted_and_in_no_step_s_cost():
    # The first all_reduce (0-1 ms) starts before the first step; the last step reaches to the
    # window's end.
    coverage = Coverage({r: WINDOW for r in range(3)}, 3, {r: STEPS[1:] for r in range(3)})
    analysis = analyze(_three_steps(7, 2), coverage=coverage)
    assert analysis.impact.outside_steps == 1
    assert [(s.step, s.cost_us) for s in analysis.impact.ranks[0].steps] == [(6, 5000.0), (7, 0.0)]
    assert "  1 collectives lie in no ProfilerStep: in their window's cost, in no step's" in impact_lines(analysis)


def test_without_steps_there_are_no_step_figures():
    result = analyze(_three_steps(7, 2), coverage=Coverage({r: WINDOW for r in range(3)}, 3)).impact
    assert result.ranks[0].steps == [] and result.outside_steps == 0


def test_steps_of_two_windows_are_costed_apart():
    # Two files per rank: steps 1-2 in the first window, 1-2 again (a new profile) in the second.
    # Rank 1 is 3 ms late in the second window's step 2 only.
    first = [inst(r, 1, 0, 1) for r in range(3)] + [inst(r, 2, 2, 3) for r in range(3)]
    second = [inst(r, 3, 20, 21) for r in range(3)]
    second += [inst(r, 4, 25 if r == 1 else 22, 26) for r in range(3)]
    windows = [(T0, T0 + 4 * MS), (T0 + 20 * MS, T0 + 27 * MS)]
    steps = _steps((1, 0, 1.5), (2, 1.5, 4), (1, 20, 21.5), (2, 21.5, 27))
    coverage = Coverage({r: windows for r in range(3)}, 3, {r: steps for r in range(3)})
    (row,) = analyze(first + second, coverage=coverage).impact.ranks
    assert [(s.window, s.step, s.cost_us) for s in row.steps] == [
        (1, 1, 0.0), (1, 2, 0.0), (2, 1, 0.0), (2, 2, 3000.0)]
    text = impact_lines(analyze(first + second, coverage=coverage))
    assert "    by step: w2 step 2 3.00 ms (75%); the other 3 steps 0.00 ms each" in text
    rows = impact_csv(analyze(first + second, coverage=coverage)).splitlines()
    assert rows[0].endswith(",part_cost_us,step,part_share")
    # the whole: 3 ms of the profiled 3 + 6 ms; the step: 3 ms of its 22-26 ms
    assert rows[-1] == "1,3000.0,0.333333,3000.0,1,,2,3000.0,2,0.75"


def test_the_window_marker_carries_its_steps_and_they_read_back():
    coverage = Coverage({r: WINDOW for r in range(3)}, 3, {r: STEPS for r in range(3)})
    markers = annotations_of(_three_steps(7, 2), coverage).markers
    (text, *_) = [m.args[ANN_WINDOW_STEPS] for m in markers if ANN_WINDOW_STEPS in m.args]
    assert text == "5@0+1500000 6@1500000+7000000 7@8500000+1500000"
    assert decode(text, T0) == STEPS
    assert decode(encode(STEPS, T0 + 7), T0 + 7) == STEPS
    for bad in ("5@0", "x@0+1", "5@0+-1", 5, None):
        assert decode(bad, T0) is None


def test_step_names_and_the_step_a_time_lies_in():
    found = [("ProfilerStep#12", 30, 40), ("ProfilerStep#11", 10, 20), ("ProfilerStep#x", 50, 60),
             ("ProfilerStep#\u00b2", 70, 80)]
    spans = step_spans(found)
    assert spans == [(11, 10, 20), (12, 30, 40)]
    times = (9, 10, 20, 25, 30, 40, 41, 100, 101)
    # Windows unknown: each step is its own span.
    assert [StepIndex(spans).at(t) for t in times] == [
        None, spans[0], spans[0], None, spans[1], spans[1], None, None, None]
    # In one window a step reaches to the next one's start, the last to the window's end ...
    assert [StepIndex(spans, [(5, 100)]).at(t) for t in times] == [
        None, spans[0], spans[0], spans[0], spans[1], spans[1], spans[1], spans[1], None]
    # ... and never into another window.
    assert [StepIndex(spans, [(5, 22), (28, 45)]).at(t) for t in times] == [
        None, spans[0], spans[0], None, spans[1], spans[1], spans[1], None, None]

"""Each step's cost drawn (``summary --plot``) and on the merged trace's per-step track: the values
handed to the plotting layer and to the trace writer are the impact entries' own, on hand-built
instances whose figures test_impact_steps.py works by hand."""

from __future__ import annotations

import math

import pytest

from commtag.merge.engine.shards import analyze
from commtag.merge.analysis.impact import Impact, RankImpact, StepCost
from commtag.merge.records import Coverage
from commtag.report import stepplot
from commtag.report.tables import plot
from merging import annotations_of
from test_impact_rules import MS, T0, _three_steps, inst
from test_impact_steps import STEPS, WINDOW, _steps

pytest.importorskip("matplotlib")

_TRACK = "impact per step: what rank 1's lateness cost the step (ms)"


def _late_step_coverage() -> Coverage:
    return Coverage({r: WINDOW for r in range(3)}, 3, {r: STEPS for r in range(3)})


def _late_step_analysis():
    """Rank 1 is 5 ms late in step 6 of three steps (5: 0-1 ms, 6: 2-8 ms, 7: 9-10 ms)."""
    return analyze(_three_steps(7, 2), coverage=_late_step_coverage())


def test_the_trace_s_step_track_holds_each_step_s_cost_over_its_time():
    series = {c.track: c for c in annotations_of(_three_steps(7, 2), _late_step_coverage()).counters}
    step_track = series[_TRACK]
    assert (step_track.rank, step_track.unit) == (1, "ms")
    # 0 from step 5's first arrival, 5 ms over step 6 (2 ms on), 0 over step 7 and after the window's last end.
    assert step_track.points == [(T0, 0.0), (T0 + 2 * MS, 5.0), (T0 + 9 * MS, 0.0), (T0 + 10 * MS, 0.0)]
    assert "impact: without rank 1's lateness, ends earlier by (ms)" in series  # the window's track stays


def test_the_step_track_falls_to_zero_at_each_window_s_end():
    first = [inst(r, 1, 0, 1) for r in range(3)] + [inst(r, 2, 3 if r == 1 else 2, 4) for r in range(3)]
    second = [inst(r, 3, 20, 21) for r in range(3)] + [inst(r, 4, 25 if r == 1 else 22, 26) for r in range(3)]
    windows = [(T0, T0 + 4 * MS), (T0 + 20 * MS, T0 + 27 * MS)]
    steps = _steps((1, 0, 1.5), (2, 1.5, 4), (1, 20, 21.5), (2, 21.5, 27))
    coverage = Coverage({r: windows for r in range(3)}, 3, {r: steps for r in range(3)})
    analysis = analyze(first + second, coverage=coverage)
    (row,) = analysis.impact.ranks
    assert [(s.window, s.step, s.cost_us) for s in row.steps] == [(1, 1, 0.0), (1, 2, 1000.0), (2, 1, 0.0),
                                                                 (2, 2, 3000.0)]
    (track,) = [c for c in annotations_of(first + second, coverage).counters if c.track == _TRACK]
    assert track.points == [(T0, 0.0), (T0 + 2 * MS, 1.0), (T0 + 4 * MS, 0.0),
                            (T0 + 20 * MS, 0.0), (T0 + 22 * MS, 3.0), (T0 + 26 * MS, 0.0)]


def test_without_steps_there_is_no_step_track_and_no_step_panel():
    coverage = Coverage({r: WINDOW for r in range(3)}, 3)
    analysis = analyze(_three_steps(7, 2), coverage=coverage)
    assert not [c for c in annotations_of(_three_steps(7, 2), coverage).counters if c.track.startswith("impact per step")]
    assert stepplot.step_bars(analysis.impact) is None


def test_the_plot_draws_each_step_s_cost_from_the_impact_entries(tmp_path, monkeypatch):
    analysis = _late_step_analysis()
    handed = []
    draw = stepplot.draw_steps

    def spy(ax, bars):
        handed.append((ax, bars))
        draw(ax, bars)

    monkeypatch.setattr(stepplot, "draw_steps", spy)
    png = tmp_path / "plot.png"
    plot(analysis, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ((ax, bars),) = handed
    (row,) = analysis.impact.ranks
    assert bars.ranks == [1] and bars.steps == [(s.window, s.step) for s in row.steps] == [(1, 5), (1, 6), (1, 7)]
    assert bars.costs_ms == [[s.cost_us / 1000 for s in row.steps]] == [[0.0, 5.0, 0.0]]
    assert [p.get_height() for p in ax.patches] == [0.0, 5.0, 0.0]
    assert bars.labels() == ["5", "6", "7"] and "drawn:" not in ax.get_title()


def _many(ranks: int, steps: int) -> Impact:
    """``ranks`` late ranks over ``steps`` steps of one window: rank k costs step n ``k * n`` us, and
    rank 0 costs step 2 most of all (a negative cost, as a step that gave time back)."""
    rows = []
    for k in range(ranks, 0, -1):
        costs = [StepCost(1, n, float(k * n), 0.0) for n in range(steps)]
        if k == ranks:
            costs[2] = StepCost(1, 2, -10_000.0, 0.0)
        rows.append(RankImpact(k, k * 1e6, 0.1, 1.0, 1, steps=costs))  # the impact list: costliest first
    return Impact(rows)


def test_many_ranks_and_steps_draw_the_costliest_and_say_what_was_left_out():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = _many(6, 30)
    bars = stepplot.step_bars(result)
    assert bars.ranks == [6, 5, 4, 3] == [r.rank for r in result.ranks[:stepplot.MAX_RANKS]]
    # The 24 costliest steps by the largest magnitude of a drawn rank: steps 6-29, and step 2 (-10 ms).
    assert stepplot.MAX_STEPS == 24 and bars.steps == [(1, 2), *[(1, n) for n in range(7, 30)]]
    assert (bars.ranks_left_out, bars.steps_left_out) == (2, 6)
    for rank, costs in zip(bars.ranks, bars.costs_ms):
        (row,) = [r for r in result.ranks if r.rank == rank]
        assert costs == [next(s.cost_us for s in row.steps if (s.window, s.step) == key) / 1000 for key in bars.steps]
    assert bars.costs_ms[0][0] == -10.0
    fig, ax = plt.subplots()
    stepplot.draw_steps(ax, bars)
    assert [p.get_height() for p in ax.patches] == [c for costs in bars.costs_ms for c in costs]
    assert "the costliest 4 of 6 late ranks; the costliest 24 of 30 steps" in ax.get_title()
    plt.close(fig)


def test_a_step_a_rank_has_no_figure_for_is_drawn_as_none():
    result = _many(2, 3)
    result.ranks[1].steps = result.ranks[1].steps[:2]
    bars = stepplot.step_bars(result)
    assert bars.steps == [(1, 0), (1, 1), (1, 2)] and bars.steps_left_out == 0
    assert math.isnan(bars.costs_ms[1][2]) and bars.costs_ms[0][2] == -10.0

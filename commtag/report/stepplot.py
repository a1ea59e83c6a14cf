"""The plot's per-step impact: what the costliest late ranks cost each profiler step.

:func:`step_bars` picks what to draw from :class:`~commtag.merge.analysis.impact.Impact` (each
rank's ``steps``), :func:`draw_steps` draws exactly that; nothing here computes a cost. A job of
hundreds of steps and ranks would draw an unreadable comb, so only the costliest ranks and steps
are drawn, and the panel's title says how many were left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from commtag.merge.analysis.impact import Impact

#: Ranks drawn per step (the costliest late ranks, as the impact list orders them).
MAX_RANKS = 4
#: Steps drawn (those with the largest cost of any drawn rank, shown in window and step order).
MAX_STEPS = 24


@dataclass(frozen=True, slots=True)
class StepBars:
    """What the per-step panel draws: one bar per drawn rank and step."""

    #: (window, step) of each drawn step, in window and step order.
    steps: list[tuple[int, int]]
    #: The drawn ranks, costliest first.
    ranks: list[int]
    #: Per drawn rank (as ``ranks``), its cost of each drawn step (ms; nan: no figure for it).
    costs_ms: list[list[float]]
    ranks_left_out: int
    steps_left_out: int

    def labels(self) -> list[str]:
        """Step labels: ``5``, or ``w2 5`` where the steps come from several profiled windows."""
        several = len({w for w, _ in self.steps}) > 1
        return [f"w{w} {n}" if several else str(n) for w, n in self.steps]

    def title(self) -> str:
        cut = []
        if self.ranks_left_out:
            cut.append(f"the costliest {len(self.ranks)} of {len(self.ranks) + self.ranks_left_out} late ranks")
        if self.steps_left_out:
            cut.append(f"the costliest {len(self.steps)} of {len(self.steps) + self.steps_left_out} steps")
        shown = f" (drawn: {'; '.join(cut)})" if cut else ""
        return f"impact per ProfilerStep: the time each rank's lateness added to the step{shown}"


def step_bars(result: Impact) -> Optional[StepBars]:
    """The per-step panel's data (None where no rank with a cost has step figures)."""
    rows = [r for r in result.ranks if r.cost_us > 0 and r.steps]
    if not rows:
        return None
    drawn = rows[:MAX_RANKS]
    costs = [{(s.window, s.step): s.cost_us / 1000 for s in r.steps} for r in drawn]
    keys = sorted({key for c in costs for key in c})
    if len(keys) > MAX_STEPS:
        weight = {key: max(abs(c.get(key, 0.0)) for c in costs) for key in keys}
        kept = set(sorted(keys, key=lambda key: (-weight[key], key))[:MAX_STEPS])
        keys = [key for key in keys if key in kept]
    steps_in_all = len({(s.window, s.step) for r in drawn for s in r.steps})
    return StepBars(keys, [r.rank for r in drawn], [[c.get(key, math.nan) for key in keys] for c in costs],
                    len(rows) - len(drawn), steps_in_all - len(keys))


def draw_steps(ax, bars: StepBars) -> None:
    """Grouped bars: per step, one bar per drawn rank (a negative bar: the step gave back time)."""
    import matplotlib

    colours = matplotlib.colormaps["Dark2"]
    width = 0.8 / len(bars.ranks)
    for i, (rank, costs) in enumerate(zip(bars.ranks, bars.costs_ms)):
        offset = (i - (len(bars.ranks) - 1) / 2) * width
        ax.bar([x + offset for x in range(len(bars.steps))], costs, width, color=colours(i % 8),
               label=f"rank {rank}")
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(bars.steps)), bars.labels(), fontsize=7, rotation=60 if len(bars.steps) > 12 else 0)
    ax.set_xlabel("ProfilerStep")
    ax.set_ylabel("step cost (ms)")
    ax.set_title(bars.title(), fontsize=9)
    ax.legend(fontsize=7)


def impact_axes(fig, cell, bars: Optional[StepBars]):
    """The impact panel's axes in the grid cell ``cell``; where there are step figures, the cell is
    split and its lower part draws them."""
    if bars is None:
        return fig.add_subplot(cell)
    inner = cell.subgridspec(2, 1, height_ratios=(1, 1.2))
    draw_steps(fig.add_subplot(inner[1]), bars)
    return fig.add_subplot(inner[0])

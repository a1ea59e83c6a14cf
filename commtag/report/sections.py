"""The summary's impact and all-to-all sections: text, CSV tables and the plot's extra row.

Formats :attr:`Analysis.impact` (:mod:`commtag.merge.analysis.impact`) and
:attr:`Analysis.all_to_all` (:mod:`commtag.merge.analysis.alltoall`); computes nothing.
"""

from __future__ import annotations

import csv
import io

from commtag.merge.analysis.alltoall import by_group
from commtag.merge.analysis.impact import RankImpact
from commtag.merge.analysis.results import Analysis


_IMPACT_COLUMNS = ("rank", "cost_us", "share", "late_us", "late_count", "op", "window", "part_cost_us", "step",
                   "part_share")
#: Steps the text names per rank, its costliest first; the others are summed up in one clause.
_STEPS_SHOWN = 6
_TRAFFIC_COLUMNS = ("pg", "lane", "seq", "replay", "collective", "dtype", "size_imbalance", "sender", "receiver",
                    "elements", "not_recorded")


def impact_lines(analysis: Analysis) -> list[str]:
    """What each late rank cost the profiled windows, largest first ([] when no rank was late)."""
    result = analysis.impact
    rows = [r for r in result.ranks if r.late_count]
    if not rows:
        return []
    lines = ["", f"impact: how much earlier the profiled windows ({result.profiled_us / 1000:.1f} ms) would have "
                 "ended without one rank's lateness (what-if replay):"]
    for r in rows:
        ops = ", ".join(f"{op} {cost / 1000:.2f} ms" for op, cost in sorted(r.by_op.items(), key=lambda kv: -kv[1]))
        windows = ", ".join(f"{w}: {cost / 1000:.2f} ms" for w, cost in r.by_window.items())
        lines.append(f"  rank {r.rank}: {r.cost_us / 1000:.2f} ms ({r.share:.1%} of the profiled time), "
                     f"late {r.late_count}x by {r.late_us / 1000:.2f} ms in all; by op: {ops}"
                     + (f"; by profiled window: {windows}" if len(r.by_window) > 1 else ""))
        if r.steps:
            lines.append(f"    by step: {_steps_clause(r, len(r.by_window) > 1)}")
    if result.not_replayed:
        lines.append(f"  ... and {result.not_replayed} more late ranks, not replayed (the largest leads were)")
    if result.outside_steps:
        lines.append(f"  {result.outside_steps} collectives lie in no ProfilerStep: in their window's cost, "
                     "in no step's")
    return lines


def _steps_clause(row: RankImpact, windows: bool) -> str:
    """The costliest steps of a rank (``w2 step 5`` where it has several windows), then the rest in one."""
    ranked = sorted(row.steps, key=lambda s: -s.cost_us)
    shown = [s for s in ranked[:_STEPS_SHOWN] if s.cost_us > 0] or ranked[:1]
    named = ", ".join(f"{f'w{s.window} ' if windows else ''}step {s.step} {s.cost_us / 1000:.2f} ms ({s.share:.0%})"
                      for s in shown)
    rest = [s for s in row.steps if s not in shown]
    if not rest:
        return named
    low, high = min(s.cost_us for s in rest), max(s.cost_us for s in rest)
    if len(rest) == 1:
        return f"{named}; the other step {low / 1000:.2f} ms"
    spread = f"{high / 1000:.2f} ms each" if low == high else f"{low / 1000:.2f} to {high / 1000:.2f} ms"
    return f"{named}; the other {len(rest)} steps {spread}"


def traffic_lines(analysis: Analysis) -> list[str]:
    """Per group: all-to-all instances, the worst and the median size imbalance."""
    groups = by_group(analysis.all_to_all)
    if not groups:
        return []
    lines = ["", "all-to-all traffic (size imbalance: busiest sender's bytes / the mean sender's):"]
    for g in groups:
        name = g.lane_name or g.pg_uid
        if g.worst is None:
            reason = next(a.not_recorded for a in analysis.all_to_all if a.pg_uid == g.pg_uid and a.not_recorded)
            lines.append(f"  {name}: {g.count} instances, split sizes not recorded ({reason})")
            continue
        unknown = f", {g.count - g.recorded} not recorded" if g.recorded < g.count else ""
        worst, matrix = g.worst, g.worst.matrix
        assert matrix is not None, "the worst instance has an imbalance, so a matrix"
        busiest = worst.ranks[max(range(len(worst.ranks)), key=lambda i: sum(matrix[i]))]
        lines.append(f"  {name}: {g.count} instances{unknown}; imbalance p50 {g.p50_imbalance:.2f}, "
                     f"worst {worst.size_imbalance:.2f} ({worst.collective} Seq {worst.seq}, rank {busiest} "
                     "sends most)")
    return lines


def impact_csv(analysis: Analysis) -> str:
    """One row per late rank (``op`` and ``window`` empty: its whole cost), then one per op it was
    late to, per profiled window and per step (``part_cost_us``: that part's cost; ``part_share``:
    a step's share of its own time)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_IMPACT_COLUMNS)
    for r in analysis.impact.ranks:
        head = (r.rank, r.cost_us, r.share, r.late_us, r.late_count)
        writer.writerow((*head, "", "", "", "", ""))
        for op, cost in sorted(r.by_op.items()):
            writer.writerow((*head, op, "", cost, "", ""))
        for window, cost in r.by_window.items():
            writer.writerow((*head, "", window, cost, "", ""))
        for step in r.steps:
            writer.writerow((*head, "", step.window, step.cost_us, step.step, step.share))
    return buffer.getvalue()


def traffic_csv(analysis: Analysis) -> str:
    """One row per all-to-all instance and rank pair; one row saying why where not recorded."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_TRAFFIC_COLUMNS)
    for a in analysis.all_to_all:
        head = (a.pg_uid, a.lane_name, a.seq, "" if a.replay is None else a.replay, a.collective, a.dtype,
                "" if a.size_imbalance is None else a.size_imbalance)
        if a.matrix is None:
            writer.writerow((*head, "", "", "", a.not_recorded))
            continue
        for i, row in enumerate(a.matrix):
            for j, elements in enumerate(row):
                writer.writerow((*head, a.ranks[i], a.ranks[j], elements, ""))
    return buffer.getvalue()


def has_plot_row(analysis: Analysis) -> bool:
    """Whether the figure gets the impact / all-to-all row."""
    return any(r.cost_us > 0 for r in analysis.impact.ranks) or any(a.matrix is not None for a in analysis.all_to_all)


def plot_row(ax_impact, ax_heat, analysis: Analysis) -> None:
    """Left: each late rank's cost, split by op; right: the worst all-to-all's rank-pair heatmap."""
    import numpy as np

    rows = [r for r in analysis.impact.ranks if r.cost_us > 0]
    ax_impact.barh(range(len(rows)), [r.cost_us / 1000 for r in rows], color="#d95f02")
    ax_impact.set_yticks(range(len(rows)), [f"rank {r.rank}" for r in rows])
    ax_impact.invert_yaxis()
    for i, r in enumerate(rows):
        ops = ", ".join(f"{op} {cost / 1000:.1f}" for op, cost in sorted(r.by_op.items(), key=lambda kv: -kv[1]))
        ax_impact.text(0, i, f" {r.share:.1%} of the profiled time; {ops}", va="center", fontsize=7)
    ax_impact.set_xlabel("profiled windows end earlier without the rank's lateness (ms)")
    ax_impact.set_title("impact: what each late rank cost (what-if replay)", fontsize=10)
    known = [a for a in analysis.all_to_all if a.matrix is not None]
    if not known:
        recorded = "no all-to-all" if not analysis.all_to_all else "all-to-all split sizes not recorded"
        ax_heat.text(0.5, 0.5, recorded, ha="center", va="center", transform=ax_heat.transAxes)
        ax_heat.set_axis_off()
        return
    worst = max(known, key=lambda a: (a.size_imbalance or 0, -a.seq))
    image = ax_heat.imshow(np.array(worst.matrix, dtype=float), cmap="viridis", interpolation="nearest")
    ax_heat.figure.colorbar(image, ax=ax_heat, label="elements sent", pad=0.01)
    ticks = range(len(worst.ranks))
    ax_heat.set_xticks(ticks, [str(r) for r in worst.ranks], fontsize=7)
    ax_heat.set_yticks(ticks, [str(r) for r in worst.ranks], fontsize=7)
    ax_heat.set_xlabel("receiver (rank)")
    ax_heat.set_ylabel("sender (rank)")
    imbalance = f"{worst.size_imbalance:.2f}" if worst.size_imbalance is not None else "-"
    ax_heat.set_title(f"worst all-to-all: {worst.lane_name or worst.pg_uid} Seq {worst.seq}, "
                      f"imbalance {imbalance}", fontsize=10)

"""``commtag summary`` output: tables (text, CSV, JSON) and the skew/bandwidth figure.

Everything here formats an :class:`~commtag.merge.analysis.results.Analysis`; nothing
computes a figure of its own, so the report, the JSON and the trace agree.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
import os
from pathlib import Path
from typing import Optional, Sequence

import orjson

from commtag.atomic import write_atomic
from commtag.kernels import LANE_SCOPE, KernelTables, mixed_nccl_lanes
from commtag.merge.analysis.analyze import NO_PAYLOAD
from commtag.merge.analysis.results import Analysis
from commtag.merge.analysis.table import GroupSummary, summarize
from commtag.identity import UNATTRIBUTED_UID
from commtag.merge.engine.output import not_regular
from commtag.merge.records import CPU_OP_SOURCE
from commtag.report.sections import has_plot_row, impact_csv, impact_lines, plot_row, traffic_csv, traffic_lines
from commtag.report.stepplot import impact_axes, step_bars

#: Version of the JSON report's layout (bump on an incompatible change).
REPORT_VERSION = 1

#: Findings listed in the text report; the JSON has them all.
_MAX_FINDINGS = 30

_CSV_COLUMNS = (
    "pg", "lane", "collective", "count", "bytes", "total_time_us", "skew_p50_us", "skew_max_us",
    "busbw_p50_gbps", "busbw_p95_gbps", "stragglers", "desyncs", "incomplete",
)


def to_json(analysis: Analysis, kernels: Optional[KernelTables] = None) -> bytes:
    """The machine-readable report: one record per matched instance, the table, the findings."""
    doc: dict[str, object] = {
        "kind": "commtag-summary",
        "version": REPORT_VERSION,
        "ranks": analysis.coverage.ranks,
        "world_size": analysis.coverage.world_size,
        "absent_ranks": analysis.coverage.absent,
        "alignment": analysis.coverage.alignment,
        "collectives": [m.to_dict() for m in analysis.collectives],
        "summary": [row.to_dict() for row in summarize(analysis)],
        "findings": [f.to_dict() for f in analysis.findings],
        "impact_profiled_us": analysis.impact.profiled_us,
        "impact": [r.to_dict() for r in analysis.impact.ranks],
        "impact_not_replayed": analysis.impact.not_replayed,
        "impact_outside_steps": analysis.impact.outside_steps,
        "all_to_all": [a.to_dict() for a in analysis.all_to_all],
    }
    if kernels is not None:
        doc["kernels"] = {
            scope: [{"rank": r, "id": i, **b.to_dict()} for (r, i), b in sorted(table.items())]
            for scope, table in kernels.items()
        }
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"


def to_csv(analysis: Analysis, table: str = "summary") -> str:
    """The per group and op table as CSV (stragglers as 'rank:count' separated by spaces), or
    the ``impact`` or ``all_to_all`` table (:mod:`commtag.report.sections`)."""
    if table == "impact":
        return impact_csv(analysis)
    if table == "all_to_all":
        return traffic_csv(analysis)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=_CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in summarize(analysis):
        record = row.to_dict()
        record["stragglers"] = " ".join(f"{r}:{n}" for r, n in sorted(row.stragglers.items()))
        writer.writerow({k: ("" if record[k] is None else record[k]) for k in _CSV_COLUMNS})
    return buffer.getvalue()


def to_text(analysis: Analysis, kernels: Optional[KernelTables] = None) -> str:
    """Tables for a terminal: one per process group, then findings, then kernel categories."""
    rows = summarize(analysis)
    coverage = analysis.coverage
    groups = {r.pg_uid for r in rows}
    buckets = {pg for pg in groups if pg.startswith(UNATTRIBUTED_UID + ":")}
    world = f" of {coverage.world_size}" if coverage.absent else ""
    ranks = len(coverage.ranks)
    lines = [
        f"{_many(len(analysis.collectives), 'collective')} on {ranks}{world} {'rank' if ranks == 1 and not world else 'ranks'}, "
        f"{_many(len(groups - buckets), 'process group')}"
        + (f" (+ {_many(len(buckets), 'kind')} of NCCL kernels without metadata)" if buckets else "")
        + f", {_many(len(analysis.desyncs), 'desync')}"
    ]
    note = cpu_op_note(analysis)
    if note:
        lines.append(note)
    if coverage.absent:
        lines.append(coverage.describe_absent())
    lines += _incomplete_lines(analysis)
    header = ("op", "count", "bytes", "total", "skew p50", "skew max", "busbw p50", "busbw p95", "stragglers", "time by cause")
    by_group: dict[str, list[GroupSummary]] = {}
    for row in rows:
        by_group.setdefault(row.pg_uid, []).append(row)
    for pg, group_rows in by_group.items():
        lane = group_rows[0].lane_name
        scopes = {r.nodes for r in group_rows}
        lines += ["", f"{lane or pg}  (uid {pg})" + (f", {scopes.pop()}" if len(scopes) == 1 and None not in scopes else "")]
        table = [header] + [
            (
                r.collective, str(r.count), _bytes(r.bytes, r.collective), _time(r.total_time_us), _time(r.skew_p50_us),
                _time(r.skew_max_us), _bw(r.busbw_p50_gbps), _bw(r.busbw_p95_gbps),
                ", ".join(f"{rank} ({n}x)" for rank, n in sorted(r.stragglers.items(), key=lambda kv: -kv[1])) or "-",
                ", ".join(f"{cause} {share:.0%}" for cause, share in r.time_by_cause.items()) or "-",
            )
            for r in group_rows
        ]
        lines += _align(table)
    # (skew, collective) of each straggler (a straggler is complete, so its skew is measured).
    late = sorted(((m.skew_ns, m) for m in analysis.collectives if m.straggler and m.skew_ns is not None),
                  key=lambda pair: -pair[0])
    if late:
        lines += ["", "stragglers:"] + [
            f"  rank {m.last_rank} {_time(skew / 1000)} late to {m.collective} Seq {m.seq}"
            f" in {m.lane_name or m.pg_uid}" for skew, m in late[:_MAX_FINDINGS]
        ]
        if len(late) > _MAX_FINDINGS:
            lines.append(f"  ... and {len(late) - _MAX_FINDINGS} more (all of them in --format json)")
    lines += impact_lines(analysis) + traffic_lines(analysis)
    if analysis.findings:
        shown = analysis.findings[:_MAX_FINDINGS]
        lines += ["", "findings:"] + [f"  {f.message}" for f in shown]
        if len(analysis.findings) > len(shown):
            lines.append(f"  ... and {len(analysis.findings) - len(shown)} more (all of them in --format json)")
    for scope, breakdowns in (kernels or {}).items():
        if breakdowns:
            lines += ["", f"GPU time by kernel category, per {scope}:"]
            lines += [f"  rank {r} {scope} {i}: {b.describe()}" for (r, i), b in sorted(breakdowns.items())]
    mixed = mixed_nccl_lanes((kernels or {}).get(LANE_SCOPE, {}))
    if mixed:
        lines += ["", "groups mixing NCCL's symmetric-memory and regular kernels (busbw mixes the two):"]
        lines += [f"  {line}" for line in mixed]
    return "\n".join(lines) + "\n"


def _incomplete_lines(analysis: Analysis) -> list[str]:
    """Why collectives lack members: in a merge that kept part of the job, a member whose kept
    spans do not reach the call (none blamed for it) was left out by that selection, not unrecorded."""
    incomplete = [m for m in analysis.collectives if not m.complete]
    selection = analysis.coverage.selection
    read = analysis.coverage.windows  # a rank without any trace is absent, not cut
    cut = sum(1 for m in incomplete if selection and not m.blamed_ranks and not m.unnamed_missing
              and all(r in read for r in m.missing_ranks))
    lines = []
    if cut:
        lines.append(f"{_many(cut, 'collective')} {'is' if cut == 1 else 'are'} incomplete because a member "
                     f"rank's part lies outside the selection ({selection}): left out of skew and busbw")
    if len(incomplete) > cut:
        lines.append(f"{len(incomplete) - cut} collectives are incomplete (a member rank did not record them): "
                     "left out of skew and busbw")
    return lines


def cpu_op_note(analysis: Analysis) -> Optional[str]:
    """What the report says when collectives were timed by their CPU op (record_param_comms or c10d)."""
    timed = sum(1 for m in analysis.collectives if any(i.source == CPU_OP_SOURCE for i in m.members.values()))
    if not timed:
        return None
    return (f"note: {timed} of {len(analysis.collectives)} collectives are timed by their CPU op "
            "(record_param_comms or c10d): no kernel of theirs carried collective metadata (a CPU-only profile, "
            "a world of one rank, a call that ran only a copy or nothing); their times are the host calls', "
            "so they have no bandwidth")


def _many(n: int, noun: str) -> str:
    """``1 collective``, ``2 collectives``: the header reads as a sentence."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _align(table: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in table]


def _bytes(n: Optional[int], collective: str) -> str:
    """A size, '?' when unknown, '-' for ops that move no data."""
    if n is None:
        return "-" if collective in NO_PAYLOAD else "?"
    if not n:
        return "0"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)


def _time(us: Optional[float]) -> str:
    if us is None:
        return "-"
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def _bw(gbps: Optional[float]) -> str:
    if gbps is None:
        return "-"
    return f"{gbps:.2f} GB/s" if gbps >= 0.1 else f"{gbps * 1e3:.2f} MB/s"


def plot_target_problem(path: Path, source: Path) -> Optional[str]:
    """Why the plot may not be written at ``path`` (None when it may): renaming a file over a
    device or pipe would replace it, and over the summary's own input would destroy it."""
    kind = not_regular(Path(path))
    if kind is not None:
        return f"--plot's target is {kind}, not a regular file: writing the plot would replace it"
    with contextlib.suppress(OSError):
        if os.path.samefile(path, source):
            return "--plot's target is the summary's input: writing the plot would overwrite it"
    return None


def plot(analysis: Analysis, path: Path) -> None:
    """The figure: who arrived late to which collective, and what bandwidth each group reached.

    Top: ranks x collectives (time order), coloured by how late each rank
    arrived (its start minus the first arrival), the late rank of each straggler
    ringed, desyncs marked in red. Bottom left: busbw of every instance over
    time, one colour per group. Bottom right: busbw p50 (bar) and p95 (tick)
    per group and op. A third row where a late rank cost time or an all-to-all's
    splits are known (:func:`plot_row`), its impact panel with each rank's cost per
    ProfilerStep below it where the traces hold steps (:mod:`commtag.report.stepplot`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import PowerNorm

    ms = analysis.collectives
    ranks = sorted({r for m in ms for r in m.members} | {r for m in ms for r in m.missing_ranks})
    row = {r: i for i, r in enumerate(ranks)}
    late = np.full((max(len(ranks), 1), max(len(ms), 1)), np.nan)
    for j, m in enumerate(ms):
        for r, inst in m.members.items():
            late[row[r], j] = (inst.start_ns - m.first_start_ns) / 1e6
    extra = has_plot_row(analysis)
    steps = step_bars(analysis.impact) if extra else None
    fig = plt.figure(figsize=(13, 8.5 + (4 if extra else 0) + (3 if steps else 0)), layout="constrained")
    grid = fig.add_gridspec(3 if extra else 2, 2, width_ratios=(1.6, 1),
                            height_ratios=(1.25, 1, 1 + (0.75 if steps else 0)) if extra else (1.25, 1))
    ax = fig.add_subplot(grid[0, :])
    cmap = matplotlib.colormaps["magma_r"].copy()
    cmap.set_bad("#e8e8e8")
    top = np.nanmax(late) if np.isfinite(late).any() else 0.0
    image = ax.imshow(late, aspect="auto", interpolation="nearest", cmap=cmap, norm=PowerNorm(0.5, 0, max(top, 1e-3)))
    fig.colorbar(image, ax=ax, label="arrival after the first rank (ms)", pad=0.01)
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    step = max(1, math.ceil(len(ms) / 24))
    ax.set_xticks(range(0, len(ms), step), [_label(m) for m in ms[::step]], rotation=60, ha="right", fontsize=7)
    for j, m in enumerate(ms):
        if m.straggler and m.last_rank is not None:
            ax.scatter([j], [row[m.last_rank]], s=110, facecolors="none", edgecolors="#00a2ff", linewidths=2.2)
        if m.desync:
            ax.scatter([j], [1.0], marker="v", color="#d62728", s=50, clip_on=False, transform=ax.get_xaxis_transform())
        for r in m.missing_ranks:
            ax.text(j, row[r], "x", ha="center", va="center", color="#d62728", fontsize=9, fontweight="bold")
    worst_skew, worst = max(((m.skew_ns, m) for m in ms if m.skew_ns is not None), key=lambda pair: pair[0],
                            default=(0, None))
    title = f"{len(ms)} collectives, {len(ranks)} ranks, {len(analysis.desyncs)} desyncs"
    if worst is not None and worst_skew > 0:
        title += (f"; worst skew {worst_skew / 1e6:.2f} ms: rank {worst.last_rank} late to "
                  f"{worst.collective} Seq {worst.seq} ({worst.lane_name or worst.pg_uid})")
    ax.set_title(title + "\n(blue ring: straggler, red x: missing rank, red triangle: desync)", fontsize=10)
    _plot_busbw(fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1]), analysis)
    if extra:
        plot_row(impact_axes(fig, grid[2, 0], steps), fig.add_subplot(grid[2, 1]), analysis)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format=Path(path).suffix.lstrip(".").lower() or "png")
    plt.close(fig)
    write_atomic(Path(path), buffer.getvalue())


def _short(lane: str) -> str:
    """A lane name without its rank list: 'PG 1 (pair01) [0, 1]' -> 'PG 1 (pair01)'."""
    return lane.split(" [")[0]


def _label(m) -> str:
    replay = f" r{m.replay}" if m.replay is not None else ""
    return f"{_short(m.lane_name or m.pg_uid)} {m.collective} #{m.seq}{replay}"


def _plot_busbw(ax_time, ax_bars, analysis: Analysis) -> None:
    import matplotlib
    from matplotlib.ticker import NullFormatter

    colours = matplotlib.colormaps["tab10"]
    groups = sorted({m.pg_uid for m in analysis.collectives})
    measured = [(m, m.busbw_gbps) for m in analysis.collectives if m.busbw_gbps is not None]
    # gloo on one host moves MB/s, NVLink hundreds of GB/s: pick the unit that reads.
    scale, unit = (1.0, "GB/s") if max((bw for _, bw in measured), default=0) >= 1 else (1e3, "MB/s")
    t0 = min((m.last_start_ns for m, _ in measured), default=0)
    for k, pg in enumerate(groups):
        pts = [(m, bw) for m, bw in measured if m.pg_uid == pg]
        if pts:
            ax_time.plot([(m.last_start_ns - t0) / 1e6 for m, _ in pts], [bw * scale for _, bw in pts], "o-",
                         ms=3, lw=0.8, color=colours(k % 10), label=_short(pts[0][0].lane_name or pg))
    ax_time.set_xlabel("time since the first measured collective (ms)")
    ax_time.set_ylabel(f"busbw ({unit})")
    ax_time.set_title("bus bandwidth of each collective", fontsize=10)
    if ax_time.lines:
        ax_time.set_yscale("log")
        ax_time.yaxis.set_minor_formatter(NullFormatter())
        ax_time.legend(fontsize=8)
    # (row, p50, p95) of the rows with a bandwidth (both percentiles come from the same figures).
    rows = [(r, r.busbw_p50_gbps, r.busbw_p95_gbps) for r in summarize(analysis)
            if r.busbw_p50_gbps is not None and r.busbw_p95_gbps is not None]
    labels = [f"{_short(r.lane_name or r.pg_uid)}\n{r.collective}" for r, _, _ in rows]
    ax_bars.barh(range(len(rows)), [p50 * scale for _, p50, _ in rows],
                 color=[colours(groups.index(r.pg_uid) % 10) for r, _, _ in rows])
    ax_bars.scatter([p95 * scale for _, _, p95 in rows], range(len(rows)), marker="|", s=200, color="black")
    ax_bars.set_yticks(range(len(rows)), labels, fontsize=7)
    ax_bars.invert_yaxis()
    ax_bars.set_xlabel(f"busbw p50 (bar) / p95 (tick), {unit}")
    ax_bars.set_title("per group and op", fontsize=10)
    if rows:
        ax_bars.set_xscale("log")
        ax_bars.xaxis.set_minor_formatter(NullFormatter())

"""Draw a window of a merged .pftrace the way the Perfetto UI lays it out, as a PNG.

    python launch/render_timeline.py traces/merged.pftrace -o docs/timeline.png
    python launch/render_timeline.py traces/merged.pftrace -o w.png --window 10 8 --ranks 0,2

The README needs a picture of the merged timeline and ui.perfetto.dev is not
reachable offline, so this redraws one: the process-group view on top (a band
per group, a row per member rank), then a band per rank with its thread rows
and GPU streams (nested slices one row per depth),
slices coloured by name, commtag's straggler markers, and the cross-rank flows
of a few chosen collectives. It reads the file with commtag's own reader.
"""

from __future__ import annotations

import argparse
import colorsys
import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.transforms import blended_transform_factory

from commtag.merge.pftrace.readback import ParsedTrace, ReadbackError, Slice, read_trace
from commtag.merge.inputs.selection import parse_numbers
from commtag.vocab import ANN_PG_UID, ANN_RANK, PG_RANKS_KEY, SEQ_KEY

ROW_H = 0.2  # inches per slice row
FONT = 7.5
DPI = 100
GUTTER = 0.16  # fraction of the figure width for track names


@dataclass
class Row:
    """One horizontal row of the picture: a header, or a track at one depth."""

    label: str
    kind: str  # "view" (a process group), "process", "group" or "track"
    slices: list[Slice]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("input", type=Path, help="merged .pftrace")
    parser.add_argument("-o", "--output", type=Path, default=Path("timeline.png"), help="PNG to write")
    parser.add_argument("--window", nargs=2, type=float, metavar=("START_MS", "DURATION_MS"),
                        help="time window relative to the first collective (default: one step, up to the "
                             "end of the first all-rank collective after it)")
    parser.add_argument("--ranks", help="ranks to show, e.g. 0,2 or 0-7 (default: all)")
    parser.add_argument("--groups-only", action="store_true", help="only the process-group view, no rank processes")
    parser.add_argument("--flows", default="all_gather,allreduce",
                        help="collective names whose first instance in the window gets its cross-rank flows drawn")
    parser.add_argument("--max-depth", type=int, default=2, help="slice rows per thread (default: 2)")
    parser.add_argument("--width", type=float, default=15.0, help="figure width in inches (default: 15)")
    args = parser.parse_args(argv)
    try:
        trace = read_trace(args.input)
    except (OSError, ReadbackError) as exc:
        print(f"render_timeline: {exc}", file=sys.stderr)
        return 2
    lanes = [s for s in trace.slices if ANN_RANK in s.args and ANN_PG_UID in s.args and not s.instant]
    if not lanes:
        print(f"render_timeline: {args.input}: no commtag lane slices (not a merged trace?)", file=sys.stderr)
        return 2
    t0 = min(s.ts for s in lanes)
    start, end = _window(lanes, t0, args.window)
    ranks = set(parse_numbers(args.ranks, "--ranks")) if args.ranks else None
    rows = _rows(trace, start, end, ranks, args.max_depth, not args.groups_only)
    chosen = _chosen(lanes, start, end, [n for n in args.flows.split(",") if n])
    _draw(rows, chosen, t0, start, end, args)
    print(f"{args.output}: {len(rows)} rows, {(end - start) / 1e6:.1f} ms")
    return 0


def _window(lanes: list[Slice], t0: int, window: list[float] | None) -> tuple[int, int]:
    """The requested window in trace ns, or one step: up to the end of the first all-rank collective."""
    if window:
        return t0 + int(window[0] * 1e6), t0 + int((window[0] + window[1]) * 1e6)
    widest = max(len(s.args.get(PG_RANKS_KEY, "")) for s in lanes)
    firsts = [s for s in lanes if len(s.args.get(PG_RANKS_KEY, "")) == widest and s.ts > t0]
    key = min((s.args[ANN_PG_UID], s.args[SEQ_KEY]) for s in firsts if s.ts == min(f.ts for f in firsts))
    end = max(s.end for s in lanes if (s.args[ANN_PG_UID], s.args[SEQ_KEY]) == key)
    pad = (end - t0) // 40
    return t0 - pad, end + pad


def _rows(trace: ParsedTrace, start: int, end: int, ranks: set[int] | None, max_depth: int,
          processes: bool = True) -> list[Row]:
    """Rows in the UI's order: the process-group view's groups, then each process, each with
    its track tree depth-first, one row per slice depth."""
    children: dict[int, list] = {}
    for desc in trace.tracks.values():
        if desc.HasField("parent_uuid"):
            children.setdefault(desc.parent_uuid, []).append(desc)
    by_track: dict[int, list[Slice]] = {}
    min_dur = (end - start) // 1500  # narrower than about a pixel: Perfetto would not show it either
    for s in trace.slices:
        if s.ts < end and s.end >= start and s.depth < max_depth and (s.ts == s.end or s.end - s.ts >= min_dur):
            by_track.setdefault(s.track, []).append(s)
    rows: list[Row] = []

    def walk(desc) -> list[Row]:
        kids = sorted(children.get(desc.uuid, []), key=lambda d: (d.sibling_order_rank, d.name))
        if not kids:
            mine = by_track.get(desc.uuid, [])
            depth = max((s.depth for s in mine), default=-1) + 1
            return [Row(desc.name if d == 0 else "", "track", [s for s in mine if s.depth == d]) for d in range(depth)]
        below = [r for kid in kids for r in walk(kid)]
        return [Row(desc.name, "group", [])] + below if below else []

    heads = [d for d in trace.tracks.values() if not d.HasField("parent_uuid") and not d.HasField("process")
             and d.uuid in children]
    for head in sorted(heads, key=lambda d: (d.sibling_order_rank, d.name)):
        kids = [d for d in sorted(children[head.uuid], key=lambda d: (d.sibling_order_rank, d.name))
                if ranks is None or not d.name.startswith("rank ") or int(d.name.split(" ")[1]) in ranks]
        below = [r for kid in kids for r in walk(kid)]
        if any(r.label.startswith("rank ") for r in below):
            rows += [Row(head.name, "view", [])] + below
    for proc in sorted(trace.processes(), key=lambda d: (d.sibling_order_rank, d.process.process_name)):
        if not processes:
            break
        match = re.match(r"rank (\d+)", proc.process.process_name)
        if ranks is not None and (match is None or int(match.group(1)) not in ranks):
            continue
        below = [r for kid in sorted(children.get(proc.uuid, []), key=lambda d: (d.sibling_order_rank, d.name))
                 for r in walk(kid)]
        if below:
            rows += [Row(proc.process.process_name, "process", [])] + below
    return rows


def _chosen(lanes: list[Slice], start: int, end: int, names: list[str]) -> list[Slice]:
    """Every rank's slice of the first instance of each named collective that lies in the window."""
    out: list[Slice] = []
    for name in names:
        inside = sorted((s for s in lanes if s.name == name and s.ts >= start and s.end <= end), key=lambda s: s.ts)
        if inside:
            key = (inside[0].args[ANN_PG_UID], inside[0].args[SEQ_KEY])
            out += [s for s in inside if (s.args[ANN_PG_UID], s.args[SEQ_KEY]) == key]
    return out


def _colours(rows: list[Row]) -> dict[str, tuple[float, ...]]:
    """A colour per slice name: strong, distinct ones for the lane collectives so commtag's rows stand out,
    muted hash-derived hues (like the UI's) for everything else."""
    lane_names = sorted({s.name for row in rows for s in row.slices if ANN_RANK in s.args})
    strong = [c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 3]  # red is the markers'
    out: dict[str, tuple[float, ...]] = {n: strong[i % len(strong)] for i, n in enumerate(lane_names)}
    for name in {s.name for row in rows for s in row.slices} - set(out):
        h = zlib.crc32(re.sub(r"\d+", "", name).encode())
        out[name] = colorsys.hls_to_rgb((h % 360) / 360, 0.62 + (h >> 9) % 10 / 100, 0.35 + (h >> 17) % 15 / 100)
    return out


def _draw(rows: list[Row], chosen: list[Slice], t0: int, start: int, end: int, args) -> None:
    height = ROW_H * len(rows) + 1.0  # rows, plus the title and the time axis above them
    fig = plt.figure(figsize=(args.width, height), dpi=DPI)
    ax = fig.add_axes((GUTTER, 0.1 / height, 1 - GUTTER - 0.01, ROW_H * len(rows) / height))

    def ms(ns: int) -> float:
        return (ns - t0) / 1e6

    ax.set_xlim(ms(start), ms(end))
    ax.set_ylim(len(rows), 0)
    ax.xaxis.tick_top()
    ax.tick_params(axis="x", labelsize=FONT + 1, length=3, colors="#555")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x:g} ms")
    ax.set_yticks([])
    for side in ("left", "right", "bottom", "top"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    gutter = blended_transform_factory(fig.transFigure, ax.transData)
    px_per_ms = ax.get_window_extent().width / (ms(end) - ms(start))
    char_px = FONT * DPI / 72 * 0.58
    where: dict[int, float] = {}
    colours = _colours(rows)
    for y, row in enumerate(rows):
        if row.kind in ("process", "view"):
            ax.add_patch(Rectangle((0.005, y + 0.08), 0.985, 0.84, transform=gutter, clip_on=False,
                                   facecolor="#e8eaf0" if row.kind == "process" else "#fff3d6", edgecolor="none",
                                   zorder=0))
            ax.text(0.01, y + 0.5, row.label, transform=gutter, va="center", fontsize=FONT + 1.5, weight="bold")
            continue
        indent = 0.02 if row.kind == "group" else 0.03
        ax.text(indent, y + 0.5, row.label, transform=gutter, va="center", fontsize=FONT,
                color="#333" if row.kind == "track" else "#777", style="italic" if row.kind == "group" else "normal")
        if row.kind == "track" and row.label:
            ax.axhline(y, color="#eee", linewidth=0.5, zorder=0)
        for s in row.slices:
            where[id(s)] = y + 0.5
            if s.ts == s.end:
                _marker(ax, s, ms(s.ts), y, px_per_ms, char_px)
                continue
            x0, x1 = max(ms(s.ts), ms(start)), min(ms(s.end), ms(end))
            colour = colours[s.name]
            ax.add_patch(Rectangle((x0, y + 0.1), x1 - x0, 0.8, facecolor=colour, edgecolor="white", linewidth=0.3))
            label = f"{s.name} Seq {s.args['Seq']}" if ANN_RANK in s.args else s.name
            fits = int(((x1 - x0) * px_per_ms - 4) / char_px)
            if fits >= 4:
                text = label if len(label) <= fits else label[:fits - 1] + "…"
                light = sum(c * w for c, w in zip(colour, (0.3, 0.59, 0.11))) < 0.55
                ax.text(x0 + 2 / px_per_ms, y + 0.5, text, va="center", fontsize=FONT,
                        color="white" if light else "black", clip_on=True)
    _flows(ax, chosen, where, ms)
    names = " and ".join(sorted({f"{s.name} Seq {s.args['Seq']} on {s.args['commtag lane'].split(' [')[0]}"
                                 for s in chosen}))
    shown = sum(row.kind == "process" for row in rows) or len({r.label for r in rows if r.label.startswith("rank ")})
    fig.text(0.01, 1 - 0.08 / height, f"commtag merged timeline · {args.input.name}: {shown} ranks, {ms(start):.1f} to {ms(end):.1f} ms "
             "after the first collective", va="top", fontsize=FONT + 3.5, weight="bold")
    if names:
        fig.text(0.01, 1 - 0.34 / height, f"arrows: cross-rank flows from the first arrival of {names}",
                 va="top", fontsize=FONT + 1.5, color="#1a237e")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=DPI)
    plt.close(fig)


def _marker(ax, s: Slice, x: float, y: int, px_per_ms: float, char_px: float) -> None:
    """An instant: a small triangle with its name beside it (commtag's straggler markers)."""
    ax.plot([x], [y + 0.55], marker="v", color="#c62828", markersize=6)
    ax.text(x + 5 / px_per_ms, y + 0.5, s.name, va="center", fontsize=FONT - 0.5, color="#c62828", clip_on=True)


def _flows(ax, chosen: list[Slice], where: dict[int, float], ms) -> None:
    """The arrows the UI shows with each instance's first arrival selected: its flows to the other ranks."""
    shown = [s for s in chosen if id(s) in where]
    for s in shown:
        ax.add_patch(Rectangle((ms(s.ts), where[id(s)] - 0.4), ms(s.end) - ms(s.ts), 0.8, fill=False,
                               edgecolor="black", linewidth=1.4, zorder=4))
    for src in shown:
        peers = [s for s in shown if s.args[ANN_PG_UID] == src.args[ANN_PG_UID]
                 and s.args[SEQ_KEY] == src.args[SEQ_KEY]]
        if src is not min(peers, key=lambda s: s.ts):
            continue
        for dst in peers:
            if set(src.flows_out) & set(dst.flows_in):
                ax.add_patch(FancyArrowPatch((ms(src.ts), where[id(src)]), (ms(dst.ts), where[id(dst)]),
                                             arrowstyle="-|>", mutation_scale=10, color="#1a237e", linewidth=1.2,
                                             connectionstyle="arc3,rad=0.08", zorder=5))


if __name__ == "__main__":
    sys.exit(main())

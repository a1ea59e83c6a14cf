"""How big the merged trace will be, known before it is written: ``--max-output``.

The Perfetto UI opens about 2 GB and slows well before, so a merge that would
write more stops first, saying how big it would be and which ``--detail`` or
``--steps`` would fit.

How: a few ranks spread over the job (:data:`SAMPLED_RANKS`) are converted
for real, with the merge's own converter and writer, into a byte counter:
their timelines (all their files, the selection applied) and their lanes.
Every other rank is taken to be like them per byte of input: its timeline by
its traces' JSON bytes, its lanes by its sidecars' bytes (by its JSON bytes
without sidecars). Cross-rank flows and the analysis's figures, which a
single rank cannot show, are added per lane slice. Cheap first: where even
:func:`upper_bound` (no conversion) fits, nothing is sampled.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Optional, Sequence, cast

from commtag.vocab import PROFILER_STEP_PREFIX
from commtag.merge.ids import sequence_block
from commtag.merge.rank.convert import RankConverter
from commtag.merge.inputs.jsonstream import GZIP_MAGIC, TraceStream
from commtag.merge.pftrace.lanes import FULL_MESH_MAX, LanesWriter
from commtag.merge.inputs.load import MergeInputError, RankInput
from commtag.merge.inputs.sidecars import load_sidecar
from commtag.merge.inputs.selection import FileSpans, Selection, describe_numbers
from commtag.merge.pftrace.sequence import SequenceWriter
from commtag.merge.pftrace.writer import rank_sequence, write_rank
from commtag.merge.records import CollectiveInstance

#: Ranks converted to measure the rest by: the first, the last and two between.
SAMPLED_RANKS = 4
#: Deflate's highest compression ratio (a run of one byte): a gzip file holds at most this many
#: times its own size.
_DEFLATE_MAX_RATIO = 1032
#: Bytes a flow id takes on each of its two slices (tag and 8 bytes).
_FLOW_BYTES = 10
#: What the analysis adds to a lane slice (skew, last rank, wait, bytes, busbw, ranks matched, ...):
#: measured on gloo and generated sets, 90 to 140 bytes.
_ANALYSIS_BYTES = 120
#: Output bytes per input byte no merge exceeds (the writer's varints and interned names make
#: the output smaller than its JSON; an annotation is written on a lane slice and up to two events).
_BOUND_TRACE = 1.0
_BOUND_SIDECAR = 3.0
#: The share of --max-output an advised --detail or --steps is estimated to fill at most.
_ADVICE_MARGIN = 0.85
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12}


def parse_size(spec: str) -> int:
    """``"1.5G"``, ``"800MB"``, ``"2000000"`` -> bytes (decimal units, as file sizes are shown)."""
    text = spec.strip().lower()
    number = text.rstrip("kmgtb")
    try:
        value = float(number) * _UNITS[text[len(number):]]
    except (KeyError, ValueError):
        raise ValueError(f"--max-output {spec!r} is not a size like 1.5G, 800M or 2000000") from None
    if not 1 <= value < math.inf:
        raise ValueError(f"--max-output {spec!r} must be a size of at least one byte")
    return int(value)


def describe_size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} bytes"


def json_bytes(path: Path) -> int:
    """A trace file's JSON size: a gzip file's own record of it (its last 4 bytes, modulo 4 GiB).
    Only a gzip file of more than 4 GiB / :data:`_DEFLATE_MAX_RATIO` can hold 4 GiB or more, so
    the record of a smaller one is exact (a tiny or broken file may be bigger than its content);
    in a bigger one a record under a quarter of the file's size has wrapped (deflate never
    compresses Kineto JSON less than 4:1), and is taken as bigger by whole 4 GiBs. A record more than
    the file can hold is a cut file's: bad input, said before any size is estimated from it."""
    size = path.stat().st_size
    with open(path, "rb") as stream:
        if stream.read(2) != GZIP_MAGIC or size < 18:
            return size
        stream.seek(-4, 2)
        recorded = struct.unpack("<I", stream.read(4))[0]
    if size * _DEFLATE_MAX_RATIO < 1 << 32:
        if recorded > size * _DEFLATE_MAX_RATIO:  # a cut file's last 4 bytes are deflate data, not the record
            raise MergeInputError(path, f"truncated or corrupt gzip (its trailer records {recorded:,} bytes of "
                                        f"JSON, more than {size:,} bytes of deflate can hold)")
        return recorded
    while recorded < size * 4:
        recorded += 1 << 32
    return recorded


def _sidecar_bytes(rank: RankInput) -> int:
    return sum(f.sidecar.stat().st_size for f in rank.files if f.sidecar is not None)


def upper_bound(ranks: Sequence[RankInput]) -> int:
    """What no merge of ``ranks`` writes more than, from file sizes alone."""
    return int(sum(_BOUND_TRACE * json_bytes(f.path) for r in ranks for f in r.files)
               + sum(_BOUND_SIDECAR * _sidecar_bytes(r) for r in ranks))


class _ByteCount:
    """A write-only stream that only counts."""

    def __init__(self) -> None:
        self.n = 0

    def write(self, data: bytes) -> int:
        self.n += len(data)
        return len(data)


@dataclass(slots=True)
class Estimate:
    """The merged trace's size, by rank: its timeline (written with --detail) and its lanes (always)."""

    timeline: dict[int, float] = field(default_factory=dict)
    lanes: dict[int, float] = field(default_factory=dict)
    #: Step numbers the sampled ranks' traces hold, and their share of those ranks' timelines.
    steps: list[int] = field(default_factory=list)
    #: Of ``lanes``, what --steps does not shrink: the names and args each sequence interns.
    fixed: float = 0.0

    def total(self, selection: Optional[Selection] = None) -> int:
        detailed = selection.detailed if selection is not None else (lambda _rank: True)
        return int(sum(self.lanes.values()) + sum(b for r, b in self.timeline.items() if detailed(r)))

    def fits(self, limit: int, selection: Optional[Selection]) -> list[str]:
        """Options that would bring the merge under ``limit`` (at most one --detail, one --steps;
        where neither alone fits, ``--detail none`` with --steps: a big job's lanes alone may not fit),
        with :data:`_ADVICE_MARGIN` to spare for the estimate's own error."""
        budget = limit * _ADVICE_MARGIN
        out = []
        ranks = sorted(self.timeline)
        lanes = sum(self.lanes.values())
        per_rank = sum(self.timeline.values()) / max(1, len(ranks))
        if lanes < budget and ranks:
            k = min(len(ranks), int((budget - lanes) // per_rank) if per_rank else len(ranks))
            detail = "none" if k == 0 else describe_numbers(ranks[:k])
            out.append(f"--detail {detail} (about {describe_size(lanes + k * per_rank)})")
        if len(self.steps) < 2 or (selection is not None and selection.selects_time):
            return out
        for detail, fixed, per_step in (("", 0.0, self.total(selection) / len(self.steps)),
                                        ("--detail none ", self.fixed, (lanes - self.fixed) / len(self.steps))):
            k = int((budget - fixed) // per_step) if per_step else 0
            if k >= 1:
                out.append(f"{detail}--steps {describe_numbers(self.steps[:k])} "
                           f"(about {describe_size(fixed + k * per_step)})")
                return out
        return out


def estimate(ranks: Sequence[RankInput], selection: Optional[Selection] = None,
             spans_of: Optional[FileSpans] = None, offsets: Optional[dict[int, int]] = None) -> Estimate:
    """The merged trace's size by rank, from :data:`SAMPLED_RANKS` ranks converted for real."""
    offsets = offsets or {}
    picks = sorted({round(k * (len(ranks) - 1) / max(1, SAMPLED_RANKS - 1)) for k in range(SAMPLED_RANKS)}) \
        if ranks else []
    # Each sample is written on sequences of its own, each interning the names and args it uses;
    # in the merge a block of ranks shares those (ids.sequence_block): each rank pays its share.
    share = 1 / sequence_block(len(ranks))
    lanes_writer = LanesWriter()
    measured: dict[int, tuple[float, float]] = {}
    timeline_per_json: list[float] = []
    lanes_per_side: list[float] = []
    lanes_per_json: list[float] = []
    fixed: list[float] = []
    steps: set[int] = set()
    for index in picks:
        rank = ranks[index]
        seq = rank_sequence(rank.rank)
        try:
            timeline_bytes, lanes_bytes, found = _measure(rank, offsets.get(rank.rank, 0), spans_of, seq, lanes_writer)
        except MergeInputError:
            continue  # a bad file: the merge says so (or skips it); the other samples stand for it
        timeline = timeline_bytes - seq.interned_bytes * (1 - share)
        lanes = lanes_bytes - lanes_writer.seq.interned_bytes * (1 - share)
        fixed.append(lanes_writer.seq.interned_bytes * share)
        measured[rank.rank] = (timeline, lanes)
        steps |= found
        json = sum(json_bytes(f.path) for f in rank.files)
        timeline_per_json.append(timeline / max(1, json))
        side = _sidecar_bytes(rank)
        (lanes_per_side if side else lanes_per_json).append(lanes / max(1, side or json))
    out = Estimate(steps=sorted(steps), fixed=len(ranks) * sum(fixed) / max(1, len(fixed)))

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    for rank in ranks:
        if rank.rank in measured:
            out.timeline[rank.rank], out.lanes[rank.rank] = measured[rank.rank]
            continue
        json = sum(json_bytes(f.path) for f in rank.files)
        side = _sidecar_bytes(rank)
        out.timeline[rank.rank] = mean(timeline_per_json) * json
        out.lanes[rank.rank] = mean(lanes_per_side) * side if side else mean(lanes_per_json) * json
    return out


def _measure(rank: RankInput, offset: int, spans_of: Optional[FileSpans], seq: SequenceWriter,
             lanes_writer: LanesWriter) -> tuple[int, int, set[int]]:
    """One rank converted and written into a counter on its own sequences: its timeline's
    bytes, its lanes' bytes (with the flows and figures other ranks would add), and the profiler
    steps its files hold."""
    converter = RankConverter(rank.rank, seq, offset_ns=offset)
    steps: set[int] = set()
    for f in rank.files:
        sidecar = load_sidecar(f.sidecar, f.base_ns) if f.sidecar else None
        stream = _StepWatch(f.path)
        # The step watch reads as the stream it wraps (header, batches): what the converter reads of one.
        converter.add_file(f.path, cast(TraceStream, stream), sidecar,
                           spans_of(f.path, offset) if spans_of is not None else None)
        steps |= stream.steps
    timeline = converter.timeline()
    sink = _ByteCount()
    write_rank(cast(BinaryIO, sink), timeline, seq)
    lanes = _ByteCount()
    instances = converter.instances
    layout: dict[int, list[tuple[str, int]]] = {}
    for order, name in enumerate(sorted({i.lane_name for i in instances})):
        layout.setdefault(rank.rank, []).append((name, order))
    by_lane: dict[tuple[int, str], list[CollectiveInstance]] = {}
    for inst in instances:
        by_lane.setdefault((inst.rank, inst.lane_name), []).append(inst)
    # One rank's instances link to no other rank's: no flow here; ``others`` counts those other ranks add.
    lanes_writer.write(cast(BinaryIO, lanes), layout, by_lane, {},
                       {(rank.rank, lane): args for lane, args in timeline.lane_kernels.items()}, ranks={rank.rank})
    others = sum(_FLOW_BYTES * (i.group_size - 1 if i.group_size <= FULL_MESH_MAX else 2) + _ANALYSIS_BYTES
                 for i in instances)
    return sink.n, lanes.n + others, steps


class _StepWatch:
    """A trace file's batches, noting the ``ProfilerStep#N`` numbers they hold on the way."""

    def __init__(self, path: Path) -> None:
        self.stream = TraceStream(path)
        self.steps: set[int] = set()

    @property
    def header(self) -> dict:
        return self.stream.header

    def batches(self):
        prefix = PROFILER_STEP_PREFIX
        for batch in self.stream.batches():
            for e in batch:
                name = e.get("name") if e.__class__ is dict else None
                if name.__class__ is str and name.startswith(prefix) and name[len(prefix):].isdigit():
                    self.steps.add(int(name[len(prefix):]))
            yield batch

"""One rank's pass, as every stage of the merge runs it: its files converted and attached in turn.

:func:`convert_rank` feeds each file of a rank (and its sidecar, validated
in full) to a converter and checks what the files say of themselves (a
sidecar of the same run, steps that do not overlap); with --skip-bad-ranks a
bad file is left out and the rank converted again. The merge's write, its
--align first pass and ``commtag summary`` each drive it their own way.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from commtag.kernels import DeviceWork
from commtag.merge.rank.checks import PAIR_SLACK_NS
from commtag.merge.rank.convert import RankConverter
from commtag.merge.rank.events import FormatConflict
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.jsonstream import TraceStream, WholeTrace
from commtag.merge.inputs.load import RankInput, TraceFile
from commtag.merge.inputs.sidecars import load_sidecar
from commtag.merge.inputs.stepmatch import instance_step_seqs, match
from commtag.merge.inputs.clock import wall_clock
from commtag.merge.inputs.inspector import join as join_inspector, read_inspector
from commtag.merge.hangs.beside import draw_beside
from commtag.merge.timeline import RankTimeline
from commtag.merge.records import (
    Coverage, FileSpan, GroupLane, Interner, RankSummary,
)
from commtag.merge.inputs.selection import (
    FileSpans,
)
from commtag.merge.steps import step_spans


if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import Sidecar


def _sidecar_of(f: TraceFile, skipped: Optional[list[MergeInputError]]) -> Optional[Sidecar]:
    """The file's sidecar, validated in full (discovery read only its head). A sidecar that
    fails is an error, or with ``skipped`` left out and its trace merged alone."""
    try:
        sidecar = load_sidecar(f.sidecar, f.base_ns) if f.sidecar else None
    except MergeInputError as exc:
        if skipped is None:
            raise
        _note(skipped, exc.path, exc.problem)
        return None
    return sidecar


def _check_spans(rank: RankInput, files: list[FileSpan]) -> None:
    """Several files of one rank are steps one after another: their times must not overlap."""
    # (first, last, file) of the files with timed events (a file has both ends or neither).
    timed = sorted(((f.first_ns, f.last_ns, f) for f in files if f.first_ns is not None and f.last_ns is not None),
                   key=lambda t: t[0])
    for (_, before_last, before), (after_first, _, after) in zip(timed, timed[1:]):
        if after_first < before_last:
            raise MergeInputError(after.path, f"claims rank {rank.rank} like {before.path}, and their times overlap: "
                                              "one rank cannot record two traces at once")




def _check_pair(f: TraceFile, sidecar: Optional[Sidecar], first: Optional[int], last: Optional[int],
                offset: int) -> None:
    """A sidecar and its trace must record the same window: a sidecar none of whose calls starts
    within its trace's span comes from another run than the trace (one of them is stale)."""
    starts = [c.start_ns + offset for c in sidecar.collectives] if sidecar is not None else []
    if not starts or first is None or last is None or any(first - PAIR_SLACK_NS <= t <= last + PAIR_SLACK_NS for t in starts):
        return
    raise MergeInputError(
        f.path, f"its sidecar {f.sidecar} records {len(starts)} calls from {wall_clock(min(starts) - offset)} "
                f"to {wall_clock(max(starts) - offset)}, none within this trace's {wall_clock(first - offset)} to "
                f"{wall_clock(last - offset)}: the two come from different runs")


def _note(skipped: list[MergeInputError], path: Path, problem: str) -> None:
    """Add a skipped file once (--align reads every file twice)."""
    if not any((e.path, e.problem) == (path, problem) for e in skipped):
        skipped.append(MergeInputError(path, problem))


def convert_rank(rank: RankInput, new_converter: Callable[[], RankConverter],
                  skipped: Optional[list[MergeInputError]],
                  source: Callable[[Path], TraceStream | WholeTrace] = TraceStream,
                  spans_of: Optional[FileSpans] = None) -> Optional[tuple[RankConverter, list[FileSpan]]]:
    """A converter (from ``new_converter``) fed every file of ``rank``, read by ``source``,
    and what each file says of itself; ``spans_of`` gives the times each file keeps (--steps/--window).

    With ``skipped`` (--skip-bad-ranks), a bad file and its sidecar are left out and listed
    there, and the rank is converted again from its other files: None when none is left.
    """
    files = list(rank.files)
    while files:
        converter = new_converter()
        try:
            told = []
            for f in files:
                sidecar = _sidecar_of(f, skipped)
                stream = source(f.path)
                spans = spans_of(f.path, converter.offset) if spans_of is not None else None
                said = len(converter.notes)
                first, last = converter.add_file(f.path, stream, sidecar, spans)
                if first is None:  # well-formed (a window that recorded nothing), but worth saying
                    converter.notes.append(f"{f.path}: holds no timed events: nothing of its rank is merged from it")
                _check_pair(f, sidecar, first, last, converter.offset)
                told.append(_file_span(rank.rank, f, stream.header, sidecar, first, last, converter.offset,
                                       _conflicts(converter.notes, said)))
            _check_spans(rank, told)
            return converter, told
        except MergeInputError as exc:
            bad = next((f for f in files if exc.path in (f.path, f.sidecar)), None)
            if skipped is None:
                raise
            if bad is None:  # not one file's fault: the whole rank goes
                _note(skipped, exc.path, f"rank {rank.rank} skipped: {exc.problem}")
                return None
            files.remove(bad)
            why = f"left out of rank {rank.rank}" if files else f"rank {rank.rank} skipped"
            _note(skipped, exc.path, f"{why}: {exc.problem}")
            if bad.sidecar is not None and exc.path == bad.path:
                _note(skipped, bad.sidecar, f"its trace {bad.path.name!r} was skipped")
    return None


def _conflicts(notes: list[str], said: int) -> str:
    """The record-format disagreements (events.FormatConflict) one file added to ``notes`` after
    index ``said``, taken out of them: a warning naming the file, not a notice of its rank."""
    found = [note for note in notes[said:] if isinstance(note, FormatConflict)]
    notes[said:] = [note for note in notes[said:] if not isinstance(note, FormatConflict)]
    return "; ".join(found)


def _file_span(rank: int, f: TraceFile, header: dict, sidecar: Optional[Sidecar], first: Optional[int],
               last: Optional[int], offset: int, formats: str = "") -> FileSpan:
    """What a converted file says of itself: its own clock's span (without --align's offset), host, ids."""
    devices = header.get("deviceProperties")
    names = Counter(str(d.get("name")) for d in devices if isinstance(d, dict)) if isinstance(devices, list) else {}
    return FileSpan(str(f.path), rank, None if first is None else first - offset,
                    None if last is None else last - offset, str(header.get("host_name") or ""),
                    sidecar.host if sidecar is not None else "", sidecar.run_id if sidecar is not None else "",
                    str(header.get("trace_id") or ""), sidecar.pid if sidecar is not None else None,
                    ", ".join(f"{count} {name}" if count > 1 else name for name, count in sorted(names.items())), formats)


def attached_whole(rank: RankInput, offset: int, interner: Interner) -> list[tuple[Path, dict]]:
    """The rank's files read whole, their events annotated in place as the merge annotates them."""
    read: list[tuple[Path, WholeTrace]] = []

    def whole(path: Path) -> WholeTrace:
        read.append((path, WholeTrace(path)))
        return read[-1][1]

    convert_rank(rank, lambda: RankConverter(rank.rank, None, offset_ns=offset, interner=interner), None, whole)
    out = []
    for path, w in read:
        assert w.trace is not None, "without skipped, convert_rank reads every file whole or raises"
        out.append((path, w.trace))
    return out


def summaries_only(ranks: list[RankInput], interner: Interner,
                    skipped: Optional[list[MergeInputError]],
                    on_rank: Optional[Callable[[int, DeviceWork], None]] = None) -> list[RankSummary]:
    """Each rank's collective instances (and kernel breakdowns, to ``on_rank``), streamed
    like the merge itself: --align's first pass and :func:`collect`."""
    summaries = []
    for rank in ranks:
        converted = convert_rank(rank, lambda: RankConverter(rank.rank, None, breakdowns=on_rank is not None,
                                                              interner=interner), skipped)
        if converted is not None:
            converter, files = converted
            summaries.append(rank_summary(rank, converter, None, files))
            if on_rank is not None:
                converter.categories.finish()
                on_rank(rank.rank, converter.categories)
    return summaries


def rank_summary(rank: RankInput, converter: RankConverter, timeline: Optional[RankTimeline], files: list[FileSpan],
                 inspector: Optional[Path] = None) -> RankSummary:
    """What is kept of a converted rank; with ``inspector`` (a folder of NCCL Inspector dumps) its
    records joined to the rank's instances, what joined nothing in its notes. With the ``timeline`` the
    merge writes, the Flight Recorder dumps beside its traces are drawn (commtag.merge.hangs.beside)."""
    first_ns, lane_kernels = (timeline.first_ns, timeline.lane_kernels) if timeline is not None else (None, {})
    if timeline is not None:
        converter.notes.extend(draw_beside(converter.instances, rank.rank, [f.path for f in rank.files], timeline,
                                           converter.encoder, converter.offset))
    if inspector is not None:
        pids = {(f.sidecar_host or f.host, f.pid) for f in files if f.pid is not None}
        converter.notes.extend(join_inspector(converter.instances, rank.rank, read_inspector(inspector),
                                              next(iter(pids)) if len(pids) == 1 else None))
    groups = dict(converter.groups)
    for inst in converter.instances:
        groups.setdefault(inst.pg_uid, GroupLane(inst.lane_name, inst.lane_id, inst.pg_uid, inst.group_ranks))
    return RankSummary(rank.rank, converter.host, first_ns, list(groups.values()), converter.instances, lane_kernels,
                       converter.windows, converter.world_size, files=files, notes=converter.notes,
                       steps=(steps := step_spans(converter.steps)), step_seqs=instance_step_seqs(converter.instances, steps))


def coverage(summaries: Sequence[RankSummary], selection: str = "") -> Coverage:
    """The ranks read, their windows and steps, and the world size most of them claim;
    ``selection``: the --steps or --window kept (:func:`commtag.merge.inputs.selection.kept_by`)."""
    sizes = Counter(s.world_size for s in summaries if s.world_size)
    return Coverage({s.rank: list(s.windows) for s in summaries}, sizes.most_common(1)[0][0] if sizes else None,
                    steps={s.rank: sorted(s.steps, key=lambda step: (step[1], step[0])) for s in summaries if s.steps},
                    firsts={s.rank: s.first_ns for s in summaries if s.first_ns is not None}, selection=selection,
                    hosts={s.rank: s.host for s in summaries if s.host},
                    step_numbers=match({s.rank: s.step_seqs for s in summaries}).describe())

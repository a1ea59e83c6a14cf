"""The merge, rank by rank: stream, attach, write, free; then lanes once.

Memory stays near one rank's encoded events: a rank is read in batches
(commtag.merge.convert), written once its files are read, and only its
CollectiveInstance records are kept. After the last rank the analysis hook
sees every instance, and the lanes block (process-group lanes, cross-rank
flows, counters, markers) is written. The output appears atomically (a
temporary file renamed over it); a failed merge leaves any previous output
untouched.

Under torchrun (:mod:`commtag.merge.workers`) each merge worker takes a
contiguous chunk of ranks and writes them to a shard; workers exchange
their records as JSON, each runs the analysis over all of them and writes
the lanes of its own ranks after them, and worker 0 appends the others'
shards after its own. Blocks only use ids derived from their rank, so the
file shows exactly what the single-process one shows (each worker's
packet sequences and interned ids are its own).

``collect`` (``commtag summary`` on a directory) streams ranks the same
way, writing nothing; ``--json`` reads each rank whole again: it writes
every event back.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections import Counter
from dataclasses import asdict, astuple, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

import orjson

from commtag.kernels import DeviceWork
from commtag.merge import graphs, lanes, runs, trace_writer
from commtag.merge.align import Alignment, estimate_offsets
from commtag.merge.attach import GraphFallback, common, settle_inferred, shared
from commtag.merge.convert import EventAccount, RankConverter
from commtag.merge.jsonstream import TraceStream, WholeTrace
from commtag.merge.load import (
    MergeInputError, RankInput, TraceFile, discover, load_sidecar, nothing_left, wall_clock,
)
from commtag.merge.output import check_outputs, output_errors, publish, remove_stale, stage_json, temporary
from commtag.merge.records import CPU_OP_SOURCE, CollectiveInstance, Coverage, TraceAnnotations
from commtag.merge.runs import FileSpan
from commtag.merge.selection import FileSpans, Selection, file_spans
from commtag.merge.workers import SoloWorld, World

if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import Sidecar

#: ``analysis(instances, coverage)`` may add figures to each instance's ``args``
#: and return counters and markers for the trace. Under torchrun every merge
#: worker calls it, over every rank's instances.
AnalysisHook = Callable[[list[CollectiveInstance], Coverage], Optional[TraceAnnotations]]
DEFAULT_OUTPUT = "merged.pftrace"
ALIGN_MODES = ("none", "collectives")


@dataclass(slots=True)
class RankSummary:
    """What the lanes stage needs of a rank once its events are written."""

    rank: int
    host: str
    first_ns: Optional[int]
    #: ``(lane_name, lane_id, pg_uid, member ranks)`` of the groups this rank knows.
    groups: list[tuple[str, int, str, list[int]]]
    instances: list[CollectiveInstance] = field(default_factory=list)
    #: Lane name -> annotations of its kernel categories (from the rank's timeline).
    lane_kernels: dict[str, dict] = field(default_factory=dict)
    #: ``(first_ns, last_ns)`` of each of its trace files (see :class:`Coverage`).
    windows: list[tuple[int, int]] = field(default_factory=list)
    #: The world size its files claim.
    world_size: Optional[int] = None
    #: Events read, written and left out (by reason); None where nothing was written.
    account: Optional[EventAccount] = None
    #: What each merged file of the rank says of itself, for :func:`commtag.merge.runs.warnings`.
    files: list[FileSpan] = field(default_factory=list)


@dataclass(slots=True)
class MergeResult:
    output: Path
    ranks: list[int]
    instances: list[CollectiveInstance]
    alignment: Optional[Alignment] = None
    annotations: Optional[TraceAnnotations] = None
    #: With ``skip_bad_ranks``: the files left out, each with why (worker 0 has everyone's).
    skipped: list[MergeInputError] = field(default_factory=list)
    #: Things the user should know that did not stop the merge (a trace without sidecar).
    notices: list[str] = field(default_factory=list)
    #: Per merged rank, in rank order: events read, written, and left out by reason.
    accounts: list[EventAccount] = field(default_factory=list)
    #: Files that may not be of one run with the rest (``strict`` refuses them instead).
    warnings: list[str] = field(default_factory=list)


def default_output(inputs: Sequence[Path]) -> Path:
    first = inputs[0]
    return (first if first.is_dir() else first.parent) / DEFAULT_OUTPUT


def chunks(ranks: Sequence[RankInput], workers: int) -> list[list[RankInput]]:
    """Contiguous chunks in rank order, balanced by input size (worker 0 never empty)."""
    total = sum(r.size for r in ranks) or 1
    out: list[list[RankInput]] = [[] for _ in range(workers)]
    done = 0
    for r in ranks:
        w = min(workers - 1, int(done * workers / total))
        out[w].append(r)
        done += r.size
    return out


def merge(
    inputs: Sequence[Path | str] | Path | str,
    output: Optional[Path | str] = None,
    *,
    align: str = "none",
    json_dir: Optional[Path | str] = None,
    rank_pattern: Optional[str] = None,
    analysis: Optional[AnalysisHook] = None,
    graph_fallback: Optional[GraphFallback] = None,
    progress: Optional[bool] = None,
    world: Optional[World] = None,
    skip_bad_ranks: bool = False,
    rank: Optional[int] = None,
    list_left_out: bool = False,
    strict: bool = False,
    selection: Optional[Selection] = None,
) -> MergeResult:
    """Merge every rank's trace (and sidecar) under ``inputs`` into one Perfetto file.

    ``inputs``: directories (searched at any depth) and/or trace files.
    ``rank``: the rank of a single trace that does not name it. ``output``: default
    ``<first dir>/merged.pftrace``. ``align="collectives"`` corrects each
    host's clock from matched collectives (two passes over the inputs).
    ``json_dir``: also write each annotated trace there, as Chrome JSON.
    ``analysis``: see :data:`AnalysisHook`. ``graph_fallback``: see
    :data:`commtag.merge.attach.GraphFallback` (default: commtag.merge.graphs'
    order and kernel-name matching). ``world``: torchrun workers
    (:func:`commtag.merge.workers.launcher_world`); the result's instances are complete on worker 0.
    Raises :class:`MergeInputError` on bad input, writing nothing; with
    ``skip_bad_ranks`` bad files and ranks are left out and listed in the
    result's ``skipped`` instead (an error still when nothing is left).
    The result's ``accounts`` say, per rank, how many events were read and
    written and why the others were left out; ``list_left_out`` also lists
    each of those events (one line each, in ``EventAccount.listed``).
    Files that may be of another run (:mod:`commtag.merge.runs`) are listed
    in the result's ``warnings``; ``strict`` makes the first an error instead.
    ``selection``: the steps or time window kept, and the ranks written in detail
    (:mod:`commtag.merge.selection`; default: everything).
    """
    if align not in ALIGN_MODES:
        raise ValueError(f"align must be one of {ALIGN_MODES}, got {align!r}")
    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    if not paths:
        raise MergeInputError(".", "no input given")
    world = world or SoloWorld()
    skipped: Optional[list[MergeInputError]] = [] if skip_bad_ranks else None
    ranks = discover(paths, rank_pattern, skipped, rank=rank)
    notices = [f"{f.path}: no commtag sidecar; merged from the trace alone"
               for r in ranks for f in r.files if f.sidecar is None]
    out_path = Path(output) if output else default_output(paths)
    json_dir = Path(json_dir) if json_dir is not None else None
    check_outputs(out_path, json_dir, paths, ranks, skipped or ())
    # A merge killed before its cleanup left its temporaries here: remove them (never a live merge's).
    remove_stale([out_path.parent, *([json_dir] if json_dir is not None else [])])
    mine = chunks(ranks, world.size)[world.index]
    show = sys.stderr.isatty() if progress is None else progress

    alignment = None
    offsets: dict[int, int] = {}
    if align == "collectives":
        everyone = _exchange(world, lambda: _summaries_only(mine, graph_fallback, skipped), skipped)
        mine = [r for r in mine if r.rank in {s.rank for s in everyone}]
        alignment = estimate_offsets(
            [i for s in everyone for i in s.instances], {s.rank: s.host for s in everyone}
        )
        offsets = alignment.offsets

    origin = time_origin(ranks, offsets)
    spans_of = None if selection is None else file_spans(
        selection, [(f.path, f.base_ns + offsets.get(r.rank, 0) if f.base_ns > 0 else 0) for r in ranks for f in r.files],
        notices)
    # Worker 0 writes its ranks into what becomes the output, each other worker into a shard of
    # its own that worker 0 appends; all are temporaries named after their writer's pid.
    final_tmp = shard = temporary(out_path)
    shards: list[Path] = []
    #: --json files written under temporary names, renamed only once the merge has succeeded.
    staged: list[tuple[Path, Path]] = []

    def write_mine() -> list[RankSummary]:
        with output_errors(out_path), open(shard, "wb") as stream:
            return _write_ranks(stream, mine, offsets, origin, graph_fallback, json_dir, show,
                                header=world.index == 0, skipped=skipped, staged=staged,
                                list_left_out=list_left_out, spans_of=spans_of,
                                detailed=selection.detailed if selection is not None else None)

    try:
        # A bad input in any worker's ranks reaches every worker through the exchange.
        everyone = _exchange(world, write_mine, skipped)
        if not everyone:
            raise nothing_left(paths, skipped or [])
        warned = runs.warnings([f for s in everyone for f in s.files])
        if strict and warned:
            raise MergeInputError(warned[0][0], f"{warned[0][1]} (--strict refuses it)")
        merged = [s.rank for s in everyone]
        accounts = [s.account for s in everyone if s.account is not None]
        instances = [i for s in everyone for i in s.instances]
        settle_inferred(instances)
        timed_by_ops = sum(1 for i in instances if i.source == CPU_OP_SOURCE)
        if timed_by_ops:
            notices.append(f"{timed_by_ops} collective instances come from record_param_comms CPU ops "
                           "(no kernel carried collective metadata): host times, no bandwidth")
        covered = coverage(everyone)
        if covered.absent:
            notices.append(covered.describe_absent())
        with _collector_paused():  # the analysis and lanes add to every record: nothing cyclic to find
            annotations = analysis(instances, covered) if analysis is not None else None

        def write_lanes() -> dict:
            with output_errors(out_path), open(shard, "ab") as stream, _collector_paused():
                lanes.LanesWriter(origin, mine[0].rank if mine else 0).write(
                    stream, _lane_layout(everyone), instances,
                    annotations.counters if annotations else (), annotations.markers if annotations else (),
                    {(s.rank, lane): args for s in everyone for lane, args in s.lane_kernels.items()},
                    ranks={r.rank for r in mine},
                )
            return {"shard": str(shard)}

        # Every worker writes the lanes of its own ranks after them; worker 0 appends the shards
        # once all are complete.
        shards = [Path(part["shard"]) for part in _all_done(world, write_lanes) if part is not None]
        if world.index != 0:
            shard = None  # worker 0 appends it, then removes it
            publish(staged)
            return MergeResult(out_path, merged, [], alignment, skipped=skipped or [], notices=notices,
                               accounts=accounts)
        with output_errors(out_path):
            with open(final_tmp, "ab") as stream:
                for path in shards:
                    with open(path, "rb") as part:
                        while block := part.read(16 << 20):
                            stream.write(block)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(final_tmp, out_path)
        publish(staged)
        return MergeResult(out_path, merged, instances, alignment, annotations, skipped or [], notices, accounts,
                           [f"{path}: {problem}" for path, problem in warned])
    finally:
        leftovers = [final_tmp, *shards] if world.index == 0 else [shard] if shard else []
        for leftover in leftovers + [tmp for tmp, _ in staged]:
            with contextlib.suppress(OSError):  # e.g. ENOTDIR: the output's directory is a file
                leftover.unlink(missing_ok=True)


def coverage(summaries: Sequence[RankSummary]) -> Coverage:
    """The ranks read, their windows, and the world size most of them claim."""
    sizes = Counter(s.world_size for s in summaries if s.world_size)
    return Coverage({s.rank: list(s.windows) for s in summaries}, sizes.most_common(1)[0][0] if sizes else None)


def collect(
    inputs: Sequence[Path | str] | Path | str,
    *,
    align: str = "none",
    rank_pattern: Optional[str] = None,
    rank: Optional[int] = None,
    graph_fallback: Optional[GraphFallback] = None,
    on_rank: Optional[Callable[[int, DeviceWork], None]] = None,
) -> tuple[Coverage, list[CollectiveInstance]]:
    """The collection stage alone (discover, stream, attach, align), writing nothing.

    For ``commtag summary`` on a directory: the same instances (and
    coverage) the merge would analyze, without building the trace, each rank
    streamed as the merge streams it. ``on_rank(rank, work)`` gets each
    rank's kernel breakdowns by stream, graph launch and lane (the ones the
    merge writes).
    """
    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    ranks = discover(paths, rank_pattern, rank=rank)
    summaries = _summaries_only(ranks, graph_fallback, None, on_rank)
    instances = [i for s in summaries for i in s.instances]
    if align == "collectives":
        offsets = estimate_offsets(instances, {s.rank: s.host for s in summaries}).offsets
        for inst in instances:
            inst.start_ns += offsets.get(inst.rank, 0)
            inst.end_ns += offsets.get(inst.rank, 0)
        for s in summaries:
            shift = offsets.get(s.rank, 0)
            s.windows = [(first + shift, last + shift) for first, last in s.windows]
    settle_inferred(instances)
    return coverage(summaries), instances


def _exchange(world: World, produce: Callable[[], list[RankSummary]],
              skipped: Optional[list[MergeInputError]] = None) -> list[RankSummary]:
    """Every worker's summaries, in rank order; an input error anywhere stops all workers.

    ``skipped`` (--skip-bad-ranks) becomes every worker's skipped files. A
    worker keeps its own summaries as they are and decodes only the others'.
    """
    if world.size == 1:
        # Nothing to exchange: a JSON round trip of every instance would cost more than the merge.
        return sorted(produce(), key=lambda s: s.rank)
    mine: list[RankSummary] = []

    def step() -> dict:
        nonlocal mine
        mine = produce()
        return {**_to_wire(mine), "skipped": [[str(e.path), e.problem] for e in skipped or ()]}

    parts = _all_done(world, step)
    if skipped is not None:
        every = [[[str(e.path), e.problem] for e in skipped] if part is None else part["skipped"] for part in parts]
        union = dict.fromkeys((path, problem) for listed in every for path, problem in listed)
        skipped[:] = [MergeInputError(path, problem) for path, problem in union]
    return sorted((s for part in parts for s in (mine if part is None else _from_wire(part))), key=lambda s: s.rank)


def _all_done(world: World, step: Callable[[], Optional[dict]]) -> list[Optional[dict]]:
    """Run ``step`` on every worker and gather what each returned (None in this worker's own
    place); an input or output error on any worker stops all of them, each naming the first."""
    if world.size == 1:
        step()
        return [None]
    error: Optional[MergeInputError] = None
    try:
        payload = orjson.dumps(step() or {})
    except MergeInputError as exc:
        error = exc
        payload = orjson.dumps({"error": [str(exc.path), exc.problem]})
    parts = [None if i == world.index else orjson.loads(blob) for i, blob in enumerate(world.all_gather_bytes(payload))]
    for part in parts:
        if part is None and error is not None:
            raise error
        if part is not None and "error" in part:
            raise MergeInputError(*part["error"])
    return parts


_FIELDS = [f.name for f in fields(CollectiveInstance)]
_COMMON_AT = _FIELDS.index("common_args")
_RANKS_AT = _FIELDS.index("group_ranks")
#: Fields sent as an index into a table of texts: a lane name holds the group's ranks.
_TEXTS_AT = [_FIELDS.index(name) for name in ("pg_uid", "collective", "dtype", "source", "lane_name")]


def _to_wire(summaries: list[RankSummary]) -> dict:
    """Summaries as JSON data: each instance a list of its fields, its ``common_args``, texts
    and member ranks indexes into tables, so that what many instances share travels once."""
    index: dict[int, int] = {}
    table: list[dict] = []
    texts: dict[str, int] = {}
    rank_lists: dict[tuple, int] = {}
    out = []
    for s in summaries:
        rows = []
        for inst in s.instances:
            row = [getattr(inst, name) for name in _FIELDS]
            ref = index.get(id(inst.common_args))
            if ref is None:
                ref = index[id(inst.common_args)] = len(table)
                table.append(inst.common_args)
            row[_COMMON_AT] = ref
            for at in _TEXTS_AT:
                row[at] = texts.setdefault(row[at], len(texts))
            row[_RANKS_AT] = rank_lists.setdefault(row[_RANKS_AT], len(rank_lists))
            rows.append(row)
        out.append({"rank": s.rank, "host": s.host, "first_ns": s.first_ns, "groups": s.groups,
                    "lane_kernels": s.lane_kernels, "windows": s.windows, "world_size": s.world_size,
                    "files": [astuple(f) for f in s.files], "instances": rows,
                    "account": None if s.account is None else asdict(s.account)})
    return {"common": table, "texts": list(texts), "ranks": list(rank_lists), "summaries": out}


def _from_wire(data: dict) -> list[RankSummary]:
    table = [common(args) for args in data["common"]]
    texts = data["texts"]
    rank_lists = [shared(tuple(ranks)) for ranks in data["ranks"]]
    summaries = []
    for s in data["summaries"]:
        instances = []
        for row in s.pop("instances"):
            row[_COMMON_AT] = table[row[_COMMON_AT]]
            row[_RANKS_AT] = rank_lists[row[_RANKS_AT]]
            for at in _TEXTS_AT:
                row[at] = texts[row[at]]
            instances.append(CollectiveInstance(*row))
        s["groups"] = [tuple(g) for g in s["groups"]]
        s["windows"] = [tuple(w) for w in s["windows"]]
        s["account"] = None if s["account"] is None else EventAccount(**s["account"])
        s["files"] = [FileSpan(*f) for f in s["files"]]
        summaries.append(RankSummary(**s, instances=instances))
    return summaries


def _sidecar_of(f: TraceFile, skipped: Optional[list[MergeInputError]]) -> Optional[Sidecar]:
    """The file's sidecar, validated in full (discovery read only its head). A sidecar that
    fails is an error, or with ``skipped`` left out and its trace merged alone."""
    try:
        sidecar = load_sidecar(f.sidecar) if f.sidecar else None
    except MergeInputError as exc:
        if skipped is None:
            raise
        _note(skipped, exc.path, exc.problem)
        return None
    return sidecar


def _check_spans(rank: RankInput, files: list[FileSpan]) -> None:
    """Several files of one rank are steps one after another: their times must not overlap."""
    timed = sorted((f for f in files if f.first_ns is not None), key=lambda f: f.first_ns)
    for before, after in zip(timed, timed[1:]):
        if after.first_ns < before.last_ns:
            raise MergeInputError(after.path, f"claims rank {rank.rank} like {before.path}, and their times overlap: "
                                              "one rank cannot record two traces at once")


def _fallback(graph_fallback: Optional[GraphFallback]) -> Callable[[dict], GraphFallback]:
    """Per trace file, the graph-replay fallback: the caller's, else commtag.merge.graphs'."""
    return (lambda _trace: graph_fallback) if graph_fallback is not None else graphs.fallback_for


#: How far outside its trace's time span a sidecar's recorded calls may start (rounding, the
#: profiler starting its first event late): beyond it no call of the sidecar is in the trace.
PAIR_SLACK_NS = 10**9


def _check_pair(f: TraceFile, sidecar: Optional[Sidecar], first: Optional[int], last: Optional[int],
                offset: int) -> None:
    """A sidecar and its trace must record the same window: a sidecar none of whose calls starts
    within its trace's span comes from another run than the trace (one of them is stale)."""
    starts = [c.start_ns + offset for c in sidecar.collectives] if sidecar is not None else []
    if not starts or first is None or any(first - PAIR_SLACK_NS <= t <= last + PAIR_SLACK_NS for t in starts):
        return
    raise MergeInputError(
        f.path, f"its sidecar {f.sidecar} records {len(starts)} calls from {wall_clock(min(starts) - offset)} "
                f"to {wall_clock(max(starts) - offset)}, none within this trace's {wall_clock(first - offset)} to "
                f"{wall_clock(last - offset)}: the two come from different runs")


def _note(skipped: list[MergeInputError], path: Path, problem: str) -> None:
    """Add a skipped file once (--align reads every file twice)."""
    if not any((e.path, e.problem) == (path, problem) for e in skipped):
        skipped.append(MergeInputError(path, problem))


def _convert_rank(rank: RankInput, new_converter: Callable[[], RankConverter], graph_fallback: Optional[GraphFallback],
                  skipped: Optional[list[MergeInputError]], source: Callable[[Path], object] = TraceStream,
                  spans_of: Optional[FileSpans] = None) -> Optional[tuple[RankConverter, list[FileSpan]]]:
    """A converter (from ``new_converter``) fed every file of ``rank``, read by ``source``,
    and what each file says of itself; ``spans_of`` gives the times each file keeps (--steps/--window).

    With ``skipped`` (--skip-bad-ranks), a bad file and its sidecar are left out and listed
    there, and the rank is converted again from its other files: None when none is left.
    """
    fallback = _fallback(graph_fallback)
    files = list(rank.files)
    while files:
        converter = new_converter()
        try:
            told = []
            for f in files:
                sidecar = _sidecar_of(f, skipped)
                stream = source(f.path)
                spans = spans_of(f.path, converter.offset) if spans_of is not None else None
                first, last = converter.add_file(f.path, stream, sidecar, fallback, spans)
                _check_pair(f, sidecar, first, last, converter.offset)
                told.append(_file_span(rank.rank, f, stream.header, sidecar, first, last, converter.offset))
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


def _file_span(rank: int, f: TraceFile, header: dict, sidecar: Optional[Sidecar], first: Optional[int],
               last: Optional[int], offset: int) -> FileSpan:
    """What a converted file says of itself: its own clock's span (without --align's offset), host, ids."""
    return FileSpan(str(f.path), rank, None if first is None else first - offset,
                    None if last is None else last - offset, str(header.get("host_name") or ""),
                    sidecar.host if sidecar is not None else "", sidecar.run_id if sidecar is not None else "",
                    str(header.get("trace_id") or ""))


def _attached_whole(rank: RankInput, offset: int, graph_fallback: Optional[GraphFallback]
                    ) -> list[tuple[Path, dict]]:
    """The rank's files read whole, their events annotated in place as the merge annotates them."""
    read: list[tuple[Path, WholeTrace]] = []

    def whole(path: Path) -> WholeTrace:
        read.append((path, WholeTrace(path)))
        return read[-1][1]

    _convert_rank(rank, lambda: RankConverter(rank.rank, None, offset_ns=offset), graph_fallback, None, whole)
    return [(path, w.trace) for path, w in read]


def _summaries_only(ranks: list[RankInput], graph_fallback: Optional[GraphFallback],
                    skipped: Optional[list[MergeInputError]],
                    on_rank: Optional[Callable[[int, DeviceWork], None]] = None) -> list[RankSummary]:
    """Each rank's collective instances (and kernel breakdowns, to ``on_rank``), streamed
    like the merge itself: --align's first pass and :func:`collect`."""
    summaries = []
    for rank in ranks:
        with _collector_paused():
            converted = _convert_rank(rank, lambda: RankConverter(rank.rank, None, breakdowns=on_rank is not None),
                                      graph_fallback, skipped)
            if converted is not None:
                converter, files = converted
                summaries.append(_rank_summary(rank, converter, None, {}, files))
                if on_rank is not None:
                    converter.categories.finish()
                    on_rank(rank.rank, converter.categories)
    return summaries


@contextlib.contextmanager
def _collector_paused():
    """No cyclic garbage collection while a rank is in memory.

    A parsed rank is millions of container objects without reference cycles:
    every full collection walks all of them and frees none (about a quarter
    of a merge's time). They are freed by reference counting when the rank is
    dropped; the collector resumes then, with little left to walk.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _write_ranks(stream, mine: list[RankInput], offsets: dict[int, int], origin: int, graph_fallback,
                 json_dir, show: bool, header: bool, skipped: Optional[list[MergeInputError]],
                 staged: list[tuple[Path, Path]], list_left_out: bool = False,
                 spans_of: Optional[FileSpans] = None,
                 detailed: Optional[Callable[[int], bool]] = None) -> list[RankSummary]:
    ranks: Iterable[RankInput] = mine
    if show:
        from tqdm import tqdm  # only a visible progress bar needs it

        ranks = tqdm(mine, desc="commtag merge", unit="rank")
    summaries = []
    seq = trace_writer.rank_sequence(mine[0].rank, origin) if mine else None
    for rank in ranks:
        with _collector_paused():
            summary = _write_rank(stream, rank, seq, offsets, origin, graph_fallback, json_dir, header, skipped,
                                  staged, list_left_out, spans_of, detailed is None or detailed(rank.rank))
        if summary is not None:
            header = False
            summaries.append(summary)
    return summaries


def _rank_summary(rank: RankInput, converter: RankConverter, first_ns: Optional[int],
                  lane_kernels: dict[str, dict], files: list[FileSpan]) -> RankSummary:
    groups = dict(converter.groups)
    for inst in converter.instances:
        groups.setdefault(inst.pg_uid, (inst.lane_name, inst.lane_id, inst.pg_uid, list(inst.group_ranks)))
    return RankSummary(rank.rank, converter.host, first_ns, list(groups.values()), converter.instances, lane_kernels,
                       converter.windows, converter.world_size, files=files)


def _write_rank(stream, rank: RankInput, seq: trace_writer.SequenceWriter, offsets: dict[int, int], origin: int,
                graph_fallback, json_dir, header: bool, skipped: Optional[list[MergeInputError]],
                staged: list[tuple[Path, Path]], list_left_out: bool = False,
                spans_of: Optional[FileSpans] = None, detailed: bool = True) -> Optional[RankSummary]:
    """Stream, attach and write one rank on the worker's sequence ``seq``; its summary, or None
    when ``skipped`` took it (interned strings its events had added are written with the next rank's).
    A rank not ``detailed`` (--detail) is read and attached but only its process is written: its
    lanes come with everyone's."""
    offset = offsets.get(rank.rank, 0)
    converted = _convert_rank(rank, lambda: RankConverter(rank.rank, seq if detailed else None, offset_ns=offset,
                                                          list_left_out=list_left_out, breakdowns=True),
                              graph_fallback, skipped, spans_of=spans_of)
    if converted is None:
        return None
    converter, files = converted
    timeline = converter.timeline()
    summary = _rank_summary(rank, converter, timeline.first_ns, timeline.lane_kernels, files)
    summary.account = converter.account()
    if header:
        stream.write(trace_writer.header(timeline.first_ns or origin, origin))
    trace_writer.write_rank(stream, timeline, seq)
    if json_dir is not None:
        # The annotated JSON needs every event at once: read the rank whole again, this rank only.
        for path, trace in _attached_whole(rank, offset, graph_fallback):
            target = Path(json_dir) / path.name
            staged.append((stage_json(target, trace), target))
    return summary


#: How far before the earliest base time the origin lies: room for times a little before
#: their trace's start (a sidecar's recorded span). Events within 34 s of the origin take
#: 5-byte varints, and Kineto never records before its base time.
ORIGIN_MARGIN_NS = 10**9


def time_origin(ranks: Sequence[RankInput], offsets: dict[int, int]) -> int:
    """The wall-clock ns every timestamp of the merged file counts from.

    The same on every merge worker (from discovery and the offsets, which all
    workers share), so shards concatenate; 0 when a file's base time is not
    known from its first bytes.
    """
    bases = [f.base_ns + offsets.get(r.rank, 0) for r in ranks for f in r.files]
    if not bases or any(f.base_ns <= 0 for r in ranks for f in r.files):
        return 0
    return max(0, min(bases) - ORIGIN_MARGIN_NS)


def _lane_layout(summaries: Sequence[RankSummary]) -> dict[int, list[tuple[str, int]]]:
    """Each rank's lanes, in one global order: a group's lane on every loaded member.

    Larger groups come first (the world group on top), then groups by their
    name as torch numbers them ("1" before "10"), so the order reads like the
    program's group creation. Only groups with at least one collective
    anywhere get lanes; membership comes from the group tables (ranks), or
    from having instances on it.
    """
    used = {i.lane_name for s in summaries for i in s.instances}
    sort_keys: dict[str, tuple] = {}
    members: dict[str, set[int]] = {}
    loaded = {s.rank for s in summaries}

    def lane(name: str, pg_uid: str, size: int) -> None:
        group_name = pg_uid.rpartition(":")[0] or pg_uid
        numbered = (0, int(group_name), "") if group_name.isdigit() else (1, 0, group_name)
        sort_keys.setdefault(name, (-size, numbered, name))

    for s in summaries:
        for lane_name, _, pg_uid, ranks in s.groups:
            if lane_name in used:
                lane(lane_name, pg_uid, len(ranks))
                members.setdefault(lane_name, set()).update(r for r in ranks if r in loaded)
        for inst in s.instances:
            lane(inst.lane_name, inst.pg_uid, inst.group_size)
            members.setdefault(inst.lane_name, set()).add(s.rank)
    order = {name: i for i, name in enumerate(sorted(sort_keys, key=sort_keys.__getitem__))}
    layout: dict[int, list[tuple[str, int]]] = {}
    for name, ranks in members.items():
        for r in ranks:
            layout.setdefault(r, []).append((name, order[name]))
    for rows in layout.values():
        rows.sort(key=lambda row: row[1])
    return layout

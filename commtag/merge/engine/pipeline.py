"""The merge, stage by stage: discover, plan, (align), write ranks, exchange, analyze,
write lanes, publish.

:func:`merge` reads as that list; each stage is a function below taking the
:class:`MergePlan`, which holds what the merge decided before reading any
event (inputs, options, ranks, this worker's share, alignment, time origin,
output). Memory stays near one rank's encoded events: a rank is read in
batches (commtag.merge.rank.convert), written once its files are read, and only
its CollectiveInstance records are kept. After the last rank the analysis
hook sees every instance, and the lanes block (process-group lanes,
cross-rank flows, counters, markers) is written. The output appears
atomically (:class:`commtag.merge.engine.output.MergeOutput`); a failed merge leaves
any previous output untouched.

Under ``-j`` or torchrun (:mod:`commtag.merge.engine.jobs`) each merge worker
takes whole segments of consecutive ranks (:mod:`commtag.merge.engine.segments`)
and writes them to a part of its own; workers exchange their ranks'
summaries, share out the analysis by lane (:mod:`commtag.merge.engine.shards`:
each holds its own ranks' records and its lanes'), write their segments'
lanes into a lanes part, and worker 0 appends the others' parts, then every
lanes part: the bytes one process writes. A caller's own analysis hook sees
every rank's instances, which every worker then holds. On several hosts
(:mod:`commtag.merge.engine.hosts`) each node finds its own files, each worker
takes consecutive ranks its node holds, and worker 0 writes the header and
then every worker's part, received over the gloo group, in rank order.

``collect`` (``commtag summary`` on a directory) streams ranks the same
way, writing nothing; ``--json`` reads each rank whole again: it writes
every event back.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

from commtag.atomic import temporary
from commtag.kernels import DeviceWork
from commtag.merge.engine import budget, hosts, segments, shards
from commtag.merge.inputs import runs
from commtag.merge.pftrace import lanes, writer
from commtag.merge.analysis.align import Alignment, estimate_offsets
from commtag.merge.analysis.analyze import Analysis, MergeAnalysis
from commtag.merge.rank.attach import settle_inferred
from commtag.merge.rank.convert import RankConverter
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.jsonstream import TraceStream, WholeTrace
from commtag.merge.inputs.load import RankInput, TraceFile, discover, load_sidecar, nothing_left, wall_clock
from commtag.merge.engine.output import MergeOutput
from commtag.merge.records import (
    CollectiveInstance, Coverage, FileSpan, GroupLane, Interner, RankSummary,
    TraceAnnotations, describe_ranks,
)
from commtag.merge.inputs.selection import (
    NOT_IN_DETAIL, FileSpans, describe, describe_numbers, file_spans, step_marks,
)
from commtag.merge.engine.exchange import all_done, exchange
from commtag.merge.engine.worlds import SoloWorld, World
from commtag.merge.engine.options import AnalysisHook, MergeOptions, MergeResult, default_output


if TYPE_CHECKING:  # pydantic models: loaded at run time only where a sidecar is read
    from commtag.schema import Sidecar


@dataclass
class MergePlan:
    """One merge as decided before any event is read; every stage reads it.

    The same on every merge worker except ``mine`` and ``output`` (each
    worker's own share and files), so that what the workers write fits together.
    """

    inputs: list[Path]
    options: MergeOptions
    world: World
    #: Every rank discovery found, in rank order.
    ranks: list[RankInput]
    #: This worker's contiguous chunk of ``ranks`` (:func:`commtag.merge.engine.hosts.chunks`; on several
    #: hosts :func:`commtag.merge.engine.hosts.assign`).
    mine: list[RankInput]
    output: MergeOutput
    #: With ``skip_bad_ranks``, the files left out so far, each with why; else None (the first error stops).
    skipped: Optional[list[MergeInputError]]
    #: Things the user should know that do not stop the merge.
    notices: list[str] = field(default_factory=list)
    #: ``align="collectives"``: each rank's clock correction and how it was estimated.
    alignment: Optional[Alignment] = None
    #: The wall-clock ns every timestamp of the merged file counts from (:func:`time_origin`).
    origin: int = 0
    #: With a selection, the times each file keeps (known once the clocks are aligned).
    spans_of: Optional[FileSpans] = None
    #: This merge's: its instances share equal values through it, and only they.
    interner: Interner = field(default_factory=Interner)

    def offset(self, rank: int) -> int:
        """The clock correction (ns) added to every time of ``rank``."""
        return self.alignment.offsets.get(rank, 0) if self.alignment is not None else 0

    def detailed(self, rank: int) -> bool:
        """Whether ``rank``'s whole timeline is written (--detail), not only its process and lanes."""
        return self.options.selection is None or self.options.selection.detailed(rank)

    @property
    def lead(self) -> bool:
        """Whether this worker writes the output (and the header, and reports)."""
        return self.world.index == 0


def merge(
    inputs: Sequence[Path | str] | Path | str,
    output: Optional[Path | str],
    options: MergeOptions,
    *,
    analysis: Optional[AnalysisHook] = None,
    world: Optional[World] = None,
) -> MergeResult:
    """Merge every rank's trace (and sidecar) under ``inputs`` into one Perfetto file.

    The engine under :func:`commtag.merge.merge`, which builds ``options``
    (see there for each), runs the analysis by default and owns the workers:
    here ``analysis`` is only what the caller passes (:data:`AnalysisHook`)
    and ``world`` the caller's (``-j`` or torchrun workers; None: this
    process alone); the result's instances are complete on worker 0, except
    where several workers shared the merge's analysis (each held only its share).
    Raises :class:`MergeInputError` on bad input, writing nothing; with
    ``options.skip_bad_ranks`` bad files and ranks are left out and listed
    in the result's ``skipped`` instead (an error still when nothing is left).
    """
    plan = make_plan(inputs, output, options, world or SoloWorld())
    with plan.output:
        if options.align == "collectives":
            align_clocks(plan)
        check_detail(plan)
        place_in_time(plan)
        check_size(plan)
        # The merge's own analysis is shared out (engine.shards: each worker holds its ranks' records and
        # its lanes'); a caller's hook sees every instance, which every worker then holds.
        held = shards.Held() if analysis is None or isinstance(analysis, MergeAnalysis) else None
        produce = (lambda: write_ranks(plan)) if held is None else (
            lambda: shards.hold(write_ranks(plan), held, plan.world.index))
        # A bad input in any worker's ranks reaches every worker through the exchange.
        everyone = exchange(plan.world, produce, plan.interner, plan.skipped, plan.notices)
        warned = gather(plan, everyone)
        layout = _lane_layout(everyone)
        with _collector_paused():  # the analysis and lanes add to every record: nothing cyclic to find
            if held is None:
                instances = [i for s in everyone for i in s.instances]
                settle_inferred(instances)
                annotations = analysis(instances, coverage(everyone))
                flows = None
            else:
                orders = {name: order for rows in layout.values() for name, order in rows}
                written = shards.analyse(plan.world, held, everyone, analysis, coverage(everyone), orders,
                                         plan.interner)
                instances, flows = held.ordered(), written.flows
                annotations = TraceAnnotations(written.counters, written.markers) if analysis is not None else None
                if analysis is not None:
                    analysis.result = written.analysis or Analysis([], written.findings, {}, [], coverage(everyone))
        kernels = held.lane_kernels if held is not None else {
            (s.rank, lane): args for s in everyone for lane, args in s.lane_kernels.items()}
        # Every worker writes the lanes of its own segments; worker 0 appends the others' ranks, then every lanes part.
        into = None if plan.output.apart else temporary(plan.output.path.with_name(plan.output.path.name + ".lanes"))
        try:
            parts = _from_everyone(plan.world, lambda: write_lanes(plan, layout, instances, annotations, kernels,
                                                                   flows, into))
            if plan.output.apart:
                assemble(plan, everyone, parts)
            else:  # worker 0 removes every part it appends, each worker's lanes too
                plan.output.publish([Path(part[what]) for what in ("shard", "lanes") for part in parts])
        except BaseException:
            if into is not None:
                into.unlink(missing_ok=True)
            raise
    lead = plan.lead  # another worker's result is not the one to report: no instances, figures, warnings
    whole = plan.world.size == 1 or held is None  # a worker of several holds only its own ranks' instances
    return MergeResult(plan.output.path, [s.rank for s in everyone], instances if lead and whole else [],
                       slices=sum(s.slices for s in everyone),
                       alignment=plan.alignment, annotations=annotations if lead else None,
                       skipped=plan.skipped or [], notices=plan.notices,
                       accounts=[s.account for s in everyone if s.account is not None],
                       warnings=[f"{path}: {problem}" for path, problem in warned] if lead else [], lead=lead)


def make_plan(inputs: Sequence[Path | str] | Path | str, output: Optional[Path | str], options: MergeOptions,
              world: World) -> MergePlan:
    """Discover the ranks, check the outputs, start the workers (``-j``) and take this worker's share."""
    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    if not paths:
        raise MergeInputError(".", "no input given")
    skipped: Optional[list[MergeInputError]] = [] if options.skip_bad_ranks else None
    apart = world.apart
    if apart:  # hosts of their own: each node finds its files, and each worker merges some its node holds
        shares = hosts.share(world, paths, options.rank_pattern, skipped, options.rank)
        ranks, mine, local, notices = shares.ranks, shares.mine, shares.local, shares.notices
    else:
        # A -j worker takes what worker 0 discovered (it says what it skipped in the exchange).
        ranks = local = world.discovered or discover(paths, options.rank_pattern, skipped, rank=options.rank)
        notices = []
    out = MergeOutput(Path(output) if output else default_output(paths), options.json_dir, lead=world.index == 0,
                      apart=apart)
    out.check(paths, local, skipped or ())
    notices += [f"{f.path}: no commtag sidecar; merged from the trace alone"
                for r in ranks for f in r.files if f.sidecar is None]
    world.start(ranks)  # -j: the workers it starts are known now
    if not apart:
        mine = segments.share(ranks, world.size, world.index)
    return MergePlan(paths, options, world, ranks, mine, out, skipped, notices)


def align_clocks(plan: MergePlan) -> None:
    """--align collectives: a first pass over every rank's collectives estimates each host's
    clock offset; ranks the pass left out (skipped) are not written."""
    everyone = exchange(plan.world, lambda: _summaries_only(plan.mine, plan.interner, plan.skipped),
                        plan.interner, plan.skipped)
    kept = {s.rank for s in everyone}
    plan.mine = [r for r in plan.mine if r.rank in kept]
    plan.alignment = estimate_offsets([i for s in everyone for i in s.instances], {s.rank: s.host for s in everyone})


def place_in_time(plan: MergePlan) -> None:
    """The time origin every worker writes from and, with a selection, the times each file keeps."""
    offsets = plan.alignment.offsets if plan.alignment else {}
    plan.origin = time_origin(plan.ranks, offsets)
    if plan.options.selection is not None:
        bases = [(f.path, f.base_ns + offsets.get(r.rank, 0) if f.base_ns > 0 else 0) for r in plan.ranks for f in r.files]
        plan.spans_of = file_spans(plan.options.selection, bases, plan.notices)


def check_detail(plan: MergePlan) -> None:
    """--detail naming a rank no input holds is a typo or the wrong job: an error, not a silent
    merge without that rank's timeline (a notice with --skip-bad-ranks, which may have left it out)."""
    selection = plan.options.selection
    absent = sorted(selection.detail - {r.rank for r in plan.ranks}) if selection and selection.detail else []
    if not absent:
        return
    problem = (f"--detail names rank{'s' if len(absent) > 1 else ''} {describe_numbers(absent)}, which no trace "
               f"here holds (ranks {describe_numbers([r.rank for r in plan.ranks])})")
    if plan.skipped is None:
        raise MergeInputError(_selection_subject(plan), problem)
    plan.notices.append(f"{_selection_subject(plan)}: {problem}")


def _selection_subject(plan: MergePlan) -> Path:
    """What an error of the selection names: the inputs, or on several hosts (whose inputs are
    each node's own folders) the output, so that every worker says the same one line."""
    return plan.output.path if plan.world.apart else plan.inputs[0]


def check_kept(plan: MergePlan, everyone: Sequence[RankSummary]) -> None:
    """A --steps or --window that keeps no event of any rank is an error, not an empty trace."""
    selection = plan.options.selection
    if selection is None or not selection.selects_time:
        return
    for s in everyone:
        if s.slices or (s.account is not None and (s.account.written or s.account.left_out.get(NOT_IN_DETAIL))):
            return
    problem = f"{describe(selection)} keeps no event of any rank"
    # Every merged file holds steps (--steps refuses one without). On several hosts the first rank's
    # file may be on another node: every worker must say the same, so none names its steps there.
    if selection.steps is not None and not plan.world.apart:
        first = Path(everyone[0].files[0].path)
        problem += f" (rank {everyone[0].rank}'s {first.name} holds steps {describe_numbers(sorted(step_marks(first)))})"
    elif selection.window is not None:
        problem += " (START_MS:END_MS count from the earliest trace start)"
    raise MergeInputError(_selection_subject(plan), problem)


def check_size(plan: MergePlan) -> None:
    """Stop before writing a trace estimated above ``max_output``, saying what would fit.
    Every worker estimates alike (the same sampled ranks), so all stop together."""
    limit = plan.options.max_output
    if limit is None:
        return
    offsets = plan.alignment.offsets if plan.alignment else None
    selection = plan.options.selection
    if plan.output.apart:  # each worker reads only its own node's files: each measures its share
        if sum(part["bound"] for part in _from_everyone(plan.world, lambda: {
                "bound": budget.upper_bound(plan.mine)})) <= limit:
            return
        found = budget.Estimate()
        for part in _from_everyone(plan.world, lambda: _estimate_to_wire(
                budget.estimate(plan.mine, selection, plan.spans_of, offsets))):
            found.timeline.update((r, b) for r, b in part["timeline"])
            found.lanes.update((r, b) for r, b in part["lanes"])
            found.steps = sorted({*found.steps, *part["steps"]})
    else:
        if budget.upper_bound(plan.ranks) <= limit:
            return
        found = budget.estimate(plan.ranks, selection, plan.spans_of, offsets)
    total = found.total(selection)
    if total <= limit:
        return
    fits = found.fits(limit, selection)
    advice = f"{' or '.join(fits)} would fit" if fits else "no --detail or --steps fits: raise --max-output"
    raise MergeInputError(plan.output.path, f"the merged trace would take about {budget.describe_size(total)}, "
                                            f"above --max-output {budget.describe_size(limit)}; {advice}")


def _from_everyone(world: World, step: Callable[[], dict]) -> list[dict]:
    """What ``step`` returned on every worker, this one's included (:func:`all_done`)."""
    mine: dict = {}

    def run() -> dict:
        nonlocal mine
        mine = step()
        return mine

    return [mine if part is None else part for part in all_done(world, run)]


def _estimate_to_wire(found: budget.Estimate) -> dict:
    return {"timeline": list(found.timeline.items()), "lanes": list(found.lanes.items()), "steps": found.steps}


def assemble(plan: MergePlan, everyone: list[RankSummary], shards: list[Optional[dict]]) -> None:
    """Many hosts: every worker with ranks sends its part to worker 0, which writes the header
    (as one process would: from the first rank's first event) and the parts in rank order."""
    if not plan.lead:
        if plan.mine:
            plan.world.send_part(plan.output.part)
        plan.output.publish([])
        return
    firsts = [(plan.mine[0].rank if plan.mine else None) if part is None else part["first"] for part in shards]
    order = sorted((first, index) for index, first in enumerate(firsts) if first is not None)
    first_ns = everyone[0].first_ns if everyone else None
    plan.output.assemble(writer.header(first_ns or plan.origin, plan.origin),
                         [plan.output.copy_part if index == plan.world.index
                          else functools.partial(plan.world.receive_part, index) for _, index in order])


def gather(plan: MergePlan, everyone: list[RankSummary]) -> list[tuple[str, str]]:
    """The files that may be of another run, from every rank's summary; what the user should
    know about them goes to the plan's notices."""
    if not everyone:
        raise nothing_left(plan.inputs, plan.skipped or [])
    warned = runs.warnings([f for s in everyone for f in s.files])
    if plan.options.strict and warned:
        raise MergeInputError(warned[0][0], f"{warned[0][1]} (--strict refuses it)")
    check_kept(plan, everyone)
    timed_by_ops = sum(s.timed_by_ops for s in everyone)
    if timed_by_ops:
        plan.notices.append(f"{timed_by_ops} collective instances are timed by their CPU op (record_param_comms "
                            "or c10d; no kernel of theirs carried collective metadata): host times, no bandwidth")
    said: dict[str, list[int]] = {}
    for s in everyone:
        for note in s.notes:
            said.setdefault(note, []).append(s.rank)
    plan.notices += [f"{describe_ranks(ranks)}: {note}" for note, ranks in said.items()]  # once per note, not per rank
    covered = coverage(everyone)
    if covered.absent:
        plan.notices.append(covered.describe_absent())
    return warned


def write_lanes(plan: MergePlan, layout: dict[int, list[tuple[str, int]]], instances: list[CollectiveInstance],
                annotations: Optional[TraceAnnotations], lane_kernels: dict[tuple[int, str], dict],
                flows: Optional[lanes.InstanceFlows], into: Optional[Path]) -> dict:
    """The lanes blocks of this worker's segments into ``into`` (None: after its ranks in its part,
    one block); where its part and lanes are."""
    first_of = _segment_firsts(plan)
    runs: dict[int, tuple[set[int], list[CollectiveInstance]]] = {r.rank: (set(), []) for r in plan.mine}
    for r in plan.mine:
        runs[first_of[r.rank]][0].add(r.rank)
    for inst in instances:
        runs[first_of[inst.rank]][1].append(inst)
    counters = annotations.counters if annotations else ()
    markers = annotations.markers if annotations else ()
    with plan.output.errors(), open(into or plan.output.part, "wb" if into else "ab") as stream, _collector_paused():
        for first, (ranks, own) in runs.items():
            if ranks:
                lanes.LanesWriter(plan.origin, first).write(
                    stream, layout, own, [c for c in counters if c.rank in ranks], [m for m in markers if m.rank in ranks],
                    lane_kernels, ranks=ranks, flows=flows)
    return {"shard": str(plan.output.part), "lanes": None if into is None else str(into),
            "first": plan.mine[0].rank if plan.mine else None}


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
    summaries = _summaries_only(ranks, Interner(), None, on_rank)
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


def _convert_rank(rank: RankInput, new_converter: Callable[[], RankConverter],
                  skipped: Optional[list[MergeInputError]], source: Callable[[Path], object] = TraceStream,
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
                first, last = converter.add_file(f.path, stream, sidecar, spans)
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


def _attached_whole(rank: RankInput, offset: int, interner: Interner) -> list[tuple[Path, dict]]:
    """The rank's files read whole, their events annotated in place as the merge annotates them."""
    read: list[tuple[Path, WholeTrace]] = []

    def whole(path: Path) -> WholeTrace:
        read.append((path, WholeTrace(path)))
        return read[-1][1]

    _convert_rank(rank, lambda: RankConverter(rank.rank, None, offset_ns=offset, interner=interner), None, whole)
    return [(path, w.trace) for path, w in read]


def _summaries_only(ranks: list[RankInput], interner: Interner,
                    skipped: Optional[list[MergeInputError]],
                    on_rank: Optional[Callable[[int, DeviceWork], None]] = None) -> list[RankSummary]:
    """Each rank's collective instances (and kernel breakdowns, to ``on_rank``), streamed
    like the merge itself: --align's first pass and :func:`collect`."""
    summaries = []
    for rank in ranks:
        with _collector_paused():
            converted = _convert_rank(rank, lambda: RankConverter(rank.rank, None, breakdowns=on_rank is not None,
                                                                  interner=interner), skipped)
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


def _segment_firsts(plan: MergePlan) -> dict[int, int]:
    """Rank -> the first rank of the run its blocks share sequences with: its segment
    (:mod:`commtag.merge.engine.segments`), or on hosts of their own this worker's ranks."""
    if plan.output.apart:
        return {r.rank: plan.mine[0].rank for r in plan.mine}
    return segments.firsts(plan.ranks)


def write_ranks(plan: MergePlan) -> list[RankSummary]:
    """Stream, attach and write this worker's ranks into its part, one sequence per segment;
    worker 0's part starts with the trace's header. What is kept of each rank."""
    ranks: Iterable[RankInput] = plan.mine
    show = sys.stderr.isatty() if plan.options.progress is None else plan.options.progress
    if show:
        from tqdm import tqdm  # only a visible progress bar needs it

        ranks = tqdm(plan.mine, desc="commtag merge", unit="rank")
    summaries = []
    header = plan.lead and not plan.output.apart  # apart: worker 0 writes it when it assembles the parts
    first_of = _segment_firsts(plan)
    seq: Optional[writer.SequenceWriter] = None
    segment = None
    with plan.output.open_part() as stream:
        for rank in ranks:
            if segment != first_of[rank.rank]:
                segment = first_of[rank.rank]
                seq = writer.rank_sequence(segment, plan.origin)
            with _collector_paused():
                summary = _write_rank(plan, stream, seq, rank, header)
            if summary is not None:
                header = False
                summaries.append(summary)
    return summaries


def _rank_summary(rank: RankInput, converter: RankConverter, first_ns: Optional[int],
                  lane_kernels: dict[str, dict], files: list[FileSpan]) -> RankSummary:
    groups = dict(converter.groups)
    for inst in converter.instances:
        groups.setdefault(inst.pg_uid, GroupLane(inst.lane_name, inst.lane_id, inst.pg_uid, inst.group_ranks))
    summary = RankSummary(rank.rank, converter.host, first_ns, list(groups.values()), converter.instances,
                          lane_kernels, converter.windows, converter.world_size, files=files, notes=converter.notes)
    summary.count_lanes()
    return summary


def _write_rank(plan: MergePlan, stream, seq: writer.SequenceWriter, rank: RankInput,
                header: bool) -> Optional[RankSummary]:
    """Stream, attach and write one rank on the worker's sequence ``seq`` (after the trace's
    header when ``header``); its summary, or None when the plan's ``skipped`` took it
    (interned strings its events had added are written with the next rank's).
    A rank not detailed (--detail) is read and attached but only its process is written: its
    lanes come with everyone's."""
    offset = plan.offset(rank.rank)
    encoder = seq if plan.detailed(rank.rank) else None
    converted = _convert_rank(
        rank, lambda: RankConverter(rank.rank, encoder, offset_ns=offset, list_left_out=plan.options.list_left_out,
                                    breakdowns=True, interner=plan.interner),
        plan.skipped, spans_of=plan.spans_of)
    if converted is None:
        return None
    converter, files = converted
    timeline = converter.timeline()
    summary = _rank_summary(rank, converter, timeline.first_ns, timeline.lane_kernels, files)
    summary.account = converter.account()
    if header:
        stream.write(writer.header(timeline.first_ns or plan.origin, plan.origin))
    writer.write_rank(stream, timeline, seq)
    if plan.options.json_dir is not None:
        # The annotated JSON needs every event at once: read the rank whole again, this rank only.
        for path, trace in _attached_whole(rank, offset, plan.interner):
            plan.output.stage_json(path.name, trace)
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
    used = {row[0] for s in summaries for row in s.lanes_used}
    sort_keys: dict[str, tuple] = {}
    members: dict[str, set[int]] = {}
    loaded = {s.rank for s in summaries}

    def lane(name: str, pg_uid: str, size: int) -> None:
        group_name = pg_uid.rpartition(":")[0] or pg_uid
        numbered = (0, int(group_name), "") if group_name.isdigit() else (1, 0, group_name)
        sort_keys.setdefault(name, (-size, numbered, name))

    for s in summaries:
        for group in s.groups:
            if group.lane_name in used:
                lane(group.lane_name, group.pg_uid, len(group.ranks))
                members.setdefault(group.lane_name, set()).update(r for r in group.ranks if r in loaded)
        for name, pg_uid, group_size, *_ in s.lanes_used:
            lane(name, pg_uid, group_size)
            members.setdefault(name, set()).add(s.rank)
    order = {name: i for i, name in enumerate(sorted(sort_keys, key=sort_keys.__getitem__))}
    layout: dict[int, list[tuple[str, int]]] = {}
    for name, ranks in members.items():
        for r in ranks:
            layout.setdefault(r, []).append((name, order[name]))
    for rows in layout.values():
        rows.sort(key=lambda row: row[1])
    return layout

"""The merge, stage by stage: discover, plan, (align), write ranks, exchange, analyse, write lanes, publish.

:func:`merge` reads as that list; each stage is a function below taking the
:class:`MergePlan`, which holds what the merge decided before reading any
event (inputs, options, ranks, this worker's share, alignment, time origin,
output). Memory stays near one rank's encoded events: a rank is read in
batches (commtag.merge.rank.convert), written once its files are read, and only
its CollectiveInstance records are kept (:class:`commtag.merge.engine.owned.Held`).
After the last rank the analysis is shared out between the workers by the one driver,
:mod:`commtag.merge.engine.shards` (one process is a world of one), then the lanes block
(process-group lanes, cross-rank flows, counters, markers) is written. The output appears
atomically; a failed merge leaves any previous output untouched.

With ``-j`` or under torchrun (:mod:`commtag.merge.engine.worlds`) each merge worker takes a
contiguous chunk of ranks and writes them to a part of its own, analyses the collectives it
owns and sends their figures to the workers holding their members, writes the lanes of its
own ranks, and worker 0 appends the others' parts after its own. Blocks only use ids derived
from their rank, so the file is the single-process one, byte for byte. On several hosts
(:mod:`commtag.merge.engine.hosts`) each node finds its own files, each worker takes
consecutive ranks its node holds, and worker 0 writes the header and then every worker's
part, received over the gloo group, in rank order. A caller's own analysis hook
(:data:`AnalysisHook`, :func:`commtag.merge.engine.owned.run_hook`) is the one stage that holds
every instance in one process.
``--json`` reads each rank whole again: it writes every event back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from commtag.kernels import DeviceWork
from commtag.merge.engine import budget, hosts
from commtag.merge.inputs import runs, stepmatch
from commtag.merge.inputs.clock import time_origin
from commtag.merge.pftrace import lanes, writer
from commtag.merge.ids import sequence_block
from commtag.merge.pftrace.sequence import SequenceWriter
from commtag.merge.analysis.align import Alignment, estimate_offsets, with_clocks
from commtag.merge.rank.attach import settle_inferred
from commtag.merge.rank.convert import RankConverter
from commtag.merge.collector import collector_paused
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.load import RankInput, discover, nothing_left
from commtag.merge.engine.output import MergeOutput, NoOutput
from commtag.merge.records import CollectiveInstance, Coverage, Interner, RankSummary, TraceAnnotations
from commtag.identity import describe_ranks
from commtag.merge.inputs.selection import (
    NOT_IN_DETAIL, FileSpans, Selection, describe, describe_numbers, event_range, kept_by, step_marks,
)
from commtag.merge.engine.exchange import all_done, exchange, from_everyone
from commtag.merge.engine.owned import Held, OwnLanes, run_hook
from commtag.merge.engine.routes import carrier
from commtag.merge.engine.shards import settle as settle_shares, analyse as share_analysis
from commtag.merge.analysis.hook import MergeAnalysis
from commtag.merge.engine.worlds import SoloWorld, TorchWorld, World
from commtag.merge.engine.options import AnalysisHook, MergeOptions, MergeResult, default_output, progress_bar
from commtag.merge.rank.stage import attached_whole, convert_rank, coverage, rank_summary, summaries_only


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
    #: The wall-clock ns every timestamp of the merged file counts from (:func:`commtag.merge.inputs.clock.time_origin`).
    origin: int = 0
    #: With a selection, the times each file keeps (known once the clocks are aligned).
    spans_of: Optional[FileSpans] = None
    #: With --window, the job's first event start and last event end (ns): what it counts from.
    events: Optional[tuple[int, int]] = None
    #: This merge's: its instances share equal values through it, and only they.
    interner: Interner = field(default_factory=Interner)
    #: What gets each rank's kernel breakdowns once it is read, besides the trace (:func:`collect`).
    on_rank: Optional[Callable[[int, DeviceWork], None]] = None

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


@collector_paused()  # the whole merge: nothing it makes is in a cycle (commtag/merge/collector.py)
def merge(
    inputs: Sequence[Path | str] | Path | str,
    output: Optional[Path | str],
    options: MergeOptions,
    *,
    analysis: Optional[AnalysisHook | MergeAnalysis] = None,
    world: Optional[World] = None,
) -> MergeResult:
    """Merge every rank's trace (and sidecar) under ``inputs`` into one Perfetto file.

    The engine under :func:`commtag.merge.merge`, which builds ``options``
    (see there for each), runs the analysis by default and owns the workers:
    here ``analysis`` is only what the caller passes (:class:`MergeAnalysis`,
    or a caller's own :data:`AnalysisHook`) and ``world`` the caller's (``-j``
    or torchrun workers; None: this process alone, a world of one). Worker 0's
    result is the same whatever the workers; its instances are read back from
    the output when asked for.
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
        held = Held(carrier(plan.world))  # a world of one holds its records as objects, a worker up to a bound
        # A bad input in any worker's ranks reaches every worker through the exchange.
        everyone = exchange(plan.world, lambda: write_ranks(plan, held.take), plan.interner, plan.skipped,
                            plan.notices)
        warned = gather(plan, everyone, held)
        covered = with_clocks(coverage(everyone, kept_by(plan.options.selection)), plan.alignment)  # hosts, clocks
        shown = functools.partial(progress_bar, plan.options, "commtag analysis", unit="part")
        # The analysis is shared out between the workers, one or several (engine/shards.py);
        # a caller's own hook runs first, over every rank's instances.
        if analysis is None or isinstance(analysis, MergeAnalysis):
            outcome = share_analysis(plan.world, held, analysis, covered, plan.interner, shown)
            annotations = outcome.annotations
        else:
            annotations = run_hook(plan.world, held, analysis, covered, plan.interner)
            outcome = share_analysis(plan.world, held, None, covered, plan.interner, shown)
        # Every worker writes the lanes of its own ranks; worker 0 appends the others' ranks, then all lanes.
        shards = all_done(plan.world, lambda: write_lanes(plan, everyone, annotations, held, outcome.lanes))
        if plan.output.apart:
            assemble(plan, everyone, shards)
        else:
            plan.output.publish(shards)
    lead = plan.lead  # another worker's result is not the one to report: no figures, warnings
    return MergeResult(plan.output.path, [s.rank for s in everyone], slices=sum(held.counts.values()),
                       alignment=plan.alignment,
                       skipped=plan.skipped or [], notices=plan.notices,
                       accounts=[s.account for s in everyone if s.account is not None],
                       warnings=[f"{path}: {problem}" for path, problem in warned] if lead else [], lead=lead)


def make_plan(inputs: Sequence[Path | str] | Path | str, output: Optional[Path | str], options: MergeOptions,
              world: World, write: bool = True) -> MergePlan:
    """Discover the ranks, check the outputs, start the workers (``-j``) and take this worker's share
    (``write``: False for a plan that writes nothing, :func:`collect`)."""
    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    if not paths:
        raise MergeInputError(".", "no input given")
    skipped: Optional[list[MergeInputError]] = [] if options.skip_bad_ranks else None
    apart = world.apart
    if apart:  # hosts of their own: each node finds its files, and each worker merges some its node holds
        shares = hosts.share(world, paths, options, Path(output) if output else None, skipped)
        ranks, mine, local, notices = shares.ranks, shares.mine, shares.local, shares.notices
    else:
        # A -j worker takes what worker 0 discovered (it says what it skipped in the exchange).
        notices = []
        ranks = local = world.discovered or discover(paths, options.rank_pattern, skipped, rank=options.rank,
                                                     notices=notices)
    where = Path(output) if output else default_output(paths)
    out = MergeOutput(where, options.json_dir, lead=world.index == 0, apart=apart) if write else NoOutput(where)
    out.check(paths, local, skipped or ())
    if write:  # what a merge says of its output; a plan writing nothing (summary DIR) says what it read
        notices += [f"{f.path}: no commtag sidecar; merged from the trace alone"
                    for r in ranks for f in r.files if f.sidecar is None]
    world.start(ranks)  # -j: the workers it starts are known now
    if not apart:
        mine = hosts.chunks(ranks, world.size, sequence_block(len(ranks)))[world.index]
    return MergePlan(paths, options, world, ranks, mine, out, skipped, notices)


def align_clocks(plan: MergePlan) -> None:
    """--align collectives: a first pass over every rank's collectives estimates each host's
    clock offset; ranks the pass left out (skipped) are not written."""
    everyone = exchange(plan.world, lambda: summaries_only(plan.mine, plan.interner, plan.skipped),
                        plan.interner, plan.skipped)
    kept = {s.rank for s in everyone}
    plan.mine = [r for r in plan.mine if r.rank in kept]
    plan.alignment = estimate_offsets([i for s in everyone for i in s.instances], {s.rank: s.host for s in everyone})


def place_in_time(plan: MergePlan) -> None:
    """The time origin every worker writes from and, with a selection, the times each file keeps."""
    offsets = plan.alignment.offsets if plan.alignment else {}
    plan.origin = time_origin([(f.base_ns, offsets.get(r.rank, 0)) for r in plan.ranks for f in r.files])
    selection = plan.options.selection
    if selection is not None:
        if selection.window is not None:  # each worker reads its own files; every one gets the job's range
            parts = from_everyone(plan.world, lambda: {"range": event_range(
                (f.path, offsets.get(r.rank, 0)) for r in plan.mine for f in r.files)})
            found = [part["range"] for part in parts if part["range"] is not None]
            plan.events = (min(f[0] for f in found), max(f[1] for f in found)) if found else None
        plan.spans_of = stepmatch.selected_spans(plan, functools.partial(from_everyone, plan.world), _selection_subject(plan))


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


def check_kept(plan: MergePlan, everyone: Sequence[RankSummary], counts: dict[int, int]) -> None:
    """A --steps or --window that keeps no event of any rank is an error, not an empty trace
    (``counts``: each rank's instances; the summaries travel without them)."""
    selection = plan.options.selection
    if selection is None or not selection.selects_time:
        return
    for s in everyone:
        if counts.get(s.rank) or (s.account is not None and (s.account.written or s.account.left_out.get(NOT_IN_DETAIL))):
            return
    problem = f"{describe(selection)} keeps no event of any rank"
    # Every merged file holds steps (--steps refuses one without). On several hosts the first rank's
    # file may be on another node: every worker must say the same, so none names its steps there.
    if selection.steps is not None and not plan.world.apart:
        first = Path(everyone[0].files[0].path)
        problem += f" (rank {everyone[0].rank}'s {first.name} holds steps {describe_numbers(sorted(step_marks(first)))})"
    elif selection.window is not None:
        problem += (f" (START_MS:END_MS count from the job's first event; events lie from 0 to "
                    f"{(plan.events[1] - plan.events[0]) / 1e6:.3f} ms)" if plan.events is not None
                    else " (no rank's trace holds a timed event)")
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
        if sum(part["bound"] for part in from_everyone(plan.world, lambda: {
                "bound": budget.upper_bound(plan.mine)})) <= limit:
            return
        found = budget.Estimate()
        for part in from_everyone(plan.world, lambda: _estimate_to_wire(
                budget.estimate(plan.mine, selection, plan.spans_of, offsets))):
            found.timeline.update((r, b) for r, b in part["timeline"])
            found.lanes.update((r, b) for r, b in part["lanes"])
            found.steps = sorted({*found.steps, *part["steps"]})
            found.fixed += part["fixed"]
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


def _estimate_to_wire(found: budget.Estimate) -> dict:
    return {"timeline": list(found.timeline.items()), "lanes": list(found.lanes.items()), "steps": found.steps,
            "fixed": found.fixed}


def assemble(plan: MergePlan, everyone: list[RankSummary], shards: list[Optional[dict]]) -> None:
    """Many hosts: every worker with ranks sends its part and lanes to worker 0, which writes the
    header (as one process would: from the first rank's first event), the parts in rank order, then the lanes."""
    world = plan.world
    assert isinstance(world, TorchWorld)  # only torchrun's workers on hosts of their own are apart
    if not plan.lead:
        if plan.mine:
            world.send_part(plan.output.part)
            world.send_part(plan.output.lanes)
        plan.output.publish([])
        return
    firsts = [(plan.mine[0].rank if plan.mine else None) if part is None else part["first"] for part in shards]
    order = sorted((first, index) for index, first in enumerate(firsts) if first is not None)
    first_ns = everyone[0].first_ns if everyone else None
    plan.output.assemble(writer.header(first_ns or plan.origin, plan.origin),
                         [own if index == plan.world.index else functools.partial(world.receive_part, index)
                          for own in (plan.output.copy_part, plan.output.copy_lanes) for _, index in order])


def gather(plan: MergePlan, everyone: list[RankSummary], held: Held) -> list[tuple[str, str]]:
    """Every rank's instance counts and inferred Seqs settled into ``held``, and the files that may
    be of another run; what the user should know about them goes to the plan's notices."""
    if not everyone:
        raise nothing_left(plan.inputs, plan.skipped or [])
    warned = runs.suspects(everyone)
    if plan.options.strict and warned:
        raise MergeInputError(warned[0][0], f"{warned[0][1]} (--strict refuses it)")
    settle_shares(plan.world, held)
    check_kept(plan, everyone, held.counts)
    if held.timed_by_ops:
        plan.notices.append(f"{held.timed_by_ops} collective instances are timed by their CPU op (record_param_comms "
                            "or c10d; no kernel of theirs carried collective metadata): host times, no bandwidth")
    said: dict[str, list[int]] = {}
    for s in everyone:
        for note in s.notes:
            said.setdefault(note, []).append(s.rank)
    plan.notices += [f"{describe_ranks(ranks)}: {note}" for note, ranks in said.items()]  # once per note, not per rank
    covered = coverage(everyone)
    plan.notices += [said for said in (covered.describe_absent(), covered.step_numbers)
                     if said and said not in plan.notices]
    return warned


def write_lanes(plan: MergePlan, everyone: list[RankSummary], annotations: Optional[TraceAnnotations],
                held: Held, own: OwnLanes) -> dict:
    """The lanes of this worker's ranks, into its lanes file; where its part and lanes are
    (``held``, ``own``: what this worker learnt of every rank, and its ranks' instances with what
    the analysis gave them)."""
    own.taken = progress_bar(plan.options, "commtag lanes", len(own), "lane")
    with plan.output.open_lanes() as stream:
        lanes.LanesWriter(plan.origin, len(plan.ranks)).write(
            stream, lanes.lane_layout(everyone, held.used), own, own.flows, held.lane_kernels,
            annotations.counters if annotations else (), annotations.markers if annotations else (),
            ranks={r.rank for r in plan.mine},
        )
    own.taken.close()
    return {"shard": str(plan.output.part), "lanes": str(plan.output.lanes),
            "first": plan.mine[0].rank if plan.mine else None}


@collector_paused()
def collect(
    inputs: Sequence[Path | str] | Path | str,
    *,
    align: str = "none",
    rank_pattern: Optional[str] = None,
    rank: Optional[int] = None,
    on_rank: Optional[Callable[[int, DeviceWork], None]] = None,
    warnings: Optional[list[str]] = None,
    notices: Optional[list[str]] = None,
) -> tuple[Coverage, list[CollectiveInstance]]:
    """The merge's plan up to its ranks (discover, align, stream, attach), writing nothing.

    For ``commtag summary`` on a directory: the instances (and coverage) the merge
    would analyze, each rank streamed and placed in time by the merge's own stages, no
    timeline encoded (as ``--detail none``). ``on_rank(rank, work)`` gets each rank's kernel
    breakdowns by stream, graph launch and lane (the ones the merge writes). ``warnings`` gets
    the merge's warnings (the files that may not be of one run), ``notices`` its notices.
    """
    options = MergeOptions(align=align, rank_pattern=rank_pattern, rank=rank, progress=False, max_output=None,
                           selection=Selection(detail=frozenset()))
    plan = make_plan(inputs, None, options, SoloWorld(), write=False)
    plan.on_rank = on_rank
    with plan.output:
        if align == "collectives":
            align_clocks(plan)
        place_in_time(plan)
        summaries = write_ranks(plan)
    if warnings is not None:
        warnings += [f"{path}: {problem}" for path, problem in runs.suspects(summaries)]
    if notices is not None:
        notices += plan.notices
    instances = [i for s in summaries for i in s.instances]
    settle_inferred(instances)
    return with_clocks(coverage(summaries), plan.alignment), instances


def write_ranks(plan: MergePlan, keep: Optional[Callable[[RankSummary], RankSummary]] = None) -> list[RankSummary]:
    """Stream, attach and write this worker's ranks into its part, on their blocks' sequences;
    worker 0's part starts with the trace's header. What is kept of each rank (``keep``: what
    becomes of each summary once its rank is written)."""
    bar = progress_bar(plan.options, "commtag merge", len(plan.mine), "rank")
    summaries = []
    header = plan.lead and not plan.output.apart  # apart: worker 0 writes it when it assembles the parts
    sequences = writer.rank_sequences(len(plan.ranks), plan.origin)
    with plan.output.open_part() as stream:
        for rank in plan.mine:
            summary = _write_rank(plan, stream, sequences(rank.rank), rank, header)
            bar.update()
            if summary is not None:
                header = False
                summaries.append(keep(summary) if keep is not None else summary)
    bar.close()
    return summaries


def _write_rank(plan: MergePlan, stream, seq: SequenceWriter, rank: RankInput,
                header: bool) -> Optional[RankSummary]:
    """Stream, attach and write one rank on its block's sequence ``seq`` (after the trace's header
    when ``header``); its summary, or None when the plan's ``skipped`` took it (interned strings its
    events had added are written with the next rank's of its block).
    A rank not detailed (--detail) is read and attached but only its process is written: its
    lanes come with everyone's."""
    offset = plan.offset(rank.rank)
    encoder = seq if plan.detailed(rank.rank) else None
    converted = convert_rank(
        rank, lambda: RankConverter(rank.rank, encoder, offset_ns=offset, list_left_out=plan.options.list_left_out,
                                    breakdowns=True, interner=plan.interner),
        plan.skipped, spans_of=plan.spans_of)
    if converted is None:
        return None
    converter, files = converted
    timeline = converter.timeline()
    if plan.on_rank is not None:
        plan.on_rank(rank.rank, converter.categories)
    summary = rank_summary(rank, converter, timeline, files, plan.options.nccl_inspector)
    summary.account = converter.account()
    if plan.output.writes:  # a plan writing nothing (collect) encodes no packet: not even the protos load
        if header:
            stream.write(writer.header(timeline.first_ns or plan.origin, plan.origin))
        writer.write_rank(stream, timeline, seq)
    if plan.options.json_dir is not None:
        # The annotated JSON needs every event at once: read the rank whole again, this rank only.
        for path, trace in attached_whole(rank, offset, plan.interner):
            plan.output.stage_json(path.name, trace)
    return summary

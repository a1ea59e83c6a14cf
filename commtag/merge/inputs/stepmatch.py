"""Which profiler step of each rank holds the same work, when ranks number their steps apart.

torch's profiler numbers a rank's steps by that rank's own ``prof.step()`` calls
(``ProfilerStep#N``): a rank that calls step() once more than the others names the same
iteration one higher. ``--steps 3`` must keep the same work on every rank, so steps are matched
by what they hold: the Seqs of their collectives. A group's Seq numbers its collectives alike
on every member (p2p aside: its Seq is per rank), so where rank b's step M holds Seqs of a group
that rank a's step N holds, they are one step. Each rank is matched to the lowest rank with
steps (the reference: ``--steps`` counts its numbers) through the groups they share, and its
numbers are shifted by what the matched steps show. A rank whose matched steps show different
shifts (its steps are cut at other places than its peers') cannot be matched: --steps is refused
for it. A rank with no collective Seq in common with the reference's steps is taken by its own
numbers, and the notice says so.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol, Sequence

from commtag.merge.inputs.clock import checked_base_ns
from commtag.merge.inputs.jsonstream import TraceFormatError, TraceStream
from commtag.merge.inputs.load import MergeInputError, RankInput
from commtag.merge.inputs.selection import FileSpans, Selection, describe_numbers, file_spans
from commtag.merge.inputs.sidecars import load_sidecar
from commtag.merge.records import CollectiveInstance
from commtag.vocab import (
    ANN_SEQ_FROM, COLLECTIVE_NAME_KEY, COMMS_OP, GPU_CATEGORIES, NON_COLLECTIVE_NAMES, P2P_COLLECTIVES, PG_NAME_KEY, PROFILER_STEP_PREFIX,
    SEQ_KEY,
)

#: ``(step, group name, lowest Seq, highest Seq)``: a group's collectives in one step of a rank.
StepSeqs = list[tuple[int, str, int, int]]
#: Step numbers and Seqs at or above this are no evidence (they travel between merge workers as int64).
_LIMIT = 1 << 63


def rank_step_seqs(rank: RankInput) -> StepSeqs:
    """The Seqs of each group's collectives in each of a rank's steps, from its traces' eager
    metadata and its sidecars' records. A file that does not read gives none: its conversion
    says what is wrong with it."""
    found: dict[tuple[int, str], list[int]] = {}
    for trace in rank.files:
        try:
            for step, group, seq in _file_seqs(trace.path, trace.sidecar):
                span = found.setdefault((step, group), [seq, seq])
                span[0], span[1] = min(span[0], seq), max(span[1], seq)
        except (TraceFormatError, MergeInputError, OSError):
            continue
    return sorted((step, group, low, high) for (step, group), (low, high) in found.items())


def _file_seqs(path: Path, sidecar: Optional[Path]) -> Iterable[tuple[int, str, int]]:
    """``(step, group name, Seq)`` of each non-p2p collective of one trace file that lies in a step:
    from its ``ProfilerStep#N`` start to the next one's (the file's last step to its end), by the
    host-side times of its record_param_comms ops and its sidecar's records."""
    stream = TraceStream(path)
    starts: list[tuple[float, int]] = []
    calls: list[tuple[float, str, int]] = []  # (ts us, group, Seq)
    for batch in stream.batches():
        for e in batch:
            if e.__class__ is not dict or e.get("ph") != "X" or (ts := e.get("ts")).__class__ not in (int, float):
                continue
            name, args = e.get("name"), e.get("args")
            if name.__class__ is not str or e.get("cat") in GPU_CATEGORIES:
                continue  # device work runs after its step's CPU slice: only host times say the step
            if name.startswith(PROFILER_STEP_PREFIX):
                number = name[len(PROFILER_STEP_PREFIX):]
                if number.isascii() and number.isdigit() and int(number) < _LIMIT:
                    starts.append((ts, int(number)))
            elif (name == COMMS_OP and args.__class__ is dict and (seq := args.get(SEQ_KEY)).__class__ is int
                  and 0 <= seq < _LIMIT):
                group, collective = args.get(PG_NAME_KEY), args.get(COLLECTIVE_NAME_KEY)
                if group.__class__ is str and collective not in P2P_COLLECTIVES and collective not in NON_COLLECTIVE_NAMES:
                    calls.append((ts, group, seq))
    if sidecar is not None:
        base_ns = checked_base_ns(path, stream.header.get("baseTimeNanoseconds", 0))
        for c in load_sidecar(sidecar, base_ns).collectives:
            a = c.annotation
            if not a.is_p2p and a.replay is None and a.capture_id is None and a.seq < _LIMIT:
                calls.append(((c.start_ns - base_ns) / 1000, a.pg_name, a.seq))
    starts.sort()
    times = [ts for ts, _ in starts]
    for ts, group, seq in calls:
        at = bisect.bisect_right(times, ts) - 1
        if at >= 0:
            yield starts[at][1], group, seq


@dataclass(slots=True)
class StepMatch:
    """How each rank's step numbers relate to the reference rank's."""

    #: The lowest rank with steps: --steps counts its numbers (None: no rank has steps).
    reference: Optional[int] = None
    #: Rank -> its step number minus the reference's for the same work (matched ranks only).
    shifts: dict[int, int] = field(default_factory=dict)
    #: Ranks whose matched steps show different shifts -> why (their steps cannot be matched).
    unmatchable: dict[int, str] = field(default_factory=dict)
    #: Ranks with steps but no collective Seq in common with the reference's: taken by their numbers.
    unknown: list[int] = field(default_factory=list)

    @property
    def disagree(self) -> bool:
        return bool(self.unmatchable) or any(self.shifts.values())

    def describe(self) -> str:
        """The notice for ranks whose step numbers disagree ('' when all agree)."""
        if not self.disagree:
            return ""
        by_shift: dict[int, list[int]] = {}
        for rank, shift in sorted(self.shifts.items()):
            if shift:
                by_shift.setdefault(shift, []).append(rank)
        parts = [f"rank{'s' if len(ranks) > 1 else ''} {describe_numbers(ranks)} number{'' if len(ranks) > 1 else 's'} "
                 f"the same work {abs(shift)} step{'s' if abs(shift) > 1 else ''} {'above' if shift > 0 else 'below'} "
                 f"rank {self.reference}'s" for shift, ranks in sorted(by_shift.items())]
        parts += [f"rank {rank}'s steps cannot be matched ({why})" for rank, why in sorted(self.unmatchable.items())]
        if self.unknown:
            several = len(self.unknown) > 1
            parts.append(f"rank{'s' if several else ''} {describe_numbers(self.unknown)} share{'' if several else 's'} "
                         f"no collective with rank {self.reference}'s steps: taken by {'their' if several else 'its'} "
                         "own numbers")
        return (f"the ranks' {PROFILER_STEP_PREFIX}N numbers disagree: {'; '.join(parts)}. Steps were matched by the "
                f"Seqs of the collectives each holds; --steps counts rank {self.reference}'s steps")

    def steps_of(self, rank: int, steps: frozenset[int]) -> frozenset[int]:
        """The step numbers of ``rank`` that hold the work of the reference's ``steps``."""
        shift = self.shifts.get(rank, 0)
        return frozenset(n + shift for n in steps) if shift else steps


def match(found: dict[int, StepSeqs]) -> StepMatch:
    """Match every rank's steps to the reference's through the groups ranks share (see the module)."""
    ranks = sorted(r for r, seqs in found.items() if seqs)
    result = StepMatch()
    if not ranks:
        return result
    members: dict[str, list[int]] = {}
    index: dict[int, dict[str, list[tuple[int, int, int]]]] = {}
    for rank in ranks:
        mine = index[rank] = {}
        for step, group, low, high in found[rank]:
            mine.setdefault(group, []).append((low, high, step))
        for group in mine:
            members.setdefault(group, []).append(rank)
    result.reference = ranks[0]
    result.shifts[ranks[0]] = 0
    todo = [ranks[0]]
    expanded: set[str] = set()  # a group's members are matched from the first of them reached (its Seqs are theirs)
    while todo:
        a = todo.pop()
        for group in sorted(index[a].keys() - expanded):
            expanded.add(group)
            for b in members[group]:
                if b in result.shifts or b in result.unmatchable:
                    continue
                votes = _votes(index[a], index[b])
                if len(votes) > 1:
                    shown = ", ".join(f"{n} by {d:+d}" for d, n in votes.most_common(3))
                    result.unmatchable[b] = f"its steps holding Seqs of rank {a}'s are shifted by different counts: {shown}"
                elif votes:
                    result.shifts[b] = result.shifts[a] + next(iter(votes))
                    todo.append(b)
    result.unknown = [r for r in ranks if r not in result.shifts and r not in result.unmatchable]
    return result


def _votes(a: dict[str, list[tuple[int, int, int]]], b: dict[str, list[tuple[int, int, int]]]) -> Counter:
    """How many (group, step) pairs show each shift of b's step numbers over a's (overlapping Seqs)."""
    votes: Counter = Counter()
    for group, spans in a.items():
        for low, high, step in spans:
            for other_low, other_high, other_step in b.get(group, ()):
                if other_low <= high and low <= other_high:
                    votes[other_step - step] += 1
    return votes


def instance_step_seqs(instances: Iterable[CollectiveInstance], steps: Sequence[tuple[int, int, int]]) -> StepSeqs:
    """:data:`StepSeqs` of one rank's collective instances (by their pg uid) in its ``(step, start_ns,
    end_ns)`` steps, each from its start to the next one's: only Seqs its members share (no p2p, no
    graph replay, none the merge numbered)."""
    starts = sorted((start, number) for number, start, _ in steps if number < _LIMIT)
    times = [start for start, _ in starts]
    found: dict[tuple[int, str], list[int]] = {}
    for inst in instances:
        if inst.is_p2p or inst.replay is not None or inst.arg(ANN_SEQ_FROM) is not None or not 0 <= inst.seq < _LIMIT:
            continue
        at = bisect.bisect_right(times, inst.start_ns) - 1
        if at >= 0:
            span = found.setdefault((starts[at][1], inst.pg_uid), [inst.seq, inst.seq])
            span[0], span[1] = min(span[0], inst.seq), max(span[1], inst.seq)
    return sorted((step, group, low, high) for (step, group), (low, high) in found.items())


def matched_steps(ranks: Iterable[RankInput], found: dict[int, StepSeqs], steps: frozenset[int],
                  notices: list[str], subject: Path) -> dict[Path, frozenset[int]]:
    """For --steps: each file's own numbers of the reference's ``steps``, where its rank numbers
    them apart (files of ranks that agree are left out); the notice when ranks disagree. A rank
    whose steps cannot be matched is refused: its numbers would keep other work than its peers'."""
    result = match(found)
    if result.unmatchable:
        rank, why = min(result.unmatchable.items())
        raise MergeInputError(subject, f"--steps cannot keep the same work on every rank: rank {rank}'s steps cannot "
                                       f"be matched to rank {result.reference}'s ({why}); --window can select")
    notice = result.describe()
    if notice and notice not in notices:
        notices.append(notice)
    return {f.path: result.steps_of(r.rank, steps) for r in ranks if result.shifts.get(r.rank) for f in r.files}


class _Options(Protocol):
    @property
    def selection(self) -> Optional[Selection]: ...


class SelectionPlan(Protocol):
    """What :func:`selected_spans` reads of the merge's plan (read-only, so a plan holding lists matches)."""

    @property
    def options(self) -> _Options: ...
    @property
    def events(self) -> Optional[tuple[int, int]]: ...
    @property
    def notices(self) -> list[str]: ...
    @property
    def ranks(self) -> Sequence[RankInput]: ...
    @property
    def mine(self) -> Sequence[RankInput]: ...


def selected_spans(plan: SelectionPlan, gather: Callable[[Callable[[], dict]], list[dict]],
                   subject: Path) -> Optional[FileSpans]:
    """:func:`~commtag.merge.inputs.selection.file_spans` for the plan's selection, --steps matched
    across ranks first. ``gather``: every merge worker's result of a call (each reads its own ranks)."""
    selection = plan.options.selection
    if selection is None:
        return None
    matched = None
    if selection.steps is not None:
        parts = gather(lambda: {"seqs": [[r.rank, rank_step_seqs(r)] for r in plan.mine]})
        found = {rank: [tuple(s) for s in seqs] for part in parts for rank, seqs in part["seqs"]}
        matched = matched_steps(plan.ranks, found, selection.steps, plan.notices, subject)
    return file_spans(selection, plan.events, plan.notices, matched)

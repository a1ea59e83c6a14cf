"""What part of a job the merge writes: profiler steps, a time window, the ranks in detail.

``--steps 3,5-7`` keeps the events of those ``ProfilerStep#N`` on every rank;
``--window START_MS:END_MS`` keeps the events that start in that window,
counted from the job's first event (the earliest start of a slice or instant
of any rank: a trace's baseTimeNanoseconds can lie weeks before it); ``--detail 0,8-15`` writes
the full timelines (threads, streams, launches) of those ranks only, every
rank still giving its lanes. Events left out by a selection are counted in the
rank's account under :data:`OUTSIDE_SELECTION`, never dropped silently.

A step's span on a rank runs from its ``ProfilerStep#N`` slice's start to the
start of the file's next step (to the file's end for its last step): device
work launched in a step and running after its CPU slice ended stays with it,
and every event of the file belongs to at most one step.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from commtag.merge.inputs.jsonstream import TraceFormatError, TraceStream
from commtag.merge.inputs.load import MergeInputError
from commtag.merge.inputs.clock import checked_base_ns
from commtag.vocab import PROFILER_STEP_PREFIX

#: The account's reason for events a --steps or --window selection left out.
OUTSIDE_SELECTION = "outside the --steps/--window selection"
#: The account's reason for events of a rank whose timeline --detail does not write.
NOT_IN_DETAIL = "timeline not written (--detail)"
_RANGE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")
_MAX_LISTED = 1 << 20
_INF = float("inf")
#: Phases of the events --window keeps or leaves out by their start: slices and instants.
_TIMED_PHASES = ("X", "i", "I")
#: Half-open ns intervals [start, end), sorted and disjoint.
Spans = list[tuple[int, int]]


def parse_numbers(spec: str, what: str) -> frozenset[int]:
    """``"0,8-15"`` -> {0, 8, ..., 15}; ValueError naming ``what`` on anything else."""
    out: set[int] = set()
    for part in spec.split(","):
        found = _RANGE.fullmatch(part)
        if not found:
            raise ValueError(f"{what} {spec!r}: {part.strip()!r} is not a number or a range like 8-15")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) is not None else low
        if high < low:
            raise ValueError(f"{what} {spec!r}: the range {low}-{high} is empty")
        if high - low > _MAX_LISTED:
            raise ValueError(f"{what} {spec!r}: the range {low}-{high} is too long")
        out.update(range(low, high + 1))
    return frozenset(out)


def parse_detail(spec: str) -> Optional[frozenset[int]]:
    """``all`` -> None (every rank), ``none`` -> no rank, else a list of ranks and ranges."""
    text = spec.strip().lower()
    if text == "all":
        return None
    if text == "none":
        return frozenset()
    return parse_numbers(spec, "--detail")


def parse_window(spec: str) -> tuple[int, int]:
    """``"START_MS:END_MS"`` -> (start_ns, end_ns), relative to the job's first event."""
    start, colon, end = spec.partition(":")
    try:
        if not colon:
            raise ValueError
        start_ns, end_ns = round(float(start) * 1e6), round(float(end) * 1e6)
    except (ValueError, OverflowError):  # OverflowError: inf
        raise ValueError(f"--window {spec!r} is not START_MS:END_MS (e.g. 120:180.5)") from None
    if not 0 <= start_ns < end_ns:
        raise ValueError(f"--window {spec!r}: START_MS must be >= 0 and before END_MS")
    return start_ns, end_ns


def describe(selection: "Selection") -> str:
    """The --steps or --window option as the user would write it."""
    if selection.steps is not None:
        return f"--steps {describe_numbers(sorted(selection.steps))}"
    if selection.window is not None:
        return f"--window {selection.window[0] / 1e6:.15g}:{selection.window[1] / 1e6:.15g}"
    return "no --steps or --window"


def kept_by(selection: Optional["Selection"]) -> str:
    """The --steps or --window a merge kept, as the user wrote it; "" when it keeps all time."""
    return describe(selection) if selection is not None and selection.selects_time else ""


def describe_numbers(numbers: Sequence[int]) -> str:
    """{0, 1, 2, 5} -> "0-2,5": the inverse of :func:`parse_numbers`."""
    out: list[str] = []
    ordered = sorted(numbers)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


@dataclass(frozen=True, slots=True)
class Selection:
    """The steps or window to keep (at most one of them), and the ranks written in detail."""

    steps: Optional[frozenset[int]] = None
    #: (start, end) ns relative to the job's first event (:func:`event_range`).
    window: Optional[tuple[int, int]] = None
    #: Ranks whose full timelines are written; None: every rank.
    detail: Optional[frozenset[int]] = None

    def __post_init__(self) -> None:
        if self.steps is not None and self.window is not None:
            raise ValueError("--steps and --window cannot be used together: choose one")

    @property
    def selects_time(self) -> bool:
        return self.steps is not None or self.window is not None

    def detailed(self, rank: int) -> bool:
        return self.detail is None or rank in self.detail


def keeper(spans: Spans) -> Callable[[int], bool]:
    """A fast test of a start time against sorted disjoint half-open spans."""
    if len(spans) == 1:
        low, high = spans[0]
        return lambda ts: low <= ts < high
    lows = [low for low, _ in spans]
    highs = [high for _, high in spans]

    def keep(ts: int) -> bool:
        k = bisect.bisect_right(lows, ts) - 1
        return k >= 0 and ts < highs[k]

    return keep


def step_marks(path: Path, offset_ns: int = 0) -> dict[int, tuple[int, int]]:
    """Step number -> (start, end) ns of each ``ProfilerStep#N`` slice of one trace file.

    A pass over the file of its own: the steps must be known before the first
    event is kept or left out, and Kineto writes them among the other events.
    """
    stream = TraceStream(path)
    found: list[tuple[int, float, float]] = []
    try:
        for batch in stream.batches():
            for e in batch:
                name = e.get("name") if e.__class__ is dict else None
                if name.__class__ is str and name.startswith(PROFILER_STEP_PREFIX) and e.get("ph") == "X":
                    number = name[len(PROFILER_STEP_PREFIX):]
                    ts, dur = e.get("ts"), e.get("dur", 0)
                    if number.isdigit() and ts.__class__ in (int, float) and dur.__class__ in (int, float):
                        found.append((int(number), ts, dur))
    except TraceFormatError as exc:
        raise MergeInputError(path, str(exc)) from None
    base = checked_base_ns(path, stream.header.get("baseTimeNanoseconds", 0)) + offset_ns
    return {n: (round(ts * 1000) + base, round((ts + dur) * 1000) + base) for n, ts, dur in found}


def step_spans(marks: dict[int, tuple[int, int]], steps: frozenset[int]) -> Spans:
    """The spans of the chosen steps in one file: each from its start to the next step's start."""
    starts = sorted(start for start, _ in marks.values())
    out = []
    for n in sorted(steps & marks.keys()):
        start = marks[n][0]
        later = starts[bisect.bisect_right(starts, start):]
        out.append((start, later[0] if later else (1 << 63) - 1))
    return sorted(out)


#: ``spans(path, offset_ns)``: the spans one trace file keeps (offset: --align's, for its rank).
FileSpans = Callable[[Path, int], Spans]


def event_range(files: Iterable[tuple[Path, int]]) -> Optional[tuple[int, int]]:
    """The first start and last end (ns, each file's --align offset added) of the slices and
    instants of ``files``: where --window counts from, and what it can keep. A pass over each
    file of its own, as for --steps; a file that does not parse is left to the conversion to refuse."""
    found: list[tuple[int, int]] = []
    for path, offset_ns in files:
        stream = TraceStream(path)
        low, high = _INF, -_INF
        try:
            for batch in stream.batches():
                for e in batch:
                    if e.__class__ is not dict or e.get("ph") not in _TIMED_PHASES:
                        continue
                    ts, dur = e.get("ts"), e.get("dur", 0) if e.get("ph") == "X" else 0
                    if ts.__class__ in (int, float) and dur.__class__ in (int, float) and 0 <= ts < _INF:
                        low, high = min(low, ts), max(high, ts + max(dur, 0))
            base = checked_base_ns(path, stream.header.get("baseTimeNanoseconds", 0)) + offset_ns
        except (TraceFormatError, MergeInputError):
            continue
        if low <= high:
            found.append((round(low * 1000) + base, round(high * 1000) + base))
    return (min(f[0] for f in found), max(f[1] for f in found)) if found else None


def file_spans(selection: Selection, events: Optional[tuple[int, int]], notices: list[str],
               matched: Optional[dict[Path, frozenset[int]]] = None) -> Optional[FileSpans]:
    """How each file's kept spans are found for ``selection``; None when it keeps all time.

    ``events``: the job's :func:`event_range` (only --window needs it: it counts from its
    start). ``matched``: for --steps, the file's own numbers of the chosen steps where its rank
    numbers its steps apart from the others (:mod:`commtag.merge.inputs.stepmatch`). A file
    without any ``ProfilerStep#`` cannot be cut into steps: an error; one without the chosen
    steps keeps nothing, with a notice.
    """
    if selection.window is not None:
        origin = events[0] if events is not None else 0
        span = [(origin + selection.window[0], origin + selection.window[1])]
        return lambda _path, _offset: span
    steps = selection.steps
    if steps is None:
        return None

    def spans(path: Path, offset_ns: int) -> Spans:
        marks = step_marks(path, offset_ns)
        if not marks:
            raise MergeInputError(path, f"has no {PROFILER_STEP_PREFIX}N slices, so --steps cannot select from it "
                                        "(--window can)")
        own = (matched or {}).get(path, steps)
        chosen = step_spans(marks, own)
        numbered = f" (its steps {describe_numbers(sorted(own))})" if own != steps else ""
        notice = (f"{path}: none of --steps {describe_numbers(sorted(steps))}{numbered} is in it "
                  f"(it holds steps {describe_numbers(sorted(marks))}); its events are left out")
        if not chosen and notice not in notices:  # the size estimate asks for a sampled file's spans too
            notices.append(notice)
        return chosen

    return spans

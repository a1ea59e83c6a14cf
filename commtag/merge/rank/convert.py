"""One rank's Kineto events, batch by batch, into the writer's rows.

Why streaming: a parsed trace is about ten times its JSON in Python objects,
so a rank is never held as dicts. Each event is checked (anything the merge
cannot place stops it with an error naming the event), then either

* encoded at once by the writer's :class:`Encoder` (most events): only its
  times and opaque bytes are kept; or
* kept as a dict until its file is complete, when attach may annotate it: collective and graph
  kernels, graph launches, ``c10d::`` and ``gloo:`` ops. They are a few per thousand events.

Flows and launches' kernel breakdowns are added when a file ends (a launch may come after its kernels);
link-only args, drawn as flows (:data:`commtag.vocab.LINK_ARGS`), are not written. Every "X" and "i"/"I"
event is written (a ProfilerStep's span also kept), but one at torch's unset time. Traces
of torch 1.8-1.10 name rows with strings (``"tid": "5555"``, ``"tid": "stream 7"``, ``"pid":
"Spans"``) and use other category names: numeric strings are read as numbers, ``stream N`` as GPU
stream N, other strings name rows of their own, and old categories take today's names
(:data:`commtag.vocab.KINETO_LEGACY_CATEGORIES`). Everything else (metadata, flow events, other
phases) is counted per reason in the rank's :class:`EventAccount`: the receipt for what is left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from commtag.kernels import LANE_SCOPE, LAUNCH_SCOPE, STREAM_SCOPE, WORK_CATEGORIES, DeviceWork, summary_name
from commtag.merge.rank.attach import attach, is_candidate
from commtag.merge.rank.events import RankFlows, group_rows
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.jsonstream import TraceFormatError, TraceStream, WholeTrace
from commtag.merge.inputs.clock import checked_base_ns
from commtag.merge.account import EventAccount
from commtag.merge.records import GroupLane, Interner
from commtag.merge.inputs.selection import NOT_IN_DETAIL, OUTSIDE_SELECTION, Spans, keeper
from commtag.merge.timeline import RankTimeline, Row
from commtag.merge.rank.torchlanes import has_torch_lanes, restore_group_lanes
from commtag.merge.rank.captures import CapturedKernels
from commtag.vocab import (ANN_LANE, CORRELATION_KEY, DEVICE_KINDS, GLOBAL_INSTANT_SCOPE,
                           KINETO_LEGACY_CATEGORIES, LAUNCH_CATEGORIES, LINK_ARGS, TORCH_UNSET_SLACK_NS,
                           TORCH_UNSET_TIME_NS)
from commtag.constants import MAX_DUR_US
from commtag.merge.rank.checks import check_clock, check_join_args, check_ids, refuse, check_distributed_info, records_in_span
from commtag.merge.rank.rows import (
    OUTSIDE, UNSET_TIME, Encoder, FileState, RowId, drop_links, kernel_args, event_kind, launch_flows, row_id, tracks_of,
    kept_by_selection, left_out_reason, plan, RowNames, TraceRow, without_blind, without_spans,
)

_MAX_NS, _INF = (1 << 63) - 1, float("inf")
class RankConverter:
    """Everything one rank contributes: rows of encoded slices, instances, groups. ``encoder`` None: only
    check the events and attach (the instances alone: --align's first pass, ``commtag summary``, ``--json``),
    with ``breakdowns`` filling ``categories`` (``summary``'s kernel tables; always filled with an encoder)."""

    def __init__(self, rank: int, encoder: Optional[Encoder], *, offset_ns: int = 0,
                 flows: Optional[RankFlows] = None, breakdowns: bool = False, list_left_out: bool = False,
                 interner: Optional[Interner] = None) -> None:
        self.rank = rank
        self.encoder = encoder
        #: The merge's: equal values of its instances are one object (see attach).
        self.interner = interner or Interner()
        self.breakdowns = breakdowns or encoder is not None
        self.offset = offset_ns
        self.flows = flows or RankFlows(rank)
        self.rows: dict[tuple, Row] = {}
        self.instants: dict[tuple, Row] = {}
        self.names = RowNames()
        self.categories = DeviceWork()
        self.instances: list = []
        #: What attach said its files' events are left without.
        self.notes: list[str] = []
        #: uid -> the groups this rank knows.
        self.groups: dict[str, GroupLane] = {}
        self.host = ""
        #: ``(first_ns, last_ns)`` each file covers, its collectives included: the rank's profiled windows
        #: (``steps``: their ProfilerStep slices' name, start and end ns).
        self.windows: list[tuple[int, int]] = []
        self.steps: list[tuple[str, int, int]] = []
        #: The world size its sidecar or distributedInfo claims (None: neither says).
        self.world_size: Optional[int] = None
        #: id(event) -> (common, own) args attach gave it, for :meth:`_settle` to encode.
        self.annotated: dict[int, tuple[dict, dict]] = {}
        #: (pid, tid) as a trace wrote them, when not both ints -> the row they name.
        self.placed: dict[tuple, tuple[RowId, RowId]] = {}
        self.trace_row = TraceRow()
        #: Events read from every file of the rank.
        self.read = 0
        #: phase -> category -> events of that kind not written.
        self.left_out: dict[str, dict[Optional[str], int]] = {}
        self.listed: Optional[list[str]] = [] if list_left_out else None
        #: Timed events a --steps/--window selection left out.
        self.outside = 0
        #: Launch flows drawn (a launch and its work both written), for the account.
        self.flows_drawn = 0

    # -- events ------------------------------------------------------------
    def feed(self, file: FileState, events: Iterable, base: int) -> None:
        """Check, place and encode one batch of a file's events (``base``: ns of ts 0, with the offset)."""
        path = file.path
        encoder = self.encoder
        body = encoder.body if encoder is not None else None
        rows = self.rows
        categories = self.categories
        inf = _INF
        breakdowns = self.breakdowns
        first, last = file.first, file.last
        left_out: dict[Any, dict[Any, int]] = self.left_out  # looked up by the raw phase and category
        listed = self.listed
        legacy = KINETO_LEGACY_CATEGORIES
        device_kind = DEVICE_KINDS.get
        keep, named = file.keep, file.named
        links = LINK_ARGS
        i = file.index - 1
        dur: Any  # these three as the trace wrote them: checked by class below, through dc and tc
        ts: Any
        cat: Any
        for e in events:
            i += 1
            if e.__class__ is not dict:
                raise MergeInputError(path, f"traceEvents[{i}] is not an object")
            ph = e.get("ph")
            if ph == "X":
                dur = e.get("dur", 0)
                dc = dur.__class__
                if (dc is not int and dc is not float) or not 0 <= dur <= MAX_DUR_US:
                    refuse(path, i, e, base)
            elif ph == "i" or ph == "I":
                dur = 0
                dc = int
            else:
                try:  # by phase, then category: two lookups of cached str hashes, no tuple, no call
                    left_out[ph][e["cat"]] += 1
                except (KeyError, TypeError):  # the first of its kind, no category ("M"), or not text
                    self._leave_out(ph, e.get("cat"))
                if listed is not None:
                    listed.append(f"{path}: traceEvents[{i}] {e.get('name')!r}: "
                                  f"{left_out_reason(*event_kind(ph, e.get('cat')))}")
                if ph == "M":
                    check_ids(path, i, e)
                    if body is not None:
                        self._meta(e)
                continue
            try:  # subscripts, not get: a third fewer instructions, and a slice lacks none of these
                ts, pid, tid = e["ts"], e["pid"], e["tid"]
            except KeyError:
                refuse(path, i, e, base)
            tc = ts.__class__
            pc = pid.__class__
            ic = tid.__class__
            args = e.get("args")
            name = e.get("name", "")
            cat = e.get("cat")
            if ((tc is not int and tc is not float) or not 0 <= ts < inf
                    or name.__class__ is not str or (cat is not None and cat.__class__ is not str)
                    or (pc is not int and pc is not str) or (ic is not int and ic is not str)
                    or (args is not None and args.__class__ is not dict)):
                refuse(path, i, e, base)
            if cat in legacy:
                cat = e["cat"] = legacy[cat]
            # A float's own __round__ is round(): the builtin looks the method up on every call.
            start = (ts * 1000 if tc is int else (ts * 1000).__round__()) + base
            end = start + (dur * 1000 if dc is int else (dur * 1000).__round__()) if dur else start
            if start < 0 or end > _MAX_NS:
                if abs(start - TORCH_UNSET_TIME_NS) <= TORCH_UNSET_SLACK_NS:  # no time: counted, listed, not written
                    self._leave_out(UNSET_TIME, cat)
                    if listed is not None:
                        listed.append(f"{path}: traceEvents[{i}] {name!r}: {left_out_reason(UNSET_TIME, cat)}")
                    continue
                refuse(path, i, e, base)
            if keep is not None and not keep(start):
                self.outside += 1
                if listed is not None:
                    listed.append(f"{path}: traceEvents[{i}] {name!r}: {OUTSIDE_SELECTION}")
                if ph == "X" and is_candidate(name, cat, args, file.captured):
                    # attach still sees it, so the kept collectives are joined as in a whole merge
                    if pc is not int or ic is not int:
                        self._place(e, pid, tid)
                    file.candidates.append((e, None, OUTSIDE))
                continue
            if first is None or start < first:
                first = start
            if last is None or end > last:
                last = end
            if pc is not int or ic is not int:
                pid, tid = self._place(e, pid, tid)
            if ph != "X":
                if body is not None:
                    kind = device_kind(cat)
                    key = (pid, tid) if kind is None else (pid, tid, kind)
                    row = self.instants.get(key)
                    if row is None:
                        row = self.instants[key] = Row()
                    if args:
                        drop_links(args)
                    row.add(start, start, body(name, cat, args))
                continue
            # What depends only on the name and category, asked once per file (rows.plan).
            if (found := (named.get(cat) or named.setdefault(cat, {})).get(name)) is None:
                found = named[cat][name] = plan(name, cat, file.captured, encoder)
            decided, kind, linked, graph_launch, work, step, head = found
            if step:
                file.steps.append((name, start, end))
            candidate = is_candidate(name, cat, args, file.captured) if decided is None else decided  # None: args decide
            if body is None:
                if candidate:
                    file.candidates.append((e, None, -1))
                if args and breakdowns:  # a launch candidate is a graph launch, the only launch launch() keeps
                    if candidate and cat in LAUNCH_CATEGORIES:
                        categories.launch(name, args.get(CORRELATION_KEY))
                    elif not candidate and work:
                        categories.kernel((pid, tid, kind), name, cat, dur, args)
                continue
            # A device's row by the event's category, never by its pid: a host pid can be a device's number.
            key = (pid, tid) if kind is None else (pid, tid, kind)
            row = rows.get(key)
            if row is None:
                row = rows[key] = Row()
            index = len(row.starts)
            if linked and args:
                corr = args.get(CORRELATION_KEY)
                if corr.__class__ is int:
                    if kind is None:
                        file.launches[corr] = (row, index)
                        if graph_launch:
                            categories.launch(name, corr)
                    else:
                        file.work.append((row, index, corr))
            if candidate:
                file.candidates.append((e, row, index))
                row.add(start, end, b"")  # encoded once attach has run (_settle)
                continue
            if args:
                if work:
                    categories.kernel(key, name, cat, dur, args)
                if head is None or not args.keys() <= links:  # else its args only link: head is its body
                    drop_links(args)
                    head = body(name, cat, args)
            elif head is None:
                head = body(name, cat, args)
            # Row.add, inlined: it runs once per event.
            row.starts.append(start)
            row.ends.append(end)
            data = row.data
            data += head
            row.offsets.append(len(data))
        file.index = i + 1
        file.first, file.last = first, last

    def _leave_out(self, ph: object, cat: object) -> None:
        """Count an event left out whose kind the loop's counter has not seen (see :func:`event_kind`)."""
        ph, cat = event_kind(ph, cat)
        by_cat = self.left_out.setdefault(ph, {})
        by_cat[cat] = by_cat.get(cat, 0) + 1

    def _place(self, e: dict, pid: RowId, tid: RowId) -> tuple[RowId, RowId]:
        """The row of an event whose pid or tid is a string (torch 1.8-1.10, Kineto's own spans):
        written back into the event, so attach and ``--json`` see the same row."""
        if e.get("s") == GLOBAL_INSTANT_SCOPE:  # Kineto's trace-wide instants: one row (rows.TraceRow)
            pid, tid = self.trace_row.place(pid, tid)
        placed = self.placed.get((pid, tid))
        if placed is None:
            placed = self.placed[(pid, tid)] = (row_id(pid), row_id(tid))
        e["pid"], e["tid"] = placed
        return placed

    def _meta(self, e: dict) -> None:
        """Take a thread's name or a process's labels from an "M" event."""
        what = e.get("name")
        if what == "thread_name" or what == "process_labels":
            self.names.add(what, self._place(e, e.get("pid", ""), e.get("tid", "")), e.get("args") or {})

    # -- files ---------------------------------------------------------------
    def add_file(self, path: Path, stream: TraceStream | WholeTrace, sidecar,
                 spans: Optional[Spans] = None) -> tuple[Optional[int], Optional[int]]:
        """Convert one trace file read by ``stream``; its first and last ns (None without timed events).
        ``spans``: the times (ns) in which an event or a collective must start to be kept (--steps/--window);
        the others are counted as left out."""
        keep = keeper(spans) if spans is not None else None
        file = FileState(path, keep, CapturedKernels(sidecar.captures) if sidecar is not None else None)
        header = stream.header
        base = None
        marks = {key: len(row) for key, row in [*self.rows.items(), *(((k, "i"), r) for k, r in self.instants.items())]}
        try:
            for batch in stream.batches():
                if base is None:
                    base = checked_base_ns(path, header.get("baseTimeNanoseconds", 0)) + self.offset
                if has_torch_lanes(header):  # torch writes the flag before traceEvents
                    restore_group_lanes(batch)  # one lane per group: commtag's (see torchlanes)
                self.feed(file, batch, base)
                del batch
        except TraceFormatError as exc:
            raise MergeInputError(path, str(exc)) from None
        self.read += file.index
        check_distributed_info(path, header.get("distributedInfo"))
        final = checked_base_ns(path, header.get("baseTimeNanoseconds", 0)) + self.offset
        if base is not None and final != base:
            self._shift(file, marks, final - base)
        check_clock(path, None if file.last is None else file.last - self.offset)
        trace = {**header, "traceEvents": [c[0] for c in file.candidates]}
        check_join_args(path, trace["traceEvents"])
        blind: list[tuple[int, int]] = []
        in_span = records_in_span(path, sidecar, file.first, file.last, self.offset, self.notes, blind)
        attached = attach(self.rank, trace, in_span, self.flows, offset_ns=self.offset, interner=self.interner, blind=blind,
                          annotated=self.annotated if self.encoder is not None else None, notes=self.notes, source=str(path))
        if keep is not None:
            attached = kept_by_selection(file, attached, keep, self.flows, self.annotated)
        if self.encoder is None:  # no event is written, so no flow may end on one
            for inst in attached:
                inst.source_flow = None
        self.instances += attached
        claimed = sidecar.world_size if sidecar else (header.get("distributedInfo") or {}).get("world_size")
        self._window(file, attached, claimed, sidecar is not None or bool(attached), spans, blind,
                     [(u.start_ns, u.end_ns) for u in sidecar.unwatched] if sidecar else ())
        for g in group_rows(trace, sidecar):
            self.groups[g.uid] = GroupLane(g.lane_name, g.lane_id, g.uid, self.interner.shared(tuple(g.ranks)))
        self.host = self.host or (sidecar.host if sidecar else "") or str(header.get("host_name") or "")
        if self.breakdowns:
            self._categorize(file)
        if self.encoder is not None:
            self._settle(file, self.encoder)
        elif self.breakdowns:
            self.categories.end_trace()
        file.candidates.clear()
        return file.first, file.last

    def _window(self, file: FileState, attached: list, world_size: Optional[int], evidence: bool,
                spans: Optional[Spans] = None, blind: Sequence[tuple[int, int]] = (),
                unwatched: Iterable[tuple[int, int]] = ()) -> None:
        """Record the time the file covers (a sidecar-timed collective may reach past its events) and the world
        size it claims. A file with no collective and no sidecar covers nothing: its absent calls say nothing.
        With ``spans`` (--steps/--window) it covers what it kept of each span, one window each:
        collectives of steps left out between them, of ``blind`` (rows.without_blind) and of ``unwatched``
        spans (commtag was not installed on the rank; they split its windows) are not missing."""
        self.world_size = self.world_size or world_size
        if not evidence:
            return
        starts = [t for t in (file.first, *(i.start_ns for i in attached)) if t is not None]
        ends = [t for t in (file.last, *(i.end_ns for i in attached)) if t is not None]
        if starts and ends:
            first, last = min(starts), max(ends)
            kept = [(first, last)] if spans is None else [
                (max(low, first), min(high, last)) for low, high in spans if max(low, first) < min(high, last)]
            pieces = without_spans(kept, unwatched)
            cut = sum(end - start for start, end in kept) - sum(end - start for start, end in pieces)
            if cut > 0:
                self.notes.append(f"commtag was not installed for {cut / 1e6:.3f} ms of a profiled window: "
                                  "calls then are not recorded, and their absence is not held against the rank")
            self.windows += without_blind(pieces, attached, blind, first, last)
            self.windows.sort()
            self.steps += file.steps

    def _categorize(self, file: FileState) -> None:
        """Add the attached kernels to the breakdowns: only now is their lane known (from
        their annotation), and they still carry their correlation (:meth:`_settle` drops it)."""
        categories, annotated = self.categories, self.annotated
        for e, _, _ in file.candidates:
            cat = e.get("cat")
            if cat in WORK_CATEGORIES:
                parts = annotated.get(id(e))
                args = e.get("args") or {}
                lane = parts[0].get(ANN_LANE) if parts is not None else args.get(ANN_LANE)
                if args or parts is not None:
                    stream = (e["pid"], e["tid"], DEVICE_KINDS[cat])
                    categories.kernel(stream, e.get("name", ""), cat, e.get("dur", 0), args, lane)

    def _shift(self, file: FileState, marks: dict, delta: int) -> None:
        """A base time found after the events (not Kineto's order): move this file's times,
        checked first (a row's times are int64: an overflow there would be no clear error)."""
        if file.first is not None and file.last is not None and (file.first + delta < 0 or file.last + delta > _MAX_NS):
            raise MergeInputError(file.path, "baseTimeNanoseconds puts its events outside int64 nanoseconds")
        for key, row in self.rows.items():
            row.shift(marks.get(key, 0), delta)
        for key, row in self.instants.items():
            row.shift(marks.get((key, "i"), 0), delta)
        file.first = None if file.first is None else file.first + delta
        file.steps = [(name, start + delta, end + delta) for name, start, end in file.steps]
        file.last = None if file.last is None else file.last + delta

    def _settle(self, file: FileState, encoder: Encoder) -> None:
        """Encode the attached events (already categorized), then add this file's launch flows
        and graph-launch breakdowns."""
        flows_out, flows_in = self.flows.out, self.flows.into
        categories, annotated = self.categories, self.annotated
        for e, row, index in file.candidates:
            assert row is not None, "an encoded event has its row (a selection took out the others)"
            args = e.get("args")
            if args:
                drop_links(args)
            ref = id(e)
            out, into = flows_out.pop(ref, None), flows_in.pop(ref, None)
            # Kineto's args (through the writer's block cache: a kernel's repeat), then the
            # annotation: its call site's common args (encoded once), then its own.
            data = encoder.body(e.get("name", ""), e.get("cat"), args)
            parts = annotated.pop(ref, None)
            if parts is not None:
                data += encoder.shared_annotations(parts[0]) + encoder.annotations(parts[1])
            row.append_to(index, encoder.flows(out, into) + data if out or into else data)
        file.candidates.clear()
        self.flows_drawn += launch_flows(file, self.flows.launches(len(file.work)), encoder.flow_fields)
        for corr in categories.end_trace():
            row, index = file.launches[corr]
            extra = kernel_args(self.rank, LAUNCH_SCOPE, corr, categories.launches[corr])
            row.append_to(index, encoder.annotations(extra))

    # -- the rank ------------------------------------------------------------
    def account(self) -> EventAccount:
        """The rank's receipt: events read, written (counted on the rows), and left out by reason."""
        written = sum(len(row) for row in self.rows.values()) + sum(len(row) for row in self.instants.values())
        reasons: dict[str, int] = {}
        for ph, by_cat in self.left_out.items():
            for cat, n in by_cat.items():
                reason = left_out_reason(ph, cat)
                reasons[reason] = reasons.get(reason, 0) + n
        if self.outside:
            reasons[OUTSIDE_SELECTION] = self.outside
        if self.encoder is None:  # --detail: the rank's events were read and checked, not written
            timed = self.read - sum(reasons.values())
            if timed:
                reasons[NOT_IN_DETAIL] = timed
        return EventAccount(self.rank, self.read, written, reasons, list(self.listed or ()), self.flows_drawn)

    def timeline(self) -> RankTimeline:
        """The rank's rows, named and ordered, with its kernel-category summaries."""
        categories = self.categories
        categories.finish()
        summaries = {key: (summary_name(b.describe()), kernel_args(self.rank, STREAM_SCOPE, key[1], b))
                     for key, b in categories.streams.items()}
        names = self.names
        rows = names.on_devices(self.rows)
        tracks = tracks_of(rows, names.on_devices(self.instants), names, summaries)
        starts = [min(row.starts) for t in tracks for row in (t.slices, t.instants) if len(row)]
        device = names.devices(rows) or "CPU"
        if self.encoder is None:
            device = "lanes only (--detail)"
        name = f"rank {self.rank}" + (f" · {self.host}" if self.host else "") + f" · {device}"
        lanes = {lane: kernel_args(self.rank, LANE_SCOPE, lane, b) for lane, b in categories.lanes.items()}
        return RankTimeline(rank=self.rank, process_name=name, tracks=tracks,
                            first_ns=min(starts) if starts else None, lane_kernels=lanes)

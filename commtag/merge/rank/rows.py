"""Where a rank's events go: their rows and tracks, the state kept per file, and why one is left out."""

from __future__ import annotations

import bisect
import re
from array import array
from pathlib import Path
from typing import Callable, Iterable, Optional, Protocol, Sequence, Union

from commtag.kernels import WORK_CATEGORIES
from commtag.merge.rank.attach import args_decide, is_candidate
from commtag.merge.rank.captures import CapturedKernels
from commtag.merge.rank.events import RankFlows
from commtag.merge.records import CollectiveInstance
from commtag.merge.timeline import CPU_GROUP, Row, Track
from commtag.vocab import (
    ANN_KERNELS_ID, ANN_KERNELS_SCOPE, ANN_RANK, CBID_KEY, CORRELATION_KEY, DEVICE_KINDS, LAUNCH_CATEGORIES,
    PROFILER_STEP_PREFIX, USER_ANNOTATION_CATEGORY, EV_IDX_KEY, EXTERNAL_ID_KEY, KINETO_GPU_LABEL_PREFIX,
    KINETO_HOST_LABEL, KINETO_HOST_THREAD_PREFIX,
    HTA_CRITICAL_ARG, HTA_CRITICAL_PATH_CATEGORY_PREFIX, KINETO_LAUNCH_FLOW_CATEGORIES, KINETO_TRACE_ROW,
    KINETO_STREAM_TID_PREFIX, RECORD_FUNCTION_ID_KEY, is_graph_launch,
)


_NUMBER = re.compile(r"-?[0-9]+")


#: Sibling order of rows named by a string (after the numbered threads and streams).
_NAMED_ROW_ORDER = 1 << 62


#: The kind an event at torch's unset time is counted under (:data:`commtag.vocab.TORCH_UNSET_TIME_NS`), in
#: place of its phase: it is left out for its time, whatever its phase.
UNSET_TIME = "unset time"


def left_out_reason(ph: str, cat: Optional[str]) -> str:
    """Why an event of phase ``ph`` and category ``cat`` is not in the merged trace."""
    if ph == UNSET_TIME:
        return f"{cat or 'uncategorized'} events at torch's unset time (still running or not begun as the profile ended)"
    if ph == "M":
        return "metadata (process and thread names: they name the rows)"
    if ph in ("s", "t", "f"):
        if cat in KINETO_LAUNCH_FLOW_CATEGORIES:
            return f"launch flows {cat!r} (not copied: the merge draws launch flows from correlation ids)"
        if cat is not None and cat.startswith(HTA_CRITICAL_PATH_CATEGORY_PREFIX):
            return (f"HTA critical-path flows (not drawn: HTA found that path in this one rank's trace alone; "
                    f"the events on it keep HTA's '{HTA_CRITICAL_ARG}': 1 arg)")
        return f"flows {cat!r} (not drawn)"
    return f"phase {ph!r} (only 'X' and 'i'/'I' events are written)"


def event_kind(ph: object, cat: object) -> tuple[str, Optional[str]]:
    """An event's (phase, category) as counted: a phase that is not text by its repr, a
    category that is not text as none."""
    return (ph if ph.__class__ is str else repr(ph), cat if cat.__class__ is str else None)


class TraceRow:
    """Where Kineto's trace-wide instants go (:data:`commtag.vocab.KINETO_TRACE_ROW`): the one it
    writes without a pid or tid (the window's end) on the row of the one it writes with them (the
    window's start), so both sit under their rank on one row, not on a row named by nothing."""

    __slots__ = ("row",)

    def __init__(self) -> None:
        self.row: tuple[RowId, RowId] = KINETO_TRACE_ROW

    def place(self, pid: RowId, tid: RowId) -> tuple[RowId, RowId]:
        """The row of a global-scope instant written on ``(pid, tid)``."""
        if pid == "" and tid == "":
            return self.row
        if pid.__class__ is str and pid:
            self.row = (pid, tid)
        return pid, tid


def row_id(value: RowId) -> RowId:
    """A pid or tid as the timeline keys it: ``"7"`` and a GPU stream's ``"stream 7"`` as 7 (the
    event's category says whether its row is a device's)."""
    if isinstance(value, int):  # (the conversion refused any pid or tid but an int or a str)
        return value
    if _NUMBER.fullmatch(value):
        return int(value)
    if value.startswith(KINETO_STREAM_TID_PREFIX) and _NUMBER.fullmatch(value[len(KINETO_STREAM_TID_PREFIX):]):
        return int(value[len(KINETO_STREAM_TID_PREFIX):])
    return value


def _row_order(key: tuple[RowId, RowId]) -> tuple:
    """Sort rows numbered first, then named (pids and tids may be either)."""
    return tuple((part.__class__ is str, part) for part in key)


def drop_links(args: dict) -> None:
    """Remove :data:`commtag.vocab.LINK_ARGS` from ``args``: five pops cost a third of a set intersection
    and a delete loop, and this runs for nearly every event."""
    pop = args.pop
    pop(EXTERNAL_ID_KEY, None)
    pop(CORRELATION_KEY, None)
    pop(CBID_KEY, None)
    pop(EV_IDX_KEY, None)
    pop(RECORD_FUNCTION_ID_KEY, None)


#: What the converter does with every timed slice of one name and category (see :func:`plan`).
Plan = tuple[Optional[bool], Optional[str], bool, bool, bool, bool, Optional[bytes]]


def plan(name: str, cat: Optional[str], captured: CapturedKernels, encoder: Optional[Encoder]) -> Plan:
    """What the converter does with the timed slices named ``name`` of category ``cat``, asked once per
    file: none of it depends on the event (a plain tuple: the loop unpacks it for every event). In order:

    * is_candidate's answer, None where the args decide (a kernel's, a record_param_comms op's);
    * the device kind of its row (DEVICE_KINDS), None on a host thread;
    * whether its correlation ties it to a launch or to its work (a device's event, or a launch);
    * whether it is a graph launch (what kernels.DeviceWork.launch keeps);
    * whether it is device work for the kernel breakdowns (kernels.WORK_CATEGORIES);
    * whether it is a ProfilerStep's span;
    * the encoder's bytes of its name and category where it is never a candidate, so encoded at once
      (interned now, as the event asking would intern them); else None.
    """
    candidate = None if args_decide(name, cat) else is_candidate(name, cat, None, captured)
    kind = DEVICE_KINDS.get(cat) if cat is not None else None
    launch = cat in LAUNCH_CATEGORIES
    return (candidate, kind, kind is not None or launch, launch and is_graph_launch(name), cat in WORK_CATEGORIES,
            cat == USER_ANNOTATION_CATEGORY and name.startswith(PROFILER_STEP_PREFIX),
            encoder.body(name, cat, None) if candidate is False and encoder is not None else None)


class Encoder(Protocol):
    """What the writer offers the converter: opaque bytes per event."""

    def body(self, name: str, cat: Optional[str], args: Optional[dict]) -> bytes: ...

    def flows(self, out: Optional[Sequence[int]], into: Optional[Sequence[int]]) -> bytes: ...

    def flow_fields(self, fid: int) -> tuple[bytes, bytes]: ...

    def annotations(self, args: dict) -> bytes: ...

    def shared_annotations(self, args: dict) -> bytes: ...


def kernel_args(rank: int, scope: str, ident: object, breakdown) -> dict:
    """Debug annotations naming a breakdown's scope and carrying its figures."""
    return {ANN_RANK: rank, ANN_KERNELS_SCOPE: scope, ANN_KERNELS_ID: ident, **breakdown.annotations()}


class RowNames:
    """What a rank's "M" events say of its rows: thread names, and which pids are devices.

    A host thread and a device's stream may share their numbers (the process is pid 1 in a
    container, as GPU 1): rows are told apart by their events' category, and names by their form.
    """

    __slots__ = ("threads", "labels", "host_pids")

    def __init__(self) -> None:
        #: (pid, tid) -> its "thread_name"s in order.
        self.threads: dict[tuple, list[str]] = {}
        #: pid -> the "process_labels" of a device ("GPU 0"); the pids labelled as the host process.
        self.labels: dict = {}
        self.host_pids: set = set()

    def add(self, what: str, key: tuple, args: dict) -> None:
        """A "thread_name" or "process_labels" event's ``args`` for the row ``key`` (pid, tid)."""
        if what == "thread_name":
            self.threads.setdefault(key, []).append(str(args.get("name", "")).strip())
            return
        labels = str(args.get("labels", ""))
        if labels == KINETO_HOST_LABEL:
            self.host_pids.add(key[0])
        else:
            self.labels[key[0]] = labels

    def thread(self, key: tuple, shared: bool) -> Optional[str]:
        """The last name Kineto gave row ``key``; where a host thread and a stream share its numbers
        (``shared``), the last of its side's (:data:`commtag.vocab.KINETO_HOST_THREAD_PREFIX`)."""
        names = self.threads.get(key[:2])
        if names and shared:
            host = len(key) == 2
            names = [n for n in names if n.startswith(KINETO_HOST_THREAD_PREFIX) == host]
        return names[-1] if names else None

    def on_devices(self, rows: dict) -> dict:
        """``rows`` (keyed (pid, tid), or (pid, tid, kind) on a device) with the rows of a pid Kineto
        labels a GPU and not the host process on that GPU: device events of a category
        :data:`commtag.vocab.DEVICE_KINDS` does not name. A row that meets one already there is
        joined to it (in a new row: the converter's own rows stay as they were counted)."""
        placed: dict = {}
        for key, row in rows.items():
            if (len(key) == 2 and key[0] not in self.host_pids
                    and str(self.labels.get(key[0], "")).startswith(KINETO_GPU_LABEL_PREFIX)):
                key = (*key, KINETO_GPU_LABEL_PREFIX)
            there = placed.get(key)
            placed[key] = row if there is None else _joined(there, row)
        return placed

    def devices(self, rows: dict) -> str:
        """The devices that rows are on, as their labels name them ("GPU 0"; a label of another
        kind names none)."""
        names = []
        for _, pid, kind in sorted({(k[0].__class__ is str, k[0], k[2]) for k in rows if len(k) == 3}):
            label = self.labels.get(pid, "")
            names.append(label if label.startswith(kind) else f"{kind} {pid}")
        return ", ".join(names)


def _joined(a: Row, b: Row) -> Row:
    """One row holding the events of ``a`` then ``b``."""
    row = Row()
    size, n = len(a.data), len(a)
    row.starts = a.starts + b.starts
    row.ends = a.ends + b.ends
    row.offsets = a.offsets + array("q", (o + size for o in b.offsets[1:]))
    row.data = a.data + b.data
    row.extra = {**a.extra, **{k + n: more for k, more in b.extra.items()}}
    return row


def tracks_of(rows: dict, instants: dict, names: RowNames, summaries: Optional[dict] = None) -> list[Track]:
    """Name and order the rows: main thread first then by name; a device's rows (keyed
    (pid, tid, kind)) by stream id under that device; rows Kineto named with a string (its own
    spans: pid "Spans") in a group of that name.

    ``summaries``: row key -> (name, args) of the row's kernel-category instant.
    """
    keys = set(rows) | set(instants)
    on_device = {key[:2] for key in keys if len(key) == 3}
    cpu_pids = [key[0] for key in rows if len(key) == 2 and key[0].__class__ is int]
    main_pid = max(set(cpu_pids), key=cpu_pids.count) if cpu_pids else None
    tracks = []
    for key in sorted(keys, key=_row_order):
        pid, tid = key[0], key[1]
        named = tid.__class__ is str
        if len(key) == 3:
            group = f"{key[2]} {pid}"
            name = names.thread(key, key[:2] in keys) or (tid or "no tid" if named else f"stream {tid}")
            order = _NAMED_ROW_ORDER if named else tid
        elif pid.__class__ is str:
            group = pid or "no pid"
            name = names.thread(key, key in on_device) or (tid or "no tid" if named else f"thread {tid}")
            order = _NAMED_ROW_ORDER if named else tid
        else:
            group = CPU_GROUP
            name = names.thread(key, key in on_device) or (tid or "no tid" if named else f"thread {tid}")
            if pid != main_pid:
                name = f"pid {pid} · {name}"
            order = _NAMED_ROW_ORDER if named else -1 if tid == pid else tid
        tracks.append(Track(name=name, group=group, order=order, slices=rows.get(key) or Row(),
                            instants=instants.get(key) or Row(), summary=(summaries or {}).get(key)))
    for group in {t.group for t in tracks}:
        members = sorted((t for t in tracks if t.group == group), key=lambda t: (t.order, t.name))
        for i, t in enumerate(members):
            t.order = i
    return tracks


#: The index of a candidate event a --steps/--window selection left out (seen by attach, not written).
OUTSIDE = -2
#: A row's pid or tid as the timeline keys it: a number, or the name Kineto gave it.
RowId = Union[int, str]


class FileState:
    """Per-file state: correlation ids are per file, so launch flows are settled per file."""

    __slots__ = ("path", "keep", "captured", "index", "first", "last", "candidates", "launches", "work", "steps", "named")

    def __init__(self, path: Path, keep: Optional[Callable[[int], bool]] = None,
                 captured: Optional[CapturedKernels] = None) -> None:
        self.path = path
        #: Kernels its sidecar's graph captures hold (see :func:`commtag.merge.rank.attach.is_candidate`).
        self.captured = captured if captured is not None else CapturedKernels(())
        #: --steps/--window: whether an event starting at a time (ns) is kept; None keeps all.
        self.keep = keep
        self.index = 0
        self.first: Optional[int] = None
        self.last: Optional[int] = None
        #: (event, row, index in row) of the events attach may annotate (no row: not placed, when
        #: nothing is written or a selection leaves it out).
        self.candidates: list[tuple[dict, Optional[Row], int]] = []
        #: correlation -> (row, index) of a runtime launch.
        self.launches: dict[object, tuple[Row, int]] = {}
        #: (row, index, correlation) of device work.
        self.work: list[tuple[Row, int, object]] = []
        #: (name, start_ns, end_ns) of its ProfilerStep slices (see commtag.merge.steps).
        self.steps: list[tuple[str, int, int]] = []
        #: category -> event name -> what the converter does with its slices (:func:`plan`).
        self.named: dict[object, dict[str, Plan]] = {}


def launch_flows(file: FileState, fids: Iterable[int], flow_fields: Callable[[int], tuple[bytes, bytes]]) -> int:
    """One flow per piece of device work of ``file`` whose launch it holds, from its launch (or from the
    work if it starts first), ids from ``fids`` (one per piece of work); how many were drawn."""
    launches = file.launches
    drawn = 0
    for (row, index, corr), fid in zip(file.work, fids):
        hit = launches.get(corr)
        if hit is None:
            continue
        lrow, lindex = hit
        drawn += 1
        starts, ends = flow_fields(fid)
        if lrow.starts[lindex] <= row.starts[index]:
            lrow.append_to(lindex, starts)
            row.append_to(index, ends)
        else:
            row.append_to(index, starts)
            lrow.append_to(lindex, ends)
    file.work.clear()
    return drawn


def kept_by_selection(file: FileState, attached: list, keep: Callable[[int], bool], flows: RankFlows,
                      annotated: dict) -> list:
    """The instances of ``file`` a --steps/--window selection keeps (those starting in it, as events),
    joined as a whole merge joins them; a flow between a kept and a left-out one goes."""
    kept = [inst for inst in attached if keep(inst.start_ns)]
    gone = {inst.source_flow for inst in attached if inst.source_flow is not None and not keep(inst.start_ns)}
    outside = [e for e, _, index in file.candidates if index == OUTSIDE]
    for e in outside:
        gone.update(flows.out.pop(id(e), ()))
        annotated.pop(id(e), None)
    if gone:
        for ref, fids in list(flows.out.items()):
            fids[:] = [fid for fid in fids if fid not in gone]
            if not fids:
                del flows.out[ref]
        for inst in kept:
            if inst.source_flow in gone:
                inst.source_flow = None
    if outside:
        file.candidates = [c for c in file.candidates if c[2] != OUTSIDE]
    return kept


def without_blind(covered: list[tuple[int, int]], attached: Sequence[CollectiveInstance],
                  blind: Iterable[tuple[int, int]], first: int, last: int) -> list[tuple[int, int]]:
    """A file's windows less, around each record it could not read (``blind``: its times), the time
    from the rank's collective before it to the one after (``first`` / ``last``: the file's ends
    where there is none): what the rank ran there is not known, so its absence blames no one."""
    ends = sorted(i.end_ns for i in attached)
    starts = sorted(i.start_ns for i in attached)
    holes = []
    for start, end in blind:
        at = bisect.bisect_right(ends, start)
        after = bisect.bisect_left(starts, end)
        holes.append((ends[at - 1] if at else first, starts[after] if after < len(starts) else last))
    if not holes:
        return covered
    merged: list[list[int]] = []
    for low, high in sorted(holes):
        if merged and low <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    out = []
    for a, b in covered:  # each window less the merged holes it overlaps
        at = max(bisect.bisect_left(merged, [a]) - 1, 0)
        for low, high in merged[at:]:
            if low >= b:
                break
            if high <= a:
                continue
            if a < low:
                out.append((a, low))
            a = max(a, high)
        if a < b:
            out.append((a, b))
    return out


def without_spans(windows: list[tuple[int, int]], holes: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``windows`` less the time of ``holes`` (closed spans, e.g. where commtag was not installed on the
    rank): what is left of each, in pieces, each a window of its own."""
    for low, high in holes:
        cut = []
        for first, last in windows:
            if high < first or last < low:
                cut.append((first, last))
                continue
            if first < low:
                cut.append((first, low - 1))
            if high < last:
                cut.append((high + 1, last))
        windows = cut
    return windows

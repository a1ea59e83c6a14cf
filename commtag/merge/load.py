"""Find, read and convert PyTorch profiler (Kineto) Chrome-JSON traces.

Discovery reads only each file's first bytes: a sidecar starts with its
``"kind": "commtag-sidecar"``, a trace's ``distributedInfo`` sits before its
``traceEvents``. So ranks are known (and split between merge workers)
before any trace is parsed.

The rank of a trace, first rule that applies:
1. ``distributedInfo.rank`` in the trace;
2. the ``rank`` of the sidecar that names the trace;
3. the file name, by ``--rank-pattern`` if given, else by the default rule
   :data:`DEFAULT_RANK_PATTERN`: ``rank`` or ``worker``, optionally followed
   by ``-`` or ``_``, then the number (``rank3``, ``rank-3``, ``rank_3``,
   ``worker3_step_12...``), case-insensitive, not preceded by a letter;
4. otherwise the merge stops with an error naming the file.

Several trace files may share a rank (one per profiled step): they become one
process. Timestamps become absolute CLOCK_REALTIME ns:
``ts * 1000 + baseTimeNanoseconds`` (old traces: ``ts`` is already epoch
microseconds and there is no ``baseTimeNanoseconds``).
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

import orjson

from commtag.kernels import ANN_ID, ANN_RANK, ANN_SCOPE, WORK_CATEGORIES, DeviceWork
from commtag.merge.timeline import CPU_GROUP, Instant, RankTimeline, Track

if TYPE_CHECKING:
    from commtag.schema import Sidecar

DEFAULT_RANK_PATTERN = r"(?<![a-z])(?:rank|worker)[-_]?(\d+)"
_HEAD_BYTES = 1 << 16
_DIST_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
#: Ranks a merged trace can hold: track ids and pids are built from the rank.
MAX_RANKS = 1 << 24
#: Names a trace or sidecar file has: such a file that is neither is an error, other JSON is ignored.
_OWN_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".commtag.json")
_DIST_WORLD = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"world_size"\s*:\s*(\d+)')
#: Kineto categories of device-side events (their pid is the device).
GPU_CATEGORIES = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "gpu_memory"}
)
#: Host-side events that launch device work (same "correlation" as the work).
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
#: Kineto bookkeeping args with no meaning to a reader.
NOISE_ARGS = frozenset({"Ev Idx", "Record function id"})


class MergeInputError(Exception):
    """Bad input: the message names the file and the problem."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


@dataclass(slots=True)
class TraceFile:
    """One trace file of a rank and the sidecar that annotates it, if any."""

    path: Path
    sidecar: Optional[Path] = None
    size: int = 0


@dataclass(slots=True)
class RankInput:
    """All the files of one rank (several when several steps were profiled)."""

    rank: int
    files: list[TraceFile] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def _head(path: Path) -> bytes:
    """The first bytes of a file, decompressed if gzip."""
    try:
        with open(path, "rb") as stream:
            raw = stream.read(_HEAD_BYTES)
    except OSError as exc:
        raise MergeInputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    stream = zlib.decompressobj(wbits=47)
    try:
        head = stream.decompress(raw, _HEAD_BYTES)
    except zlib.error as exc:
        raise MergeInputError(path, f"not a valid gzip file ({exc})") from None
    if len(raw) < _HEAD_BYTES and len(head) < _HEAD_BYTES and not stream.eof:
        raise MergeInputError(path, "truncated gzip file (it ends before its compressed stream does)")
    return head


def _is_sidecar(head: bytes) -> bool:
    return b'"commtag-sidecar"' in head[:512]


def _looks_like_trace(head: bytes) -> bool:
    return b'"traceEvents"' in head or b'"schemaVersion"' in head


def _candidates(inputs: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for item in inputs:
        if item.is_dir():
            files.extend(
                p for p in sorted(item.iterdir())
                if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
            )
        elif item.is_file():
            files.append(item)
        else:
            raise MergeInputError(item, "no such file or directory")
    return files


def discover(
    inputs: Sequence[Path], rank_pattern: Optional[str] = None, skipped: Optional[list[MergeInputError]] = None
) -> list[RankInput]:
    """Group the traces under ``inputs`` (dirs or files) by rank, in rank order.

    A bad file stops discovery with an error naming it; with ``skipped``
    (``--skip-bad-ranks``) it is appended there instead and left out.
    """
    pattern = re.compile(rank_pattern or DEFAULT_RANK_PATTERN, re.IGNORECASE)
    if pattern.groups < 1:
        raise MergeInputError(rank_pattern or "", "--rank-pattern needs one capture group for the rank")

    def fail(path: Path, problem: str) -> None:
        if skipped is None:
            raise MergeInputError(path, problem)
        skipped.append(MergeInputError(path, problem))

    traces: dict[str, tuple[Path, bytes]] = {}
    sidecars: dict[str, tuple[Path, Sidecar]] = {}
    for path in _candidates(inputs):
        try:
            head = _head(path)
            sidecar = load_sidecar(path) if _is_sidecar(head) else None
        except MergeInputError as exc:
            fail(exc.path, exc.problem)
            continue
        if sidecar is not None:
            other = sidecars.get(sidecar.trace_file)
            if other is not None:
                fail(path, f"annotates the same trace {sidecar.trace_file!r} as {other[0]}")
            else:
                sidecars[sidecar.trace_file] = (path, sidecar)
        elif not _looks_like_trace(head):
            if path.name.endswith(_OWN_SUFFIXES):
                fail(path, "named like a trace or sidecar but is neither (no traceEvents, no commtag kind)")
        else:
            other = traces.get(path.name)
            if other is not None:
                fail(path, f"has the same file name as {other[0]} (sidecars name their trace by file name)")
            else:
                traces[path.name] = (path, head)
    _one_run(traces, sidecars, fail)
    if not traces:
        where = ", ".join(str(p) for p in inputs)
        raise MergeInputError(where, "no PyTorch profiler trace (.json or .json.gz with traceEvents) found")
    for name, (path, _) in sidecars.items():
        if name not in traces:
            fail(path, f"its trace_file {name!r} is not among the input traces")
    ranks: dict[int, RankInput] = {}
    for name, (path, head) in sorted(traces.items()):
        sidecar_path, sidecar = sidecars.get(name, (None, None))
        try:
            rank = _rank_of(path, head, sidecar, pattern)
            if rank >= MAX_RANKS:
                raise MergeInputError(path, f"rank {rank} is beyond the {MAX_RANKS} ranks a merge can lay out")
        except MergeInputError as exc:
            fail(exc.path, exc.problem)
            continue
        entry = ranks.setdefault(rank, RankInput(rank))
        entry.files.append(TraceFile(path, sidecar_path, path.stat().st_size))
    if not ranks:
        raise nothing_left(inputs, skipped or [])
    return [ranks[r] for r in sorted(ranks)]


def nothing_left(inputs: Sequence[Path], skipped: Sequence[MergeInputError]) -> MergeInputError:
    """The error when --skip-bad-ranks left no rank: it still says what was skipped and why."""
    why = "; ".join(str(e) for e in skipped)
    return MergeInputError(", ".join(str(p) for p in inputs), "no rank left to merge" + (f" (skipped {why})" if why else ""))


def _one_run(traces: dict, sidecars: dict, fail: Callable[[Path, str], None]) -> None:
    """Refuse files of another run: a run id or world size that differs from most files'."""
    ids = Counter(side.run_id for _, side in sidecars.values())
    common_id = ids.most_common(1)[0][0] if ids else None
    sizes: dict[str, tuple[Path, int]] = {}
    for name, (path, head) in traces.items():
        match = _DIST_WORLD.search(head)
        if match:
            sizes[name] = (path, int(match.group(1)))
    for name, (path, side) in sidecars.items():
        sizes.setdefault(name, (path, side.world_size))
    common_size = Counter(size for _, size in sizes.values()).most_common(1)[0][0] if sizes else None
    for name, (path, side) in list(sidecars.items()):
        if side.run_id != common_id:
            fail(path, f"run id {side.run_id!r} differs from {common_id!r} of the other sidecars: "
                       "ranks from different runs")
            del sidecars[name]
            traces.pop(name, None)
    for name, (path, size) in sizes.items():
        if size != common_size and name in traces:
            fail(path, f"world size {size} differs from {common_size} of the other files: ranks from different runs")
            traces.pop(name)
            sidecars.pop(name, None)


def _rank_of(path: Path, head: bytes, sidecar: Optional[Sidecar], pattern: re.Pattern[str]) -> int:
    match = _DIST_RANK.search(head)
    if match:
        return int(match.group(1))
    if sidecar is not None:
        return sidecar.rank
    named = pattern.search(path.name)
    if named:
        return int(named.group(1))
    raise MergeInputError(
        path,
        "cannot tell the rank: no distributedInfo.rank in the trace, no sidecar, and the file name "
        "does not match rank<N>/rank-<N>/rank_<N>/worker<N> (pass --rank-pattern REGEX with one group)",
    )


def load_trace(path: Path) -> dict:
    """Parse a Kineto Chrome-JSON trace (.json or .json.gz), checked by :func:`check_events`."""
    return read_trace(path)[0]


def read_trace(path: Path) -> tuple[dict, tuple[Optional[int], Optional[int]]]:
    """:func:`load_trace` and the trace's first and last absolute ns."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except OSError as exc:
        raise MergeInputError(path, f"cannot read: {exc}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise MergeInputError(path, f"truncated or corrupt gzip ({exc})") from None
    try:
        trace = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MergeInputError(path, f"not valid JSON ({exc})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise MergeInputError(path, "not a profiler trace: no traceEvents list")
    return trace, check_events(path, trace)


#: Longest duration an event may claim (a day): beyond it the trace is corrupt, not slow.
MAX_DUR_US = 86_400 * 10**6
_MAX_NS = (1 << 63) - 1


def _number(value: object) -> bool:
    return value.__class__ in (int, float) and value == value and abs(value) != float("inf")


def _count(value: object, least: int) -> bool:
    return value.__class__ is int and value >= least


def _check_distributed_info(path: Path, info: object) -> None:
    """The fields of distributedInfo the merge reads must have their types (rank, world, groups)."""
    if not info:
        return
    if info.__class__ is not dict:
        raise MergeInputError(path, "distributedInfo is not an object")
    for key, least in (("rank", 0), ("world_size", 1)):
        if key in info and not _count(info[key], least):
            raise MergeInputError(path, f"distributedInfo.{key} {info[key]!r} is not an integer >= {least}")
    if "rank" in info and "world_size" in info and info["rank"] >= info["world_size"]:
        raise MergeInputError(path, f"distributedInfo.rank {info['rank']} is outside world_size {info['world_size']}")
    groups = info.get("pg_config") or []
    if groups.__class__ is not list:
        raise MergeInputError(path, "distributedInfo.pg_config is not a list")
    for i, pg in enumerate(groups):
        if pg.__class__ is not dict:
            raise MergeInputError(path, f"distributedInfo.pg_config[{i}] is not an object")
        ranks = pg.get("ranks", [])
        if ranks.__class__ is not list or not all(_count(r, 0) for r in ranks):
            raise MergeInputError(path, f"distributedInfo.pg_config[{i}].ranks is not a list of ranks")


def _check_ids(path: Path, i: int, e: dict) -> None:
    """pid and tid are numbers or names (Kineto writes both), args an object (or null): the merge keys and reads them."""
    for key in ("pid", "tid"):
        if key in e and e[key].__class__ is not int and e[key].__class__ is not str:
            raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): {key} {e[key]!r} is not a number or name")
    if e.get("args") is not None and e["args"].__class__ is not dict:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): args is not an object")


def check_events(path: Path, trace: dict) -> tuple[Optional[int], Optional[int]]:
    """Refuse events the merge cannot place; return the trace's first and last ns (None if no timed event).

    Every slice and instant needs a finite, non-negative time that fits the
    output's int64 nanoseconds, and a slice a duration below a day; text
    fields must be text, pid and tid numbers or names, and ``args`` an
    object, so nothing downstream meets a surprise type. One pass, cheap next
    to parsing: each event is only tested here; :func:`_refuse` says what is
    wrong with one that fails.
    """
    _check_distributed_info(path, trace.get("distributedInfo"))
    base = base_ns(trace)
    first = last = None
    inf = _INF
    for i, e in enumerate(trace["traceEvents"]):
        if e.__class__ is not dict:
            raise MergeInputError(path, f"traceEvents[{i}] is not an object")
        ph = e.get("ph")
        if ph == "X":
            dur = e.get("dur", 0)
            dc = dur.__class__
            if (dc is not int and dc is not float) or not 0 <= dur <= MAX_DUR_US:
                _refuse(path, i, e, base)
        elif ph == "i" or ph == "I":
            dur = 0
        else:
            if ph == "M":
                _check_ids(path, i, e)
            continue
        ts = e.get("ts")
        tc = ts.__class__
        pc = e.get("pid", _MISSING).__class__
        ic = e.get("tid", _MISSING).__class__
        args = e.get("args")
        if ((tc is not int and tc is not float) or not 0 <= ts < inf
                or e.get("name", "").__class__ is not str or e.get("cat", "").__class__ is not str
                or (pc is not int and pc is not str) or (ic is not int and ic is not str)
                or (args is not None and args.__class__ is not dict)):
            _refuse(path, i, e, base)
        start = (ts * 1000 if tc is int else round(ts * 1000)) + base
        end = start + (dur * 1000 if dc is int else round(dur * 1000)) if dur else start
        if start < 0 or end > _MAX_NS:
            _refuse(path, i, e, base)
        if first is None or start < first:
            first = start
        if last is None or end > last:
            last = end
    return first, last


_INF = float("inf")
_MISSING = object()


def _refuse(path: Path, i: int, e: dict, base: int) -> None:
    """Raise the error that says what is wrong with ``traceEvents[i]``, a slice or instant :func:`check_events` refused."""
    ph = e.get("ph")
    ts = e.get("ts")
    if ts is None:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): missing 'ts'")
    if not _number(ts) or ts < 0:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): ts {ts!r} is not a finite non-negative number")
    dur = e.get("dur", 0) if ph == "X" else 0
    if not _number(dur) or not 0 <= dur <= MAX_DUR_US:
        raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): dur {dur!r} is not a duration in [0, 1 day] (us)")
    for key in ("name", "cat"):
        if key in e and e[key].__class__ is not str:
            raise MergeInputError(path, f"traceEvents[{i}]: {key} {e[key]!r} is not a string")
    for key in ("pid", "tid"):
        if key not in e:
            raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): missing {key!r}")
    _check_ids(path, i, e)
    start = round(ts * 1000) + base
    raise MergeInputError(path, f"traceEvents[{i}] ({e.get('name')!r}): time {start} ns is outside int64 nanoseconds")


def load_sidecar(path: Path) -> Sidecar:
    """Parse and validate a commtag sidecar."""
    # Imported here: pydantic costs ~0.1 s of start-up, which a merge without sidecars never pays.
    from pydantic import ValidationError

    from commtag.schema import Sidecar

    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return Sidecar.model_validate_json(raw)
    except OSError as exc:
        raise MergeInputError(path, f"cannot read: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise MergeInputError(path, f"invalid sidecar: {where}: {first.get('msg')}") from None


def base_ns(trace: dict) -> int:
    """What to add to ``ts * 1000`` for CLOCK_REALTIME ns (0 for old absolute traces)."""
    base = trace.get("baseTimeNanoseconds", 0)
    return base if isinstance(base, int) else 0


def _instant(event: dict, base: int) -> Optional[tuple[tuple[int, int], Instant]]:
    """The (pid, tid) row and the instant of an "i" event, or None when the timeline drops it."""
    pid = event.get("pid")
    tid = event.get("tid")
    if pid.__class__ is not int or tid.__class__ is not int or event.get("ts") is None:
        return None
    return (pid, tid), (event_ns(event, base)[0], event.get("name", ""), event.get("cat"), event.get("args"))


def event_ns(event: dict, base: int) -> tuple[int, int]:
    """Start and end of an X event in absolute ns (the writer's exact rounding)."""
    t = event["ts"] * 1000
    start = (t if t.__class__ is int else round(t)) + base
    d = event.get("dur", 0) * 1000
    d = d if d.__class__ is int else round(d)
    return start, start + (d if d > 0 else 0)


def _meta(e: dict, gpu_pids: set, names: dict, labels: dict) -> None:
    """Take a thread's name or a process's labels from an "M" event."""
    what = e.get("name")
    args = e.get("args") or {}
    if what == "thread_name":
        names[(e.get("pid"), e.get("tid"))] = str(args.get("name", "")).strip()
    elif what == "process_labels":
        labels[e.get("pid")] = str(args.get("labels", ""))
        if str(args.get("labels", "")).startswith("GPU"):
            gpu_pids.add(e.get("pid"))


def to_timeline(
    rank: int,
    traces: Sequence[dict],
    *,
    offset_ns: int = 0,
    host: str = "",
    flows_out: Optional[dict[int, list[int]]] = None,
    flows_in: Optional[dict[int, list[int]]] = None,
    next_flow: Optional[Callable[[], int]] = None,
) -> RankTimeline:
    """Convert one rank's traces into tracks of slices for the writer.

    ``flows_out``/``flows_in`` map ``id(event)`` to the flow ids the attacher
    set; launch-to-device-work flows (same "correlation") are added here when
    ``next_flow`` gives ids, from whichever of the pair starts first.
    ``offset_ns`` is this rank's clock correction (``--align``).
    Kernel categories (:mod:`commtag.kernels`) are summed on the way: each
    graph launch slice gets its breakdown as annotations, each GPU stream row
    a summary instant, and the timeline the breakdown of every lane.
    """
    fo_get = (flows_out or {}).get
    fi_get = (flows_in or {}).get
    #: The few events with flows: one set test per event instead of two lookups.
    flowing = set(flows_out or ()) | set(flows_in or ())
    buckets: dict[tuple, list] = {}
    instants: dict[tuple, list] = {}
    thread_names: dict = {}
    labels: dict = {}
    gpu_pids: set = set()
    categories = DeviceWork()
    for trace in traces:
        events = trace["traceEvents"]
        base = base_ns(trace) + offset_ns
        launches: dict[int, tuple[list, int]] = {}
        work: list[tuple[list, int, int]] = []
        for e in events:
            ph = e.get("ph")
            if ph == "X":
                pid = e.get("pid")
                tid = e.get("tid")
                ts = e.get("ts")
                if pid.__class__ is not int or tid.__class__ is not int or ts is None:
                    continue
                t = ts * 1000
                start = (t if t.__class__ is int else round(t)) + base
                dur = e.get("dur", 0)
                d = dur * 1000
                if d.__class__ is not int:
                    d = round(d)
                key = (pid, tid)
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = []
                ref = id(e)
                cat = e.get("cat")
                args = e.get("args")
                name = e.get("name", "")
                if ref in flowing:
                    bucket.append((start, start + d if d > 0 else start, name, cat, args, fo_get(ref), fi_get(ref)))
                else:
                    bucket.append((start, start + d if d > 0 else start, name, cat, args, None, None))
                if args and (cat in LAUNCH_CATEGORIES or cat in GPU_CATEGORIES):
                    corr = args.get("correlation")
                    if corr is not None:
                        if cat in LAUNCH_CATEGORIES:
                            launches[corr] = (bucket, len(bucket) - 1)
                            categories.launch(name, corr)
                        else:
                            gpu_pids.add(pid)
                            work.append((bucket, len(bucket) - 1, corr))
                    if cat in WORK_CATEGORIES:
                        categories.kernel(key, name, cat, dur, args)
            elif ph == "i" or ph == "I":
                # Instants are rare: the shared helper's call costs nothing here.
                placed = _instant(e, base)
                if placed is not None:
                    instants.setdefault(placed[0], []).append(placed[1])
            elif ph == "M":
                _meta(e, gpu_pids, thread_names, labels)
        if next_flow is not None:
            _launch_flows(launches, work, next_flow)
        for corr in categories.end_trace():
            bucket, index = launches[corr]
            s = bucket[index]
            bucket[index] = s[:4] + ({**(s[4] or {}), **_kernel_args(rank, "graph launch", corr, categories.launches[corr])},) + s[5:]
    categories.finish()
    summaries = {key: (f"commtag kernels: {b.describe()}", _kernel_args(rank, "stream", key[1], b))
                 for key, b in categories.streams.items()}
    tracks = _tracks(buckets, instants, thread_names, gpu_pids, summaries)
    starts = [t.slices[0][0] for t in tracks if t.slices] + [t.instants[0][0] for t in tracks if t.instants]
    devices = sorted(p for p in gpu_pids if any(k[0] == p for k in buckets))
    device = ", ".join(labels.get(p) or f"GPU {p}" for p in devices) or "CPU"
    name = f"rank {rank}" + (f" · {host}" if host else "") + f" · {device}"
    return RankTimeline(rank=rank, process_name=name, tracks=tracks, first_ns=min(starts) if starts else None,
                        lane_kernels={lane: _kernel_args(rank, "lane", lane, b) for lane, b in categories.lanes.items()})


def _kernel_args(rank: int, scope: str, ident: object, breakdown) -> dict:
    """Debug annotations naming a breakdown's scope and carrying its figures."""
    return {ANN_RANK: rank, ANN_SCOPE: scope, ANN_ID: ident, **breakdown.annotations()}


def _with_flow(bucket: list, index: int, fid: int, out: bool) -> None:
    """Add flow ``fid`` to a slice's outgoing (slot 5) or incoming (slot 6) ids."""
    s = bucket[index]
    slot = 5 if out else 6
    ids = (*s[slot], fid) if s[slot] else (fid,)
    bucket[index] = s[:slot] + (ids,) + s[slot + 1:]


def _launch_flows(launches: dict, work: list, next_flow: Callable[[], int]) -> None:
    """One flow per piece of device work, from its launch (or from the work if it starts first)."""
    for bucket, index, corr in work:
        hit = launches.get(corr)
        if hit is None:
            continue
        lbucket, lindex = hit
        fid = next_flow()
        launch_first = lbucket[lindex][0] <= bucket[index][0]
        _with_flow(lbucket, lindex, fid, launch_first)
        _with_flow(bucket, index, fid, not launch_first)


def _tracks(buckets: dict, instants: dict, thread_names: dict, gpu_pids: set,
            summaries: Optional[dict] = None) -> list[Track]:
    """Name and order the rows: main thread first then by name; streams by id.

    ``summaries``: (pid, tid) -> (name, args) of the row's kernel-category instant.
    """
    cpu_pids = [pid for pid, _ in buckets if pid not in gpu_pids]
    main_pid = max(set(cpu_pids), key=cpu_pids.count) if cpu_pids else None
    tracks = []
    for key in sorted(set(buckets) | set(instants)):
        pid, tid = key
        if pid in gpu_pids:
            group = f"GPU {pid}"
            name = thread_names.get(key) or f"stream {tid}"
            order = tid
        else:
            group = CPU_GROUP
            name = thread_names.get(key) or f"thread {tid}"
            if pid != main_pid:
                name = f"pid {pid} · {name}"
            order = -1 if tid == pid else tid
        tracks.append(Track(name=name, group=group, order=order, slices=buckets.get(key, []),
                            instants=instants.get(key, []), summary=(summaries or {}).get(key)))
    for group in {t.group for t in tracks}:
        members = sorted((t for t in tracks if t.group == group), key=lambda t: (t.order, t.name))
        for i, t in enumerate(members):
            t.order = i
    return tracks

"""commtag's own flight recorder: a bounded ring of this rank's last collective calls, kept whether or
not a profiler runs, and written as a Flight Recorder dump (torch's schema, commtag's keys added).

Why its own: torch's recorder is off by default, skips gloo's send/recv and the calls a CUDA graph
replays, and on gloo cannot tell a call that completed from one that failed. The ring holds each
call from its start (a call in flight is what a hang is), its end and error written in when known.
It is bounded: at most ``size`` calls, the oldest dropped first (the dump says how many were).
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

from commtag.atomic import write_atomic
from commtag.runtime.describe.calls import CallRecord, OpCall
from commtag.runtime.describe.groups import GroupState
from commtag.runtime.failopen import log_once
from commtag.runtime.record.torchdumps import save_beside
from commtag.vocab import RECV, SEND
from commtag.vocab import flight_recorder as fr

#: How many calls the ring keeps unless told (torch's own recorder has no default: it is off).
DEFAULT_RING_SIZE = 2000
#: The environment variables that turn the ring on for a launcher (``commtag.install()`` reads them).
DUMP_DIR_ENV = "COMMTAG_DUMP_DIR"
RING_SIZE_ENV = "COMMTAG_RING_SIZE"
_now_ns = time.time_ns
#: commtag's dump of rank R is ``<DIR>/commtag_fr_<R>``; torch's, saved beside it, are named by
#: :func:`commtag.runtime.record.torchdumps.recorder_prefix`.
OWN_PREFIX = "commtag_fr_"


def size_from_environment() -> int:
    """COMMTAG_RING_SIZE, or the default where it is unset or not a positive number (said once: a
    launcher's typo must not stop the job)."""
    text = os.environ.get(RING_SIZE_ENV, "").strip()
    if not text:
        return DEFAULT_RING_SIZE
    try:
        size = int(text)
        if size < 1:
            raise ValueError(f"{RING_SIZE_ENV}={text!r} is not a number of calls (1 or more)")
    except ValueError as exc:
        log_once(f"reading {RING_SIZE_ENV}; the ring keeps {DEFAULT_RING_SIZE} calls", exc)
        return DEFAULT_RING_SIZE
    return size


class Slot:
    """One call of the ring: its record (kept as the wrapper made it) and what happened to it."""

    __slots__ = ("record_id", "record", "end_ns", "error")

    def __init__(self, record_id: int, record: CallRecord) -> None:
        self.record_id = record_id
        self.record = record
        self.end_ns: Optional[int] = None
        self.error: Optional[str] = None


#: A call only the ring keeps (no profiler records it, no capture is open) is a plain list, the
#: cheapest object Python builds (no class to call, no ``__init__`` frame), laid out as
#: ``[record id, OpCall, Seq, the calling thread's ThreadState, start ns, end ns, error]``: the slow path builds
#: it inline, once per call, and this module alone reads it. A call that is annotated as well keeps
#: its record in a :class:`Slot`.
Kept = list[Any]
KEPT_CALL, KEPT_END, KEPT_ERROR = 1, 5, 6


class Replayed:
    """One captured collective that a CUDA-graph replay runs, kept as the replay starts (torch's
    recorder skips replays: nothing of c10d runs). Its capture Seq is the call's Seq at capture, the
    same on every replay; ``replay`` the replay's index since that capture. Its place among the group's
    calls is the latest Seq before it plus the replayed collectives the group has run so far, this one
    included (an eager call's place is its Seq plus the replays before it), so each call of the group
    has its own place, in time order, the same on every member (:func:`_places`; ``after_seq``, the
    group's Seq as it started, stands in where the ring no longer holds the eager call before it)."""

    __slots__ = ("record_id", "call", "capture_seq", "replay", "after_seq", "replayed", "start_ns", "tid",
                 "thread_name", "error")

    def __init__(self, record_id: int, call: OpCall, capture_seq: int, replay: int, thread: Any) -> None:
        state = call.state
        self.record_id = record_id
        self.call = call
        self.capture_seq = capture_seq
        self.replay = replay
        self.after_seq = state.last_collective_seq()
        state.replayed += 1
        self.replayed = state.replayed
        self.start_ns = _now_ns()
        self.tid = thread.tid
        self.thread_name = thread.thread_name
        #: What the replay's launch raised, if it did.
        self.error: Optional[str] = None


class Ring:
    """The bounded ring and where it is written."""

    def __init__(self, dump_dir: Path, size: int) -> None:
        self.dump_dir = Path(dump_dir)
        self.size = size
        self.slots: collections.deque[Slot | Kept | Replayed] = collections.deque(maxlen=size)
        #: The records' ids, in the order the calls started (a Kept call takes its own).
        self.ids = itertools.count()
        self._write_lock = threading.Lock()
        #: The thread writing a dump now (None: none).
        self._writer: Optional[int] = None
        #: Held while a replay's calls are counted and kept, and while a dump takes its snapshot: the
        #: snapshot and the groups' replay counts then agree (see :func:`_places`).
        self._replay_lock = threading.Lock()
        #: The groups whose collectives replays ran, by name.
        self.replay_groups: dict[str, GroupState] = {}

    def start(self, record: CallRecord) -> Slot:
        """Keep a call as it starts (deque.append with maxlen: atomic, the oldest dropped)."""
        slot = Slot(next(self.ids), record)
        self.slots.append(slot)
        return slot

    def keep(self, call: OpCall, seq: int, thread: Any) -> Kept:
        """Keep a plain collective that nothing else records, as it starts (the wrappers' hot path
        builds the same list inline); its end is written in by :func:`finish`."""
        kept = [next(self.ids), call, seq, thread, _now_ns(), None, None]
        self.slots.append(kept)
        return kept

    def replay_started(self, calls: list[tuple[OpCall, int]], replay: int, thread: Any) -> list[Replayed]:
        """Keep the captured collectives (call, capture Seq) of replay ``replay`` of a graph, as it starts."""
        kept = []
        with self._replay_lock:
            for call, capture_seq in calls:
                entry = Replayed(next(self.ids), call, capture_seq, replay, thread)
                self.replay_groups[call.state.name] = call.state
                self.slots.append(entry)
                kept.append(entry)
        return kept

    def dump(self, reason: str) -> Optional[Path]:
        """Write the ring (and torch's own dumps, where its recorders are on) into the dump folder;
        None where it could not be written (logged once: the job goes on). Another thread's dump under
        way is waited for; this thread's own, which a signal handler interrupted, is left to finish."""
        me = threading.get_ident()
        if self._writer == me:
            return None
        with self._write_lock:
            self._writer = me
            try:
                return self._write(reason)
            finally:
                self._writer = None

    def _write(self, reason: str) -> Optional[Path]:
        """commtag's file, then torch's, one after the other (one writer at a time: a temporary's name is per process)."""
        try:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            with self._replay_lock:
                slots = list(self.slots)
                replayed = {name: state.replayed for name, state in self.replay_groups.items()}
            rank = _global_rank(slots)
            data = pickle.dumps(dump_document(slots, reason, rank, self.size, replayed), protocol=2)
            path = write_atomic(self.dump_dir / f"{OWN_PREFIX}{rank}", data)
        except Exception as exc:  # noqa: BLE001 - fail open: a dump that cannot be written never stops the job
            log_once("writing commtag's flight-recorder dump", exc)
            return None
        try:
            save_beside(self.dump_dir, rank)
        except Exception as exc:  # noqa: BLE001 - fail open: commtag's own dump is written already
            log_once("saving torch's flight-recorder dumps beside commtag's", exc)
        return path


def _global_rank(slots: list[Slot | Kept | Replayed]) -> int:
    """This rank in the world: read from c10d, else from the calls kept."""
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return dist.get_rank()
    except Exception as exc:  # noqa: BLE001 - fail open: the calls kept still say it
        log_once("reading the rank for a dump", exc)
    for slot in reversed(slots):
        state = facts(slot).call.state
        return state.ranks[state.group_rank]
    return int(os.environ.get("RANK", "0"))


def dump_document(slots: list[Slot | Kept | Replayed], reason: str, rank: int, size: int,
                  replayed: Optional[dict[str, int]] = None) -> dict[str, Any]:
    """The ring as a Flight Recorder dump: torch's keys (so torch's analyzer and commtag's reader
    read it alike) and commtag's (``commtag_*``: peers, per-peer order, splits, end times, replays).
    ``replayed``: per group whose collectives replays ran, how many so far (taken with ``slots``)."""
    groups: dict[str, Any] = {}
    entries = []
    kept = [facts(slot) for slot in slots]
    places = _places(kept, replayed or {})
    for call in kept:
        state = call.call.state
        groups.setdefault(state.name, state)
        entries.append(_entry(call, list(groups).index(state.name), places.get(call.record_id)))
    world_size = None
    try:
        import torch.distributed as dist

        world_size = dist.get_world_size() if dist.is_initialized() else None
    except Exception as exc:  # noqa: BLE001 - fail open: the dump still says what it holds
        log_once("reading the world size for a dump", exc)
    return {
        fr.FR_VERSION: fr.FR_KNOWN_VERSIONS[-1],
        fr.FR_PG_CONFIG: {name: {"name": name, "desc": state.desc, "ranks": str(list(state.ranks))}
                          for name, state in groups.items()},
        fr.FR_PG_STATUS: {},
        fr.FR_COMM_LIB_VERSION: "",
        fr.FR_ENTRIES: entries,
        fr.CT_RANK: rank,
        fr.CT_WORLD_SIZE: world_size,
        fr.CT_DUMP_NS: time.time_ns(),
        fr.CT_DUMP_REASON: reason,
        fr.CT_RING_SIZE: size,
    }


class Facts(NamedTuple):
    """One call of the ring as the dump reads it, whichever way it was kept."""

    record_id: int
    call: OpCall
    seq: int
    pair_seq: Optional[int]
    start_ns: int
    tid: int
    thread_name: str
    end_ns: Optional[int]
    error: Optional[str]
    #: A replayed collective's replay index (its ``seq`` is its capture Seq), its place, and the
    #: group's replayed collectives counted with it (see :class:`Replayed`).
    replay: Optional[int] = None
    place: Optional[int] = None
    replayed: int = 0


def facts(slot: Slot | Kept | Replayed) -> Facts:
    """What the ring holds of one call (a :class:`Slot`, a :data:`Kept` list or a :class:`Replayed`)."""
    if isinstance(slot, Replayed):
        return Facts(slot.record_id, slot.call, slot.capture_seq, None, slot.start_ns, slot.tid, slot.thread_name,
                     None, slot.error, slot.replay, slot.after_seq + slot.replayed, slot.replayed)
    if type(slot) is list:
        record_id, call, seq, thread, start_ns, end_ns, error = slot
        return Facts(record_id, call, seq, None, start_ns, thread.tid, thread.thread_name, end_ns, error)
    assert isinstance(slot, Slot)
    record = slot.record
    return Facts(slot.record_id, record.call, record.seq, record.pair_seq, record.start_ns, record.tid,
                 record.thread_name, slot.end_ns, slot.error)


def _places(kept: list[Facts], replayed: dict[str, int]) -> dict[int, int]:
    """Record id -> place of each collective on a group whose collectives replays ran (in time order,
    as export-fr numbers such a group, but counted from the group's Seq; see :class:`Replayed`).

    Counted in the ring's order, the one order of this rank's calls: an eager call's place is its Seq
    plus the group's replays before it, a replay's the Seq of the group's eager call before it plus
    its own count (walked from the newest: the count taken with the snapshot, then one fewer for each
    replay passed; the ring drops only its oldest calls, so none between is missing). A replay with no
    eager call before it in the ring takes the Seq it read as it started, but below the next eager
    call's: a thread that took a Seq and was kept after a replay another thread counted meanwhile
    would otherwise share that replay's place. So places rise along the ring, one per call."""
    running = dict(replayed)
    for call in kept:  # a group whose count was not taken: its newest replay's count
        if call.place is not None:
            name = call.call.state.name
            running[name] = max(running.get(name, 0), call.replayed)
    counts: dict[int, int] = {}  # record id -> a replay's count, an eager call's replays before it
    next_seq: dict[int, int] = {}  # a replay's record id -> the Seq of the group's next eager call
    later: dict[str, int] = {}
    on_groups = [call for call in kept
                 if call.call.state.name in running and call.call.p2p not in (SEND, RECV)]
    for call in reversed(on_groups):
        name = call.call.state.name
        if call.place is not None:
            counts[call.record_id] = call.replayed
            running[name] = call.replayed - 1
            if name in later:
                next_seq[call.record_id] = later[name]
        else:
            counts[call.record_id] = running[name]
            later[name] = call.seq
    places: dict[int, int] = {}
    eager_seq: dict[str, int] = {}
    for call in on_groups:
        name = call.call.state.name
        count = counts[call.record_id]
        if call.place is None:
            eager_seq[name] = call.seq
            places[call.record_id] = call.seq + count
            continue
        after = eager_seq.get(name)
        if after is None:
            after = call.place - call.replayed  # the group's Seq as the replay started
            after = min(after, next_seq.get(call.record_id, after + 1) - 1)
        places[call.record_id] = after + count
    return places


def _entry(kept: Facts, pg_id: int, place: Optional[int] = None) -> dict[str, Any]:
    call = kept.call
    state = call.state
    p2p = call.p2p in (SEND, RECV)
    name = fr.profiling_name(state.backend, fr.fr_op(state.backend, call.collective))
    if p2p and call.peer is not None and call.peer in state.ranks:
        peer = state.ranks.index(call.peer)
        name += f" {state.group_rank}->{peer}" if call.p2p == SEND else f" {state.group_rank}<-{peer}"
    ended = kept.end_ns is not None
    entry: dict[str, Any] = {
        fr.E_RECORD_ID: kept.record_id, fr.E_PG_ID: pg_id, fr.E_PROCESS_GROUP: (state.name, state.desc),
        fr.E_SEQ: 0 if p2p else kept.seq, fr.E_P2P_SEQ: kept.seq if p2p else 0, fr.E_OP_ID: kept.record_id,
        fr.E_PROFILING_NAME: name, fr.E_CREATED_NS: kept.start_ns,
        fr.E_INPUT_SIZES: [[call.in_nelems]], fr.E_INPUT_DTYPES: [call.dtype],
        fr.E_OUTPUT_SIZES: [[call.out_nelems]], fr.E_OUTPUT_DTYPES: [call.dtype],
        fr.E_STATE: (fr.STATE_COMPLETED if kept.error is None else fr.STATE_STARTED) if ended else fr.STATE_STARTED,
        fr.E_STARTED_NS: kept.start_ns, fr.E_COMPLETED_NS: kept.end_ns if ended and kept.error is None else None,
        fr.E_RETIRED: ended, fr.E_IS_P2P: p2p, fr.E_FRAMES: [],
        fr.E_THREAD_ID: str(kept.tid), fr.E_THREAD_NAME: kept.thread_name,
        fr.CT_END_NS: kept.end_ns, fr.CT_ERROR: kept.error,
    }
    if p2p:
        entry[fr.CT_PEER] = call.peer
        entry[fr.CT_PAIR_SEQ] = kept.pair_seq
    if place is not None:  # a group whose collectives replays ran: numbered in time order (export-fr's keys)
        entry[fr.E_SEQ] = place
        entry[fr.CT_CAPTURE_SEQ] = kept.seq
    if kept.replay is not None:
        # Enqueued on the GPU: the host sees it scheduled and never its start or end.
        entry.update({fr.CT_REPLAY: kept.replay, fr.E_STATE: fr.STATE_SCHEDULED, fr.E_STARTED_NS: None})
    if call.in_split != "[]" or call.out_split != "[]":
        entry[fr.CT_IN_SPLITS] = _numbers(call.in_split)
        entry[fr.CT_OUT_SPLITS] = _numbers(call.out_split)
    return entry


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.strip("[]").split(",") if part.strip()]


def replay_failed(kept: list[Replayed], error: str) -> None:
    """A replay's launch raised ``error``: its calls failed, and the dump is written."""
    for entry in kept:
        entry.error = error
    ring = RING
    if ring is not None and kept:
        ring.dump(f"exception: {error}")


#: The ring of this process while ``install(dump_dir=...)`` has it on; None (the default) costs nothing.
RING: Optional[Ring] = None


def finish(slot: Slot | Kept, error: Optional[str], future: Any) -> None:
    """A call's end: now, or when its work's future completes; a failed call (a timeout, a peer
    gone) also writes the dump, since the job may not live to write another."""
    if future is None:
        _ended(slot, error)
        return

    def done(fut: Any) -> None:
        failure = None
        try:
            fut.value()
        except Exception as exc:  # noqa: BLE001 - the work failed: kept as the call's error
            lines = str(exc).strip().splitlines()
            failure = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        _ended(slot, failure)

    future.add_done_callback(done)


def _ended(slot: Slot | Kept, error: Optional[str]) -> None:
    if type(slot) is list:
        slot[KEPT_ERROR] = error
        slot[KEPT_END] = time.time_ns()
    else:
        assert isinstance(slot, Slot)
        slot.error = error
        slot.end_ns = time.time_ns()
    ring = RING
    if error is not None and ring is not None:
        ring.dump(f"exception: {error}")

"""Plain records the merge wing hands to the analysis.

The loader and attacher turn every rank's trace and sidecar into these; the
analysis, the text/JSON report, the plot and the Perfetto annotations all read
them, so none of those needs to know Kineto or Perfetto.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, NamedTuple, Optional, Sequence

from commtag.constants import parse_rank_list
from commtag.identity import describe_ranks
from commtag.merge.account import EventAccount
from commtag.merge.batches import batch_keys
from commtag.vocab import (
    ANN_CROSS_RANK, ANN_LANE, ANN_LANE_ID, ANN_P2P, ANN_P2P_PAIR_SEQ, ANN_PEER, ANN_PG_UID, ANN_RANK, ANN_RECORD_FORMAT,
    ANN_REPLAY, ANN_SEQ_FROM, ANN_SEQ_PART, ANN_SOURCE, COLLECTIVE_NAME_KEY, DST_RANK_KEY, DTYPE_KEY, GROUP_SIZE_KEY,
    IN_NELEMS_KEY, NCCL2_BATCH_P2P, OUT_NELEMS_KEY, PG_RANKS_KEY, RANK_KEY, RECV, SEQ_KEY, SRC_RANK_KEY,
    UNDEFINED_DTYPE, legacy_view,
)

_ABSENT = object()


#: The source of an instance timed by its CPU op (record_param_comms, or the c10d op of a
#: recorded call), when no kernel of its carried the metadata: the host time of the call
#: (NCCL only enqueues the work there), so no bandwidth is measured from it.
CPU_OP_SOURCE = "cpu-op"


def whole(value: object, default: int) -> int:
    """An eager key's count as an int; ``default`` where a trace wrote something else (null, text)."""
    if value.__class__ is int:
        return value
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return default


def ranks_of(args: Mapping[str, object]) -> tuple[int, ...]:
    """The group's global ranks an event's "Process Group Ranks" lists (empty when it does not)."""
    return tuple(parse_rank_list(str(args.get(PG_RANKS_KEY, "[]"))) or ())


#: Keys whose values differ between the instances of one call site (steps, replays,
#: ranks), in the order they are written: an instance's own ``args``. The rest are its
#: ``common_args`` (see :meth:`Interner.split`).
OWN_ORDER = (RANK_KEY, SEQ_KEY, ANN_SEQ_PART, ANN_P2P_PAIR_SEQ, ANN_PEER, ANN_REPLAY, ANN_RANK)
OWN_KEYS = frozenset(OWN_ORDER)


class Interner:
    """One object for equal values that a merge's instances repeat; owned by one merge.

    A 128-rank merge holds 10^5 instances: a tuple of 128 ranks, or a dict of a call
    site's eager keys, for each would outweigh everything else it keeps. Instances of one
    call site, on every rank and in every step or replay, share one ``common_args`` dict
    and one tuple of member ranks instead. The tables live as long as the merge that
    made the interner, and no longer.
    """

    __slots__ = ("_shared", "_common", "_sourced", "_read")

    def __init__(self) -> None:
        self._shared: dict[object, object] = {}
        self._common: dict[tuple, dict] = {}
        #: (id of an event's common args, source) -> (those args, the instance's: with "commtag source").
        self._sourced: dict[tuple[int, str], tuple[dict, dict]] = {}
        #: (id of an instance's common args, its group's member count) -> (those args, read_site's reading).
        self._read: dict[tuple[int, int], tuple[dict, tuple]] = {}

    def shared(self, value):
        """The one object equal to ``value`` (a hashable: member ranks, the ranks text)."""
        found = self._shared.get(value)
        if found is None:
            found = self._shared[value] = value
        return found

    def common(self, args: dict) -> dict:
        """The one dict equal to ``args``, types included (see ``CollectiveInstance.common_args``)."""
        try:
            # The types too: 1, 1.0 and True are equal keys, but the trace must keep what it said.
            key = (tuple(args.items()), tuple(value.__class__ for value in args.values()))
            found = self._common.get(key)
        except TypeError:  # an unhashable value (a list some other tool wrote): not shared
            return args
        if found is None:
            found = self._common[key] = args
        return found

    def split(self, args: dict) -> tuple[dict, dict]:
        """An annotation as ``(common_args, args)``: the shared part, and its own."""
        return self.common({key: value for key, value in args.items() if key not in OWN_KEYS}), \
            {key: args[key] for key in OWN_ORDER if key in args}

    def with_source(self, event_common: dict, source: str) -> dict:
        """An instance's common args: its events' plus "commtag source", made once per pair."""
        key = (id(event_common), source)
        found = self._sourced.get(key)
        if found is not None:
            return found[1]
        sourced = self.common({**event_common, ANN_SOURCE: source})
        self._sourced[key] = (event_common, sourced)  # holding the args keeps their id unique
        return sourced

    def reading(self, common_args: dict, members: int) -> tuple:
        """:func:`read_site` of an instance's common args, once per call site and group size."""
        found = self._read.get((id(common_args), members))
        if found is None:  # the args are held with it: their id stays theirs
            found = self._read[(id(common_args), members)] = (common_args, read_site(common_args, members))
        return found[1]


def read_site(args: Mapping[str, object], members: int) -> tuple[str, bool, str, int, int, str, int, str, int]:
    """What eager and group keys ``args`` say, as :class:`CollectiveInstance`'s fields (``members``: the group
    size where ``args`` gives none). A count written as something else (null, text) reads as the default the
    analysis uses; an absent dtype as the merge's :data:`UNDEFINED_DTYPE`."""
    get = args.get
    group_size = whole(get(GROUP_SIZE_KEY), members or 1)
    sizes = (str(get(COLLECTIVE_NAME_KEY, "")), whole(get(IN_NELEMS_KEY), 0), whole(get(OUT_NELEMS_KEY), 0))
    collective, in_nelems, out_nelems = legacy_view(get(ANN_RECORD_FORMAT), *sizes, group_size)
    return (str(args[ANN_PG_UID]), bool(get(ANN_P2P, False)), collective, in_nelems, out_nelems, str(get(
        DTYPE_KEY, UNDEFINED_DTYPE)), group_size, str(args[ANN_LANE]), int(get(ANN_LANE_ID, 0)))  # type: ignore[call-overload]


@dataclass(slots=True)
class CollectiveInstance:
    """One collective as it ran on one rank."""

    rank: int
    pg_uid: str
    is_p2p: bool
    seq: int
    #: Replay index for a graph-replayed collective, else None.
    replay: Optional[int]
    collective: str
    in_nelems: int
    out_nelems: int
    dtype: str
    group_size: int
    #: Global ranks of the group in group-rank order (empty if unknown).
    group_ranks: tuple[int, ...]
    start_ns: int
    end_ns: int
    #: Where the timing came from: "gloo", "nccl-kernel", "graph-replay", or
    #: :data:`CPU_OP_SOURCE`.
    source: str
    lane_name: str = ""
    #: This instance's own key/values (Seq, its rank, its wait); with ``common_args``
    #: the eager-style annotations of its slices. Keys added to one instance go here.
    args: dict[str, object] = field(default_factory=dict)
    #: The group's lane id (orders lanes identically on every rank).
    lane_id: int = 0
    #: Flow id the source slice (gloo op, kernel) starts and the lane slice ends.
    source_flow: Optional[int] = None
    #: Key/values every instance of one call site has alike (its op, sizes, group), one
    #: dict shared by all of them, never changed in place: a merge keeps every
    #: instance of every rank, and a dict of its own each was most of their memory.
    common_args: dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_args(cls, args: Mapping[str, object], *, rank: int, seq: int, replay: Optional[int],
                  group_ranks: tuple[int, ...], start_ns: int, end_ns: int, source: str, own: dict[str, object],
                  common_args: Optional[dict[str, object]] = None,
                  source_flow: Optional[int] = None, reading: Optional[tuple] = None) -> "CollectiveInstance":
        """The instance an event's eager keys and commtag's group keys in ``args`` describe (:func:`read_site`;
        ``reading``: its result, where the caller has it: :meth:`Interner.reading`), for the merge
        (commtag.merge.rank.attach) and for a merged trace's lane slices (commtag.merge.pftrace.readback)."""
        pg_uid, is_p2p, collective, in_nelems, out_nelems, dtype, group_size, lane_name, lane_id = reading or read_site(
            args, len(group_ranks))
        return cls(rank, pg_uid, is_p2p, seq, replay, collective, in_nelems, out_nelems, dtype, group_size,
                   group_ranks, start_ns, end_ns, source, lane_name, own, lane_id, source_flow,
                   {} if common_args is None else common_args)

    def arg(self, key: str, default: object = None) -> object:
        """The value of annotation ``key`` (own before common)."""
        value = self.args.get(key, _ABSENT)
        return self.common_args.get(key, default) if value is _ABSENT else value

    def all_args(self) -> dict[str, object]:
        """Every annotation, as its slices carry them: common keys first, then its own."""
        return {**self.common_args, **self.args}

    @property
    def key(self) -> tuple[str, bool, int, Optional[int]]:
        """The cross-rank key: the same instance has it on every member rank."""
        return (self.pg_uid, self.is_p2p, self.seq, self.replay)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def p2p_ends(self) -> Optional[tuple[int, int]]:
        """(sender, receiver) global ranks of a send/recv; None when the peer is unknown (or several: a batch)."""
        if self.collective == NCCL2_BATCH_P2P:
            return None
        peer = None
        for key in (DST_RANK_KEY, SRC_RANK_KEY, ANN_PEER):
            value = self.arg(key)
            if isinstance(value, int):
                peer = value
                break
        else:
            group_rank = self.arg(RANK_KEY)  # a send/recv's "Rank" is its peer's group rank
            if isinstance(group_rank, int) and 0 <= group_rank < len(self.group_ranks):
                peer = self.group_ranks[group_rank]
        if peer is None:
            return None
        return (peer, self.rank) if self.collective == RECV else (self.rank, peer)


class GroupLane(NamedTuple):
    """A process group as the lanes stage needs it: its lane and its member ranks.

    Not :class:`commtag.identity.GroupRow`: a group known only from a rank's
    instances has no description or backend, and this travels between merge
    workers as a JSON list.
    """

    lane_name: str
    lane_id: int
    pg_uid: str
    #: Global ranks in group-rank order (empty if unknown); one tuple for every rank of the
    #: group (the merge's :class:`Interner`): a list per rank grew with the square of the ranks.
    ranks: tuple[int, ...]


@dataclass(slots=True)
class RankSummary:
    """What the merge keeps of a rank once its events are written: what the analysis and the
    lanes stage need (and what merge workers exchange)."""

    rank: int
    host: str
    first_ns: Optional[int]
    #: The groups this rank knows (its group table, and those its instances name).
    groups: list[GroupLane]
    instances: list[CollectiveInstance] = field(default_factory=list)
    #: Lane name -> annotations of its kernel categories (from the rank's timeline).
    lane_kernels: dict[str, dict] = field(default_factory=dict)
    #: ``(first_ns, last_ns)`` of each of its trace files (see :class:`Coverage`).
    windows: list[tuple[int, int]] = field(default_factory=list)
    #: The world size its files claim.
    world_size: Optional[int] = None
    #: Events read, written and left out (by reason); None where nothing was written.
    account: Optional[EventAccount] = None
    #: What each merged file of the rank says of itself, for :func:`commtag.merge.inputs.runs.warnings`.
    files: list[FileSpan] = field(default_factory=list)
    #: What attaching left unsaid on its events (graph replays not matched, copies not placed).
    notes: list[str] = field(default_factory=list)
    #: ``(step, start_ns, end_ns)`` of each ProfilerStep of its trace files (:mod:`commtag.merge.steps`).
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    #: ``(step, pg uid, lowest Seq, highest Seq)`` of its collectives in each step: how its steps
    #: are matched to other ranks' (:mod:`commtag.merge.inputs.stepmatch`).
    step_seqs: list[tuple[int, str, int, int]] = field(default_factory=list)


def match_groups(instances: Sequence[CollectiveInstance]) -> list[list[CollectiveInstance]]:
    """The instances that are one collective across ranks, one list each.

    The single rule the cross-rank flows, the analysis and the clock alignment
    share, so that a flow never links what the analysis measures apart:

    * an instance the attacher marked ``"commtag cross-rank": False`` is alone;
    * nccl2's batches of p2p pair with their peers' batches (:mod:`commtag.merge.batches`);
    * a send/recv whose peer is known is a message: the k-th from its sender to
      its receiver in the group (and graph replay), k being ``"commtag p2p pair
      seq"`` when recorded, else its place among that rank's messages of the
      same sender and receiver, ordered by start (messages between two ranks
      arrive in order, as MPI's do). Seq cannot pair them: NCCL's p2p counter
      counts every peer together;
    * everything else matches on :attr:`CollectiveInstance.key`; a Seq the merge numbered
      itself (``"commtag seq from"``: by kernel or op order) only a Seq numbered the same
      way, never a Seq a backend issued (a recorded call's, beside it in the same group).

    Lists come in the order of their first member in ``instances``.
    """
    groups: dict[tuple, list[CollectiveInstance]] = {}
    for inst, key in zip(instances, match_keys(instances)):
        groups.setdefault(key, []).append(inst)
    return list(groups.values())


def match_keys(instances: Sequence[CollectiveInstance]) -> Iterator[tuple]:
    """Each instance's key in :func:`match_groups` (``("alone", id)`` for one matched alone), made
    as it is taken (not a tuple per instance at once): a rank's keys need only its own instances,
    so the worker holding it can make them."""
    counted: dict[int, int] = {}
    unnumbered = [
        (inst, ends) for inst in instances
        if inst.is_p2p and not isinstance(inst.arg(ANN_P2P_PAIR_SEQ), int)
        and (ends := inst.p2p_ends) is not None
    ]
    streams: dict[tuple, int] = defaultdict(int)
    for inst, ends in sorted(unnumbered, key=lambda pair: (pair[0].rank, pair[0].start_ns, pair[0].seq)):
        stream = (inst.pg_uid, inst.replay, ends, inst.rank)
        streams[stream] += 1
        counted[id(inst)] = streams[stream]
    batched = batch_keys(instances)
    for inst in instances:
        ends = inst.p2p_ends if inst.is_p2p else None
        if inst.arg(ANN_CROSS_RANK) is False:
            key: tuple = ("alone", id(inst))
        elif id(inst) in batched:
            key = batched[id(inst)]
        elif ends is not None:
            pair_seq = inst.arg(ANN_P2P_PAIR_SEQ)
            k = pair_seq if isinstance(pair_seq, int) else counted[id(inst)]
            key = ("p2p", inst.pg_uid, inst.replay, *ends, k)
        else:
            numbered = inst.arg(ANN_SEQ_FROM)
            key = inst.key if numbered is None else (numbered, *inst.key)
            if (part := inst.arg(ANN_SEQ_PART)) is not None:
                key = (*key, part)
        yield key


@dataclass(slots=True)
class CounterSeries:
    """A counter track of one rank, in its group's view when it names a lane (e.g. bus bandwidth of a group)."""

    rank: int
    #: Track name, unique per rank (e.g. "busbw pg 0 (GB/s)").
    track: str
    #: ``(ts_ns, value)`` points, any order.
    points: list[tuple[int, float]]
    unit: str = ""
    #: The lane (process group) it describes: the counter sits in that group's view.
    lane: str = ""


@dataclass(slots=True)
class Marker:
    """An instant on one rank's marker track (e.g. a desync or a straggler)."""

    rank: int
    ts_ns: int
    name: str
    args: dict[str, object] = field(default_factory=dict)


@dataclass(slots=True)
class TraceAnnotations:
    """What an analysis adds to the merged trace besides per-slice args."""

    counters: list[CounterSeries] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


#: The window assumed for a rank whose trace files' time spans are not known: all time.
ALL_TIME = (0, 1 << 63)
#: A merged trace keeps each rank's windows as instants on its marker track (for
#: ``commtag summary merged.pftrace``): ``"commtag marker": WINDOW_MARKER`` at its start, with
#: ``vocab.ANN_WINDOW_RANK``, ``ANN_WINDOW_NS``, ``ANN_WORLD_SIZE``, ``ANN_WINDOW_STEPS`` (merge.steps) and
#: ``ANN_WINDOW_SELECTION`` (:attr:`Coverage.selection`).
WINDOW_MARKER = "window"
#: With no window to carry it, the world size goes on an instant of its own at the lowest rank's first event.
WORLD_MARKER = "world"
#: The marker that says how the merged trace's clocks were aligned (``"commtag alignment"``: the
#: entry of :func:`commtag.merge.analysis.align.alignment_entry`, as JSON), at the lowest rank's first event.
ALIGNMENT_MARKER = "alignment"


@dataclass(slots=True)
class Coverage:
    """Which ranks were read, and when each one was profiled.

    A rank's window is the time span one of its trace files covers (a
    scheduled profiler writes one file per active window). That a rank has
    no record of a collective is only evidence against it where one of its
    windows covers the collective's time: between windows, nothing was
    recorded on any rank. Ranks of the world with no file at all are
    :attr:`absent`.
    """

    #: Rank -> ``(first_ns, last_ns)`` of each of its trace files, in time order.
    windows: dict[int, list[tuple[int, int]]]
    #: The world size the files claim, None when none says.
    world_size: Optional[int] = None
    #: Rank -> ``(step, start_ns, end_ns)`` of each ProfilerStep its files hold (commtag.merge.steps).
    steps: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    #: Rank -> its first event (ns): where the merged trace can say the world size when no window does.
    firsts: dict[int, int] = field(default_factory=dict)
    #: Rank -> the host it ran on (its sidecar's, else its trace's ``host_name``); absent where unknown.
    hosts: dict[int, str] = field(default_factory=dict)
    #: How the clocks were aligned (:func:`commtag.merge.analysis.align.alignment_entry`); None: not said.
    alignment: Optional[dict] = None
    #: The --steps or --window the merge kept ("" when it kept all time): the windows are then the
    #: kept spans, and what lies outside them was left out by it, not unrecorded.
    selection: str = ""
    #: What is said when ranks number their steps apart ('' when they agree: stepmatch.StepMatch.describe).
    step_numbers: str = ""

    @classmethod
    def unknown_windows(cls, ranks: Iterable[int], world_size: Optional[int] = None) -> "Coverage":
        """Ranks whose windows are not known: each is taken to cover all time."""
        return cls({r: [ALL_TIME] for r in ranks}, world_size)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.windows)

    @property
    def absent(self) -> list[int]:
        """Ranks of the world (by its size) that no trace file was read for."""
        return [r for r in range(self.world_size or 0) if r not in self.windows]

    def window_of(self, rank: int, ts_ns: int) -> Optional[int]:
        """Index of the window of ``rank`` that holds ``ts_ns`` (None: outside all of them)."""
        windows = self.windows.get(rank)
        if not windows:
            return None
        at = bisect.bisect_right(windows, (ts_ns, ALL_TIME[1])) - 1
        return at if at >= 0 and windows[at][1] >= ts_ns else None

    def covers(self, rank: int, start_ns: int, end_ns: int) -> bool:
        """Whether one window of ``rank`` holds all of ``[start_ns, end_ns]``."""
        return any(first <= start_ns and end_ns <= last for first, last in self.windows.get(rank, ()))

    def describe_absent(self) -> str:
        """One line naming the absent ranks ('' when none is)."""
        absent = self.absent
        if not absent:
            return ""
        return (f"{len(absent)} of {self.world_size} ranks have no trace ({describe_ranks(absent)}): "
                "collectives of their groups are incomplete (marked missing_ranks, no skew or bandwidth)")


@dataclass(slots=True)
class FileSpan:
    """What one merged trace file says of itself (and its sidecar, if any)."""

    path: str
    rank: int
    #: Its events' first start and last end, absolute ns (None without timed events).
    first_ns: Optional[int]
    last_ns: Optional[int]
    host: str = ""
    sidecar_host: str = ""
    run_id: str = ""
    trace_id: str = ""
    pid: Optional[int] = None  #: the process its sidecar was written by (None without a sidecar)
    devices: str = ""  #: the names of the devices its trace lists (deviceProperties), "" when none
    formats: str = ""  #: where its sidecar's stated record formats and its records disagree, "" when nowhere

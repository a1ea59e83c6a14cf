"""Process-group identity: uid, virtual lane and sequence counters.

Everything here must come out the same on every member rank of a group,
whatever order the ranks created or used their groups in, because the merger
joins ranks on ``(uid, Seq)``. Two facts make that possible without any
communication:

* ``pg.group_name`` is already agreed by the members: the backend's
  rendezvous store is prefixed with it, so members that disagreed could not
  have formed the group at all.
* The ordered list of global ranks is the same on every member.

uid, lane id and lane name are computed by :mod:`commtag.identity`, which the
merge also uses to rebuild a group from a trace's ``pg_config``.

**Generation**: ``destroy_process_group()`` and a new ``init_process_group()``
start a new life of the world whose groups get the old names again (torch
resets its group counter) and count Seq from 1 again. Within one life a name
is never reused (torch refuses a group name it has seen, even after that
group is destroyed), so a group's generation is the life it was made in:
how many default groups this process has seen initialised, less one. Every
rank knows that locally and gets the same number, because every rank runs
each init. commtag counts inits through c10d's ``_update_default_pg`` while
installed (:func:`watch_lives`), and a default group already present when it
starts watching or builds a group counts as one more life if it is new, so
an install after init or after a re-init still agrees across ranks.

**Seq** follows ProcessGroupNCCL's counters: one counter for collectives
(barrier included; a whole coalescing block takes one number) and a separate
one for point-to-point (a whole ``batch_isend_irecv`` takes one number). A
collective's Seq is read from the backend's own per-group count
(:data:`BACKEND_SEQ`), which every member advances for the same calls since
the group was made, so it does not depend on when commtag was installed or
which calls it saw: on NCCL that count is the collectives' (the value the
profiler records for eager kernels); gloo's also advances on each
point-to-point op of this rank (and more than once for a few calls that run
point-to-point inside, :data:`GLOO_INNER_P2P`), so commtag takes those
advances off (:attr:`GroupState.gloo_extra`): every p2p op issued through the
group's methods, direct ``isend``/``irecv`` included, is counted by
:mod:`commtag.runtime.install.p2p_count`. p2p calls made on a gloo group while
commtag was not installed are not seen: where the members made different
numbers of them, their later Seqs differ.
Other backends, and a group with two backends, are counted by commtag from
the moment it was installed. NCCL's p2p counter counts every peer together,
so it cannot pair a send with its recv; commtag also keeps a
per-(group, src, dst) counter, ``p2p_pair_seq``, which can.

**Backend.** ``dist.get_backend`` says "nccl" for legacy ProcessGroupNCCL and
ProcessGroupNCCL2 alike; the group's backend objects name themselves
(:func:`backend_impls`), and a group with an nccl2 one takes nccl2's record
format (:func:`record_format`): nccl2 has no p2p counter, its p2p records carry
the Seq of the group's last collective, so there ``p2p_pair_seq`` is the only
pairing (docs/nccl2.md §4).
"""

from __future__ import annotations

import atexit
import itertools
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from commtag.identity import format_list, group_uid, lane_id, lane_name
from commtag.schema import ProcessGroupInfo
from commtag.vocab import (
    BACKEND_NCCL, BACKEND_NCCL2, BACKEND_NCCL_LAZY, LEGACY_FORMAT, NCCL2_FORMAT, NCCL2_GROUP_RANKS, RECORD_FORMATS,
)

#: torch's per-group call count on a backend (c10d ``Backend::getSequenceNumberForGroup``; present
#: on ProcessGroupNCCL and ProcessGroupGloo in torch 2.11-2.15, 0 at the group's creation, advanced
#: when a call is issued, before it completes). A backend without it is counted by commtag.
BACKEND_SEQ = "_get_sequence_number_for_group"
#: Collectives that gloo runs as point-to-point ops of its own, each advancing the group's count:
#: their advance is measured around the call (torch 2.13: a list reduce_scatter advances it by the
#: group size, a monitored_barrier by 2 per peer on rank 0, 2 elsewhere).
GLOO_INNER_P2P = frozenset({"reduce_scatter", "monitored_barrier"})


def _start_and_stride(ranks: list[int], is_default: bool) -> tuple[Optional[int], Optional[int]]:
    """NCCL's getGlobalRankStartAndStride, with the values it would not record as None."""
    if is_default:
        return 0, 1
    start = ranks[0]
    if len(ranks) == 1:
        return start, None
    step = ranks[1] - ranks[0]
    strided = step > 0 and all(r == start + i * step for i, r in enumerate(ranks))
    return start, (step if strided else None)


@dataclass(eq=False)
class GroupState:
    """Everything per group that a wrapper needs, computed once."""

    uid: str
    name: str
    desc: str
    ranks: list[int]
    ranks_text: str
    size: int
    group_rank: int
    global_rank_start: Optional[int]
    global_rank_stride: Optional[int]
    backend: str
    lane_id: int
    lane_name: str
    #: The life of the world the group belongs to (0 = the first; see the module docstring).
    generation: int
    #: The NCCL backend whose collective counter is read; None elsewhere.
    nccl: Any = None
    #: The gloo backend whose call counter is read; None elsewhere.
    gloo: Any = None
    #: How far this rank's gloo counter has advanced beyond one per collective (its p2p ops).
    gloo_extra: int = 0
    #: Device type -> the implementation that runs it, as it names itself (see ProcessGroupInfo).
    backend_impls: dict[str, str] = field(default_factory=dict)
    #: Whose record format the group's annotations follow (vocab.LEGACY_FORMAT / NCCL2_FORMAT).
    record_format: str = LEGACY_FORMAT
    p2p_seq: int = 0
    #: The group's captured collectives that CUDA-graph replays ran, counted while commtag's flight
    #: recorder keeps them: a replay's place among the group's calls (see record.ring).
    replayed: int = 0
    pair_seq: dict[tuple[int, int], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _coll_counter: Any = field(default_factory=lambda: itertools.count(1))
    #: The counter's bound ``__next__``: what the wrappers' idle fast path calls for every
    #: collective (next() on a count is atomic under the GIL and cheaper than a lock). On an
    #: NCCL group the fast path still bumps it, harmlessly: Seq is read from the backend.
    bump: Callable[[], int] = field(init=False, repr=False)
    #: The CollectiveAnnotation fields that describe the group: the same for every call on it.
    annotation_fields: dict[str, Any] = field(init=False, repr=False)
    #: gloo's count (:data:`BACKEND_SEQ`) of a gloo group, bound once: a plain collective's Seq
    #: is read from it on every call the slow path numbers (two frames and a getattr fewer).
    gloo_seq: Optional[Callable[[], int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.bump = self._coll_counter.__next__
        self.gloo_seq = None if self.gloo is None else getattr(self.gloo, BACKEND_SEQ)
        nccl2 = self.record_format == NCCL2_FORMAT
        # nccl2 writes no description, rank start or stride, and "[]" ranks (vocab.NCCL2_OMITTED_KEYS).
        self.annotation_fields = {
            "group_size": self.size,
            "global_rank_start": None if nccl2 else self.global_rank_start,
            "global_rank_stride": None if nccl2 else self.global_rank_stride,
            "pg_name": self.name,
            "pg_desc": None if nccl2 else self.desc,
            "pg_ranks": NCCL2_GROUP_RANKS if nccl2 else self.ranks_text,
            "lane_id": self.lane_id,
            "lane_name": self.lane_name,
            "pg_uid": self.uid,
        }

    def next_collective_seq(self, already_bumped: bool = False) -> int:
        """Seq of the collective about to run (call before running it).

        ``already_bumped``: NCCL's startCoalescing has already advanced its
        counter for the block being numbered (legacy only: nccl2's never does).
        """
        if self.nccl is not None:
            value = int(getattr(self.nccl, BACKEND_SEQ)())
            return value if already_bumped and self.record_format != NCCL2_FORMAT else value + 1
        if self.gloo_seq is not None:
            return self.gloo_seq() + 1 - self.gloo_extra
        return self.bump()

    def last_collective_seq(self) -> int:
        """Seq of the group's latest collective so far (0: none), taking none: a CUDA-graph replay
        runs captured calls without numbering them, and is placed after this one."""
        if self.nccl is not None:
            return int(getattr(self.nccl, BACKEND_SEQ)())
        if self.gloo_seq is not None:
            return self.gloo_seq() - self.gloo_extra
        return int(repr(self._coll_counter)[len("count("):-1]) - 1  # the next number, unconsumed

    def gloo_count(self) -> int:
        """gloo's count of this group's calls on this rank so far (a gloo group only)."""
        assert self.gloo_seq is not None, "a gloo group's count"
        return self.gloo_seq()

    def gloo_advanced(self, steps: int) -> None:
        """gloo's counter moved ``steps`` further than one per collective (p2p ops, inner p2p)."""
        if self.gloo is not None and steps:
            with self.lock:
                self.gloo_extra += steps

    def next_p2p_seq(self) -> int:
        """Seq of a p2p call about to run: the group's own p2p count, or under nccl2 the Seq of
        the group's last collective (vocab.NCCL2_P2P_NAMES), which it carries unchanged."""
        if self.record_format == NCCL2_FORMAT and self.nccl is not None:
            return int(self.nccl._get_sequence_number_for_group())
        with self.lock:
            self.p2p_seq += 1
            return self.p2p_seq

    def next_pair_seq(self, src: int, dst: int) -> int:
        """1-based index of this message among all src->dst messages of the group."""
        with self.lock:
            value = self.pair_seq.get((src, dst), 0) + 1
            self.pair_seq[(src, dst)] = value
            return value

    def info(self) -> ProcessGroupInfo:
        return ProcessGroupInfo(
            uid=self.uid,
            name=self.name,
            desc=self.desc,
            ranks=self.ranks,
            backend=self.backend,
            lane_id=self.lane_id,
            lane_name=self.lane_name,
            backend_impls=self.backend_impls,
            record_format=self.record_format,
        )


#: ProcessGroup -> state: mutated in place (under ``_states_lock``), never rebound; read without
#: the lock by the collectives' idle path. Plain dict (not weak): a weak lookup costs a weakref
#: per call on the hot path, and groups are few and long-lived; commtag lets go of them when their
#: world is destroyed (:func:`_let_go`).
GROUP_STATES: dict[Any, GroupState] = {}
#: The states of groups whose world was destroyed, for the sidecar's table: they hold no c10d object.
_RETIRED: list[GroupState] = []
_states_lock = threading.Lock()
#: c10d's world; its ``_default_pg`` backs the ``default_pg`` property (a Python frame per call).
_world = c10d._world
#: Default groups seen initialised (the lives of the world); kept under ``_states_lock``.
_lives = 0
#: The default group of the current life (a strong reference: its id can never be reused).
_life_pg: Any = None
#: The counting wrapper over c10d's ``_update_default_pg`` while :func:`watch_lives` has it in place.
_watcher: Optional[Callable[[Any], None]] = None


def _note_default(pg: Any) -> None:
    """Count ``pg`` as a new life when it is a default group not counted yet (hold ``_states_lock``);
    None (the world destroyed, every group with it): let go of its groups."""
    global _lives, _life_pg
    if isinstance(pg, c10d.ProcessGroup) and pg is not _life_pg:
        _lives += 1
        _life_pg = pg
    elif pg is None:
        _let_go()


def _let_go() -> None:
    """Drop every c10d group and backend commtag holds (hold ``_states_lock``, or at exit). A group
    kept past its ``destroy_process_group`` was freed at the interpreter's teardown, where a gloo
    backend's threads can abort the process ("terminate called without an active exception", exit
    134, about one exit in six on torch 2.13 and 2.15); freed now, or by this at exit (before the
    teardown), it ends as a group a job lets go of."""
    global _life_pg
    _life_pg = None
    for state in GROUP_STATES.values():
        state.nccl = state.gloo = state.gloo_seq = None
    _RETIRED.extend(GROUP_STATES.values())
    GROUP_STATES.clear()


atexit.register(_let_go)


def watch_lives() -> None:
    """Count every later init of the default group (idempotent; :func:`commtag.install` calls it).

    c10d sets the default group through ``_update_default_pg`` on every init,
    destroy and shrink; the wrapper runs it first and then only counts, so it
    cannot change what c10d does.
    """
    global _watcher
    with _states_lock:
        _note_default(_world._default_pg)
        original = getattr(c10d, "_update_default_pg", None)
        if original is None or original is _watcher:
            return

        def counting_update_default_pg(pg: Any) -> None:
            original(pg)
            with _states_lock:
                _note_default(pg)

        counting_update_default_pg.__wrapped__ = original  # type: ignore[attr-defined]
        _watcher = c10d._update_default_pg = counting_update_default_pg


def unwatch_lives() -> None:
    """Put c10d's own ``_update_default_pg`` back unless someone wrapped it since (idempotent)."""
    global _watcher
    with _states_lock:
        if _watcher is not None and c10d._update_default_pg is _watcher:
            c10d._update_default_pg = _watcher.__wrapped__  # type: ignore[attr-defined]
        _watcher = None


def lookup(group: Optional[Any]) -> Optional[GroupState]:
    """The cached state of ``group`` (None = the default group); None when this rank is not a member."""
    pg = _world._default_pg if group is None else group
    state = GROUP_STATES.get(pg)
    if state is None:
        if not isinstance(pg, c10d.ProcessGroup):
            return None  # GroupMember.NON_GROUP_MEMBER, or no default group yet
        with _states_lock:
            state = GROUP_STATES.get(pg)
            if state is None:
                state = GROUP_STATES[pg] = build_state(pg)
    return state


def state_for(group: Optional[Any]) -> GroupState:
    """Like :func:`lookup`, for callers that know this rank is a member."""
    state = lookup(group)
    if state is None:
        raise ValueError(f"this rank is not a member of process group {group!r}")
    return state


def known_groups() -> list[GroupState]:
    """Every group this process has seen a collective on, in first-use order."""
    with _states_lock:
        return _RETIRED + list(GROUP_STATES.values())


def table() -> list[ProcessGroupInfo]:
    """The process-group table: all groups this rank is a member of, older lives of the world first."""
    seen: dict[str, GroupState] = {}
    if dist.is_initialized():
        for pg in list(c10d._world.pg_map):
            state = lookup(pg)
            if state is not None:
                seen.setdefault(state.uid, state)
    for state in known_groups():
        seen.setdefault(state.uid, state)
    return [state.info() for state in sorted(seen.values(), key=lambda state: state.generation)]


def build_state(pg: Any) -> GroupState:
    """The state of a group seen for the first time (tests inject failures here)."""
    ranks = list(dist.get_process_group_ranks(pg))
    name = str(pg.group_name)
    desc = str(getattr(pg, "group_desc", "undefined"))
    is_default = pg is c10d._world.default_pg
    start, stride = _start_and_stride(ranks, is_default)
    # The profiler lists a group's ranks only where its global rank stride is positive: "[]" for
    # ranks that are no arithmetic progression, and for a one-rank subgroup, whose stride is 0
    # (seen on an H100 with torch 2.11: tests/fixtures/gpu_graphs).
    listed = is_default or stride is not None
    _note_default(_world._default_pg)  # a life begun while commtag was not watching
    generation = max(_lives - 1, 0)
    uid = group_uid(name, ranks, generation)
    backend = str(dist.get_backend(pg))
    impls = backend_impls(pg)
    return GroupState(
        uid=uid,
        name=name,
        desc=desc,
        ranks=ranks,
        ranks_text=format_list(ranks) if listed else "[]",
        size=len(ranks),
        group_rank=pg.rank(),
        global_rank_start=start,
        global_rank_stride=stride,
        backend=backend,
        lane_id=lane_id(uid),
        lane_name=lane_name(name, desc, ranks, generation),
        generation=generation,
        nccl=_nccl_backend(pg, impls),
        gloo=_counting_backend(pg, torch.device("cpu")) if backend == "gloo" else None,
        backend_impls=impls,
        record_format=record_format(impls),
    )


def backend_impls(pg: Any) -> dict[str, str]:
    """Device type -> the name the group's backend for it gives itself ("nccl", "nccl2", "gloo").

    The group's backend string cannot tell nccl2 from legacy NCCL: both are
    "nccl" (docs/nccl2.md §1); the backend object can.
    """
    impls: dict[str, str] = {}
    for device in getattr(pg, "_device_types", ()):
        try:
            impls[device.type] = str(pg._get_backend(device).name())
        except (RuntimeError, AttributeError):
            continue
    return impls


def record_format(impls: dict[str, str]) -> str:
    """A group's annotation format: nccl2's where its NCCL backend is nccl2, for all its calls
    (gloo writes no records of its own, so one format per group is what its NCCL calls show)."""
    formats = {RECORD_FORMATS.get(impl, LEGACY_FORMAT) for impl in impls.values()}
    return NCCL2_FORMAT if NCCL2_FORMAT in formats else LEGACY_FORMAT


def _nccl_backend(pg: Any, impls: dict[str, str]) -> Any:
    """The NCCL backend object (legacy or nccl2) whose counter gives the eager Seq, if the group
    is NCCL-only.

    A mixed group ("cpu:gloo,cuda:nccl") sends CPU tensors to gloo, which
    would not advance NCCL's counter: commtag counts those itself.
    """
    if set(impls.values()) - {BACKEND_NCCL, BACKEND_NCCL2, BACKEND_NCCL_LAZY} or not impls \
            or not torch.cuda.is_available():
        return None
    return _counting_backend(pg, torch.device("cuda"))


def _counting_backend(pg: Any, device: torch.device) -> Any:
    """The group's backend for ``device`` if it tells its per-group call count, else None."""
    try:
        found = pg._get_backend(device)
        int(getattr(found, BACKEND_SEQ)())
        return found
    except (RuntimeError, AttributeError, TypeError, ValueError):
        return None

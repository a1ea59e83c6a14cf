"""The contract between the runtime wing and the merge wing.

One collective call becomes a :class:`CollectiveAnnotation` whose serialized
form uses exactly the keys the PyTorch profiler writes for an eager NCCL
collective (``"Collective name"``, ``"In msg nelems"``, ...), plus commtag's
own keys, all spelled ``"commtag ..."`` so they never collide with Kineto's.
A rank's sidecar (:class:`Sidecar`) holds every annotation recorded while the
profiler ran, the process-group table and the CUDA-graph captures.

Everything here is plain data: JSON in, JSON out, validated on both sides.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from commtag.constants import (  # re-exported: the contract's names stay importable from here
    MAX_NELEMS, MAX_UNWATCHED_SPANS, MIN_LANE_ID, RANK_LIST, SCHEMA_VERSION, SIDECAR_KIND, TIME_NS_LIMIT, SidecarKind,
    newer_version, parse_rank_list,
)
from commtag.vocab import (
    ANN_ASYNC, ANN_CAPTURE_ID, ANN_ERROR, ANN_LANE, ANN_LANE_ID, ANN_P2P, ANN_P2P_PAIR_SEQ, ANN_PG_UID, ANN_RECV_PEERS,
    ANN_REPLAY, ANN_SEND_PEERS, ANN_SPLITS, ANN_THREAD, SPLITS_NOT_RECORDED, COLLECTIVE_NAME_KEY, LEGACY_FORMAT,
    NCCL2_FORMAT, DST_RANK_KEY, DTYPE_KEY, EAGER_KEYS, GROUP_SIZE_KEY, IN_NELEMS_KEY,
    IN_SPLIT_KEY, OUT_NELEMS_KEY, OUT_SPLIT_KEY, PG_DESC_KEY, PG_NAME_KEY, PG_RANKS_KEY, RANK_KEY, RANK_START_KEY,
    RANK_STRIDE_KEY, SCALAR_TYPE_NAMES, SEQ_KEY, SEQ_LIMIT, SRC_RANK_KEY,
)

@lru_cache(maxsize=256)
def _is_list_string(value: str) -> bool:
    """Cached: every record of a group repeats its rank list (580 characters for 128 ranks),
    and matching it was a fifth of validating a sidecar."""
    return RANK_LIST.match(value) is not None


@lru_cache(maxsize=256)
def _rank_list(value: str) -> Optional[tuple[int, frozenset[int]]]:
    """How many ranks a list string names, and which; None when truncated or empty. Cached
    like :func:`_is_list_string`: every record of a group parsed its ranks again."""
    ranks = parse_rank_list(value)
    return None if ranks is None else (len(ranks), frozenset(ranks))


def _cut(text: str) -> bool:
    """Is a list string cut short ("[0, 1, ..., 9]")?"""
    return "..." in text


def _count(text: str) -> int:
    """How many items a whole list string lists."""
    return 0 if text == "[]" else text.count(",") + 1


class CollectiveAnnotation(BaseModel):
    """One collective call, as the eager NCCL profiler would describe it."""

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="forbid")

    collective_name: str = Field(alias=COLLECTIVE_NAME_KEY, min_length=1)
    in_msg_nelems: int = Field(alias=IN_NELEMS_KEY, ge=0, le=MAX_NELEMS)
    out_msg_nelems: int = Field(alias=OUT_NELEMS_KEY, ge=0, le=MAX_NELEMS)
    group_size: int = Field(alias=GROUP_SIZE_KEY, ge=1)
    dtype: str = Field(alias=DTYPE_KEY)
    in_split_size: str = Field(alias=IN_SPLIT_KEY, default="[]")
    out_split_size: str = Field(alias=OUT_SPLIT_KEY, default="[]")
    global_rank_start: Optional[int] = Field(alias=RANK_START_KEY, default=None, ge=0)
    global_rank_stride: Optional[int] = Field(alias=RANK_STRIDE_KEY, default=None, gt=0)
    pg_name: str = Field(alias=PG_NAME_KEY)
    #: None where the backend writes no description (nccl2: vocab.NCCL2_OMITTED_KEYS).
    pg_desc: Optional[str] = Field(alias=PG_DESC_KEY, default=None)
    pg_ranks: str = Field(alias=PG_RANKS_KEY)
    rank: int = Field(alias=RANK_KEY, ge=0)
    dst_rank: Optional[int] = Field(alias=DST_RANK_KEY, default=None, ge=0)
    src_rank: Optional[int] = Field(alias=SRC_RANK_KEY, default=None, ge=0)
    seq: int = Field(alias=SEQ_KEY, ge=0, le=SEQ_LIMIT)

    # commtag's own keys.
    lane_id: int = Field(alias=ANN_LANE_ID, ge=MIN_LANE_ID)
    lane_name: str = Field(alias=ANN_LANE, min_length=1)
    pg_uid: str = Field(alias=ANN_PG_UID, min_length=1)
    is_p2p: bool = Field(alias=ANN_P2P, default=False)
    #: p2p only: 1-based index of this message among all messages from the same
    #: source to the same destination in this group. "Seq" (NCCL's p2p counter)
    #: counts every peer together, so only (pg uid, src, dst, this) pairs a
    #: send with its recv across ranks.
    p2p_pair_seq: Optional[int] = Field(alias=ANN_P2P_PAIR_SEQ, default=None, ge=1, le=SEQ_LIMIT)
    async_op: bool = Field(alias=ANN_ASYNC, default=False)
    thread: int = Field(alias=ANN_THREAD, default=0)
    #: Set for a collective recorded during CUDA-graph capture.
    capture_id: Optional[int] = Field(alias=ANN_CAPTURE_ID, default=None, ge=0)
    #: Set on a replayed instance: the replay index of its graph, 0-based.
    replay: Optional[int] = Field(alias=ANN_REPLAY, default=None, ge=0, le=SEQ_LIMIT)
    #: Set when the call failed (raised, or its work completed with an error, e.g. a timeout):
    #: the exception's type and first line. The call is still recorded: its time was spent.
    error: Optional[str] = Field(alias=ANN_ERROR, default=None, min_length=1)
    #: An nccl2 batch_op_issue's peers per send / per receive (global ranks, as a list string).
    send_peers: Optional[str] = Field(alias=ANN_SEND_PEERS, default=None)
    recv_peers: Optional[str] = Field(alias=ANN_RECV_PEERS, default=None)
    #: vocab.SPLITS_NOT_RECORDED on an all-to-all whose split sizes were not seen.
    splits: Optional[Literal["not recorded"]] = Field(alias=ANN_SPLITS, default=None)

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, value: str) -> str:
        if value not in SCALAR_TYPE_NAMES:
            raise ValueError(f"unknown c10 ScalarType name {value!r} (expected e.g. 'Float', 'BFloat16')")
        return value

    @field_validator("in_split_size", "out_split_size", "pg_ranks", "send_peers", "recv_peers")
    @classmethod
    def _list_string(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _is_list_string(value):
            raise ValueError(f"expected a list string like '[0, 1]', got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "CollectiveAnnotation":
        listed = _rank_list(self.pg_ranks)
        if listed is not None and listed[0] != self.group_size:
            raise ValueError(
                f"Group size: {self.group_size} but Process Group Ranks lists {listed[0]} ranks"
            )
        if self.rank >= self.group_size:
            raise ValueError(f"Rank: {self.rank} is outside a group of size {self.group_size}")
        for key, peer in ((DST_RANK_KEY, self.dst_rank), (SRC_RANK_KEY, self.src_rank)):
            if peer is not None and listed is not None and peer not in listed[1]:
                raise ValueError(f"{key}: global rank {peer} is not in the group {parse_rank_list(self.pg_ranks)}")
        for key, peers, sizes in ((ANN_SEND_PEERS, self.send_peers, self.in_split_size),
                                  (ANN_RECV_PEERS, self.recv_peers, self.out_split_size)):
            # A batch's peers name the peer of each of its sends (receives), whose sizes the split lists.
            if peers is not None and not _cut(peers) and not _cut(sizes) and _count(peers) != _count(sizes):
                raise ValueError(f"{key}: {peers} names {_count(peers)} peers, but its split size {sizes} "
                                 f"lists {_count(sizes)} messages")
        return self

    def eager_dict(self) -> dict[str, object]:
        """The serialized form: eager keys first, None values left out."""
        return self.model_dump(by_alias=True, exclude_none=True)


# The Literal values above are the vocabulary's (checked at import).
if (LEGACY_FORMAT, NCCL2_FORMAT, SPLITS_NOT_RECORDED) != ("legacy", "nccl2", "not recorded"):
    raise ImportError("commtag.schema: the record formats or SPLITS_NOT_RECORDED differ from commtag.vocab's")

# The eager fields are exactly the profiler's keys, in its order (commtag.vocab writes them once);
# checked at import (not an assert, which -O strips).
if tuple(f.alias for f in CollectiveAnnotation.model_fields.values()
         if f.alias and not f.alias.startswith("commtag ")) != EAGER_KEYS:
    raise ImportError("commtag.schema: CollectiveAnnotation's eager aliases differ from commtag.vocab.EAGER_KEYS")


class ProcessGroupInfo(BaseModel):
    """One row of a rank's process-group table."""

    model_config = ConfigDict(extra="forbid")

    uid: str = Field(min_length=1)
    name: str
    desc: str
    ranks: list[int] = Field(min_length=1)
    backend: str = ""
    lane_id: int = Field(ge=MIN_LANE_ID)
    lane_name: str = Field(min_length=1)
    #: The implementation behind each device type of the group, as the backend object names
    #: itself (``{"cuda": "nccl2", "cpu": "gloo"}``): ``backend`` says ``"nccl"`` for legacy and
    #: nccl2 alike, as the trace's distributedInfo does. Empty in sidecars that predate it.
    backend_impls: dict[str, str] = {}
    #: The format of the group's annotations (vocab.LEGACY_FORMAT or vocab.NCCL2_FORMAT): what the
    #: group's NCCL backend writes eagerly, for all its calls. Sidecars that predate it: legacy.
    record_format: Literal["legacy", "nccl2"] = LEGACY_FORMAT

    @field_validator("ranks")
    @classmethod
    def _distinct(cls, ranks: list[int]) -> list[int]:
        if len(set(ranks)) != len(ranks) or min(ranks) < 0:
            raise ValueError(f"ranks must be distinct non-negative global ranks, got {ranks}")
        return ranks


class RecordedCollective(BaseModel):
    """An annotation and when it ran on this rank (CLOCK_REALTIME ns)."""

    model_config = ConfigDict(extra="forbid")

    annotation: CollectiveAnnotation
    start_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)
    end_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)
    tid: int
    thread_name: str = ""
    #: An async call whose work has a completion future: the thread its completion was seen
    #: on, at ``end_ns``. A thread other than ``tid`` ran the work (a gloo worker), and
    #: ``end_ns`` falls inside that work's event on it: the merge's identity for the event.
    done_tid: Optional[int] = None
    #: True: the call had not finished when its window's trace was handed over (an async work
    #: still pending, another thread's call still running); ``end_ns`` is that moment.
    unfinished: Optional[bool] = None

    @model_validator(mode="after")
    def _ordered(self) -> "RecordedCollective":
        if self.end_ns < self.start_ns:
            raise ValueError(f"end_ns {self.end_ns} is before start_ns {self.start_ns}")
        return self


class GraphNodeRecord(BaseModel):
    """A node a collective added to a graph under capture."""

    model_config = ConfigDict(extra="forbid")

    #: Creation index within the captured graph (0-based, capture order).
    index: int = Field(ge=0)
    node_type: str
    kernel_name: str = ""
    #: cudaGraphNodeGetToolsId when the driver has it (13.1+).
    tools_id: Optional[int] = Field(default=None, ge=0)
    #: cudaGraphNodeGetLocalId when the driver has it (13.1+).
    local_id: Optional[int] = Field(default=None, ge=0)


class CapturedCollective(BaseModel):
    """One collective issued while a graph was captured, and the nodes it made."""

    model_config = ConfigDict(extra="forbid")

    annotation: CollectiveAnnotation
    nodes: list[GraphNodeRecord]
    tid: int = 0
    #: Reduction op in lower case ("sum", "avg", ...) when known: confirms NCCL kernel names at replay.
    reduce_op: Optional[str] = None
    #: How it was caught: "python" (a patched torch.distributed function) or "c10d-op" (operator level).
    source: Literal["python", "c10d-op"] = "python"
    #: The mark commtag handed torch's ``mark_kernels`` for it (vocab.TORCH_MARK_KEY), where
    #: torch's graph annotations recorded this capture (torch 2.14+, driver 13.1+).
    torch_mark: Optional[str] = None
    #: torch's tools ids of its nodes under that mark, read from torch's registry when the
    #: sidecar was written (exec-graph keyed: what the trace's "graph node id" says).
    torch_tools_ids: Optional[list[int]] = None


class GraphReplay(BaseModel):
    """One replay of a captured graph on this rank, as CUDAGraph.replay() ran it."""

    model_config = ConfigDict(extra="forbid")

    #: Replays of this capture before this one (0 = first replay after capture).
    index: int = Field(ge=0)
    start_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)
    end_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)
    #: OS thread id (what Kineto writes as a CPU event's tid).
    tid: int = 0


class GraphCapture(BaseModel):
    """One CUDA-graph capture on this rank."""

    model_config = ConfigDict(extra="forbid")

    capture_id: int = Field(ge=0)
    #: cudaGraphGetId of the capture graph, when known.
    graph_id: Optional[int] = Field(default=None, ge=0)
    #: cudaGraphExecGetId of the instantiated graph, when known.
    exec_graph_id: Optional[int] = Field(default=None, ge=0)
    start_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)
    end_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)
    total_nodes: int = Field(ge=0)
    collectives: list[CapturedCollective]
    #: Replays logged while the sidecar's window was profiled.
    replays: list[GraphReplay] = []


class SidecarHead(BaseModel):
    """Which run, rank and trace a sidecar belongs to: what the merge reads of every sidecar
    before converting any rank (its other fields are only parsed past, not validated)."""

    model_config = ConfigDict(extra="ignore")

    kind: SidecarKind = SIDECAR_KIND
    #: Strict: a version written as text ("2") is no version this reader knows, nor is one below 1.
    schema_version: int = Field(SCHEMA_VERSION, ge=1, strict=True)
    run_id: str = Field(min_length=1)
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    #: Basename of the trace file this sidecar annotates.
    trace_file: str

    @field_validator("schema_version")
    @classmethod
    def _supported(cls, version: int) -> int:
        problem = newer_version(version)
        if problem:
            raise ValueError(problem)
        return version

    @field_validator("trace_file")
    @classmethod
    def _basename(cls, name: str) -> str:
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise ValueError(f"trace_file must be a bare file name, got {name!r}")
        return name

    @model_validator(mode="after")
    def _rank_in_world(self) -> "SidecarHead":
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        return self


class UnwatchedSpan(BaseModel):
    """A span of a rank's window in which commtag was not installed (see ``Sidecar.unwatched``)."""

    model_config = ConfigDict(extra="forbid")

    start_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)
    end_ns: int = Field(ge=0, lt=TIME_NS_LIMIT)

    @model_validator(mode="after")
    def _ordered(self) -> "UnwatchedSpan":
        if self.end_ns < self.start_ns:
            raise ValueError(f"end_ns {self.end_ns} is before start_ns {self.start_ns}")
        return self


class Sidecar(SidecarHead):
    """Everything commtag knows about one rank's trace."""

    model_config = ConfigDict(extra="forbid")

    host: str
    pid: int
    torch_version: str
    nccl_version: Optional[str] = None
    #: Clock of every *_ns field: time.time_ns(), as Kineto's baseTimeNanoseconds.
    clock: Literal["CLOCK_REALTIME_NS"] = "CLOCK_REALTIME_NS"
    process_groups: list[ProcessGroupInfo]
    collectives: list[RecordedCollective]
    captures: list[GraphCapture] = []
    #: ``[start_ns, end_ns]`` spans of the trace's window in which commtag was not installed on this
    #: rank (uninstalled, or not installed yet), in time order: its calls then were not recorded,
    #: so the merge counts those spans as outside the window, never as calls the rank skipped.
    unwatched: list[UnwatchedSpan] = Field(default=[], max_length=MAX_UNWATCHED_SPANS)

    @model_validator(mode="after")
    def _consistent(self) -> "Sidecar":
        # Each group's members as a set, once: a list searched for every record took O(world size) each.
        groups = {pg.uid: (pg, frozenset(pg.ranks)) for pg in self.process_groups}
        for recorded in self.collectives:
            _check_against_table(recorded.annotation, groups, self.rank)
        for capture in self.captures:
            for captured in capture.collectives:
                _check_against_table(captured.annotation, groups, self.rank)
        for pg in self.process_groups:
            if max(pg.ranks) >= self.world_size:
                raise ValueError(f"process group {pg.uid}: rank {max(pg.ranks)} is outside world_size {self.world_size}")
        return self


def _check_against_table(ann: CollectiveAnnotation, groups: dict[str, tuple[ProcessGroupInfo, frozenset[int]]],
                         rank: int) -> None:
    pg, members = groups.get(ann.pg_uid, (None, frozenset()))
    if pg is None:
        raise ValueError(f"commtag pg uid: {ann.pg_uid!r} is not in the process-group table")
    if len(pg.ranks) != ann.group_size:
        raise ValueError(
            f"Group size: {ann.group_size} but group {pg.uid} has {len(pg.ranks)} ranks"
        )
    if rank not in members:
        raise ValueError(f"Rank: this rank ({rank}) is not a member of group {pg.uid}")
    listed = _rank_list(ann.pg_ranks)
    if listed is not None and listed[1] != members:
        raise ValueError(f"Process Group Ranks: {ann.pg_ranks} are not the members {pg.ranks} of group {pg.uid}")
    for key, peer in ((DST_RANK_KEY, ann.dst_rank), (SRC_RANK_KEY, ann.src_rank)):
        if peer is not None and peer not in members:
            raise ValueError(f"{key}: global rank {peer} is not in group {pg.uid} {pg.ranks}")

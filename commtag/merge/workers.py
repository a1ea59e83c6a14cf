"""How merge workers started by torchrun find each other and exchange their records.

:func:`exchange` gives every worker every rank's :class:`RankSummary` and
:func:`all_done` runs one step on all of them, an error on any stopping all;
both travel as JSON bytes, never pickle (:func:`to_wire`, :func:`from_wire`).
:func:`settle` is the last exchange: every worker learns every worker's error.
:func:`launcher_world` tells which transport this launch needs:

* :class:`FileWorld` (all workers on one host, the usual case): files in a
  hidden directory beside the output. Why not a gloo group: importing torch
  and forming the group cost each worker ~2 s and ~300 MB, more than its
  share of most merges. The workers already share that directory (worker 0
  appends the others' shards from it).
* :class:`TorchWorld` (workers on several hosts): a gloo group.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import asdict, astuple, fields
from pathlib import Path
from typing import Callable, Optional, Protocol, TypeVar

import orjson

from commtag.atomic import temporary, write_atomic
from commtag.merge.convert import EventAccount
from commtag.merge.errors import MergeFailed, MergeInputError
from commtag.merge.records import CollectiveInstance, GroupLane, Interner, RankSummary
from commtag.merge.runs import FileSpan

#: How long a worker waits for the others' records (they may still be merging their ranks).
EXCHANGE_TIMEOUT_S = float(os.environ.get("COMMTAG_MERGE_EXCHANGE_TIMEOUT_S", "7200"))
_POLL_S = 0.01
#: How long closing waits for the other workers to finish reading.
_CLOSE_TIMEOUT_S = 60.0


class World(Protocol):
    """The merge job's workers (one, or torchrun's)."""

    index: int
    size: int

    def all_gather_bytes(self, data: bytes) -> list[bytes]: ...

    def close(self) -> None: ...


class SoloWorld:
    index = 0
    size = 1

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        return [data]

    def close(self) -> None:
        pass


class FileWorld:
    """Workers of one torchrun launch on one host, exchanging through ``directory``.

    Round ``k`` of :meth:`all_gather_bytes` is a file per worker, written
    under a temporary name and renamed, so a reader never sees half of one.
    The directory is named after the launch (hostname and the torchrun
    agent's pid, which is every local worker's parent), so concurrent merges
    into one directory do not meet. Worker 0 removes it once every worker
    has said it is done reading.
    """

    def __init__(self, index: int, size: int, directory: Path, launch: str) -> None:
        self.index = index
        self.size = size
        # Named as a temporary of the torchrun agent (every local worker's parent): a merge after a
        # killed launch removes it (commtag.merge.output.remove_stale).
        self._dir = temporary(directory / f"commtag-merge-{launch}", pid=os.getppid())
        self._round = 0

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        self._round += 1
        self._publish(f"r{self._round}", data)
        paths = self._wait(f"r{self._round}")
        return [p.read_bytes() for p in paths]

    def close(self) -> None:
        """Say this worker is done; worker 0 waits for everyone's word, then removes the exchange;
        the others wait for that, so worker 0 is never stopped halfway by torchrun (which stops
        every worker once one has exited with an error)."""
        try:
            self._publish("done", b"")
            if self.index == 0:
                self._wait("done", timeout_s=_CLOSE_TIMEOUT_S)
                shutil.rmtree(self._dir, ignore_errors=True)
            else:
                deadline = time.monotonic() + _CLOSE_TIMEOUT_S
                while self._dir.exists() and time.monotonic() < deadline:
                    time.sleep(_POLL_S)
        except (OSError, MergeInputError):
            pass  # leaving the hidden directory behind must not fail a merge that succeeded

    def _publish(self, what: str, data: bytes) -> None:
        self._dir.mkdir(exist_ok=True)
        write_atomic(self._dir / f"{what}.w{self.index}", data)

    def _wait(self, what: str, timeout_s: float = EXCHANGE_TIMEOUT_S) -> list[Path]:
        paths = [self._dir / f"{what}.w{w}" for w in range(self.size)]
        deadline = time.monotonic() + timeout_s
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline:
                missing = [w for w, p in enumerate(paths) if not p.exists()]
                raise MergeInputError(self._dir, f"merge workers {missing} sent nothing for {timeout_s:.0f} s")
            time.sleep(_POLL_S)
        return paths


class TorchWorld:
    """torchrun's workers over a gloo group (workers on several hosts)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self._dist = dist
        self.index = dist.get_rank()
        self.size = dist.get_world_size()

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        import torch

        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self._dist.all_gather(sizes, size)
        longest = max(int(s.item()) for s in sizes)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else mine[:0]
        chunks = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.size)]
        self._dist.all_gather(chunks, mine)
        return [bytes(c[: int(s.item())].numpy()) for c, s in zip(chunks, sizes)]

    def close(self) -> None:
        self._dist.destroy_process_group()


def settle(world: World, error: Optional[MergeInputError]) -> list[MergeInputError]:
    """Every worker's error, each distinct one once, in worker order (empty: all succeeded).

    The last exchange of a merge under torchrun: a worker may fail where the
    others did not (a rename of its own files), and each must exit with the
    same status while one of them (worker 0) reports. Sent as the merge's
    exchanges send an error, so a worker still in one of those stops too.
    """
    mine = {"error": [str(error.path), error.problem]} if error is not None else {}
    try:
        parts = [orjson.loads(blob) for blob in world.all_gather_bytes(orjson.dumps(mine))]
    except MergeInputError as exc:  # a worker that never answered
        parts = [mine, {"error": [str(exc.path), exc.problem]}]
    found = dict.fromkeys(tuple(part["error"]) for part in parts if isinstance(part, dict) and "error" in part)
    return [MergeInputError(path, problem) for path, problem in found]


def launcher_world(output: Path) -> Optional[World]:
    """The workers of this launch when torchrun started several; None for a plain process."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return None
    if int(os.environ.get("LOCAL_WORLD_SIZE", "0")) == size:
        launch = hashlib.sha1(f"{socket.gethostname()}:{os.getppid()}:{os.environ.get('TORCHELASTIC_RUN_ID', '')}:"
                              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}".encode()).hexdigest()[:16]
        return FileWorld(int(os.environ["RANK"]), size, output.parent, launch)
    return TorchWorld()


_Result = TypeVar("_Result")


def launched(output: Path, work: Callable[[Optional[World]], _Result]) -> _Result:
    """Run ``work`` on this launch's workers (:func:`launcher_world`; None for a plain
    process) from their start to their close.

    Raises :class:`MergeFailed` with every worker's errors on every worker
    (each then exits with the same status; ``lead`` says which one reports).
    """
    world = launcher_world(output)
    error: Optional[MergeInputError] = None
    try:
        result = work(world)
    except MergeInputError as exc:
        error = exc
    if world is None:
        if error is not None:
            raise MergeFailed([error]) from error
        return result
    errors = settle(world, error)
    if errors and threading.current_thread() is threading.main_thread():
        # Once it failed, a worker only tidies up: torchrun stopping it (when another worker has
        # exited first) would leave the exchange folder behind and turn its exit 2 into a signal.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    world.close()
    if errors:
        raise MergeFailed(errors, lead=world.index == 0) from error
    return result


def exchange(world: World, produce: Callable[[], list[RankSummary]], interner: Interner,
             skipped: Optional[list[MergeInputError]] = None) -> list[RankSummary]:
    """Every worker's summaries (``produce`` makes this worker's), in rank order; an input
    error anywhere stops all workers.

    ``skipped`` (--skip-bad-ranks) becomes every worker's skipped files. A
    worker keeps its own summaries as they are and decodes only the others'.
    """
    if world.size == 1:
        # Nothing to exchange: a JSON round trip of every instance would cost more than the merge.
        return sorted(produce(), key=lambda s: s.rank)
    mine: list[RankSummary] = []

    def step() -> dict:
        nonlocal mine
        mine = produce()
        return {**to_wire(mine), "skipped": [[str(e.path), e.problem] for e in skipped or ()]}

    parts = all_done(world, step)
    if skipped is not None:
        every = [[[str(e.path), e.problem] for e in skipped] if part is None else part["skipped"] for part in parts]
        union = dict.fromkeys((path, problem) for listed in every for path, problem in listed)
        skipped[:] = [MergeInputError(path, problem) for path, problem in union]
    return sorted((s for part in parts for s in (mine if part is None else from_wire(part, interner))),
                  key=lambda s: s.rank)


def all_done(world: World, step: Callable[[], Optional[dict]]) -> list[Optional[dict]]:
    """Run ``step`` on every worker and gather what each returned (None in this worker's own
    place); an input or output error on any worker stops all of them, each naming the first."""
    if world.size == 1:
        step()
        return [None]
    error: Optional[MergeInputError] = None
    try:
        payload = orjson.dumps(step() or {})
    except MergeInputError as exc:
        error = exc
        payload = orjson.dumps({"error": [str(exc.path), exc.problem]})
    parts = [None if i == world.index else orjson.loads(blob) for i, blob in enumerate(world.all_gather_bytes(payload))]
    for part in parts:
        if part is None and error is not None:
            raise error
        if part is not None and "error" in part:
            raise MergeInputError(*part["error"])
    return parts


_FIELDS = [f.name for f in fields(CollectiveInstance)]
_COMMON_AT = _FIELDS.index("common_args")
_RANKS_AT = _FIELDS.index("group_ranks")
#: Fields sent as an index into a table of texts: a lane name holds the group's ranks.
_TEXTS_AT = [_FIELDS.index(name) for name in ("pg_uid", "collective", "dtype", "source", "lane_name")]


def to_wire(summaries: list[RankSummary]) -> dict:
    """Summaries as JSON data: each instance a list of its fields, its ``common_args``, texts
    and member ranks indexes into tables, so that what many instances share travels once."""
    index: dict[int, int] = {}
    table: list[dict] = []
    texts: dict[str, int] = {}
    rank_lists: dict[tuple, int] = {}
    out = []
    for s in summaries:
        rows = []
        for inst in s.instances:
            row = [getattr(inst, name) for name in _FIELDS]
            ref = index.get(id(inst.common_args))
            if ref is None:
                ref = index[id(inst.common_args)] = len(table)
                table.append(inst.common_args)
            row[_COMMON_AT] = ref
            for at in _TEXTS_AT:
                row[at] = texts.setdefault(row[at], len(texts))
            row[_RANKS_AT] = rank_lists.setdefault(row[_RANKS_AT], len(rank_lists))
            rows.append(row)
        out.append({"rank": s.rank, "host": s.host, "first_ns": s.first_ns, "groups": [list(g) for g in s.groups],
                    "lane_kernels": s.lane_kernels, "windows": s.windows, "world_size": s.world_size,
                    "files": [astuple(f) for f in s.files], "instances": rows,
                    "account": None if s.account is None else asdict(s.account)})
    return {"common": table, "texts": list(texts), "ranks": list(rank_lists), "summaries": out}


def from_wire(data: dict, interner: Interner) -> list[RankSummary]:
    """The summaries :func:`to_wire` sent, their shared args and rank lists interned again (by the merge's ``interner``)."""
    table = [interner.common(args) for args in data["common"]]
    texts = data["texts"]
    rank_lists = [interner.shared(tuple(ranks)) for ranks in data["ranks"]]
    summaries = []
    for s in data["summaries"]:
        instances = []
        for row in s.pop("instances"):
            row[_COMMON_AT] = table[row[_COMMON_AT]]
            row[_RANKS_AT] = rank_lists[row[_RANKS_AT]]
            for at in _TEXTS_AT:
                row[at] = texts[row[at]]
            instances.append(CollectiveInstance(*row))
        s["groups"] = [GroupLane(*g) for g in s["groups"]]
        s["windows"] = [tuple(w) for w in s["windows"]]
        s["account"] = None if s["account"] is None else EventAccount(**s["account"])
        s["files"] = [FileSpan(*f) for f in s["files"]]
        summaries.append(RankSummary(**s, instances=instances))
    return summaries

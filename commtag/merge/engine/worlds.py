"""The transports merge workers meet over, and the last word between them.

A :class:`World` moves bytes between the workers of one merge; the
exchange protocol over it is :mod:`commtag.merge.engine.exchange`.
:func:`settle` is the last exchange: every worker learns every worker's error.
:func:`launcher_world` tells which transport this launch needs:

* :class:`SoloWorld`: one process, nothing to exchange (a merge alone: the world of one the same
  driver runs in).
* :class:`FileWorld` (all workers on one host, the usual case): files in a
  hidden directory beside the output. Why not a gloo group: importing torch
  and forming the group cost each worker ~2 s and ~300 MB, more than its
  share of most merges. The workers already share that directory (worker 0
  appends the others' shards from it).
* :class:`TorchWorld` (workers on several hosts, each with its own disk):
  a gloo group; each node discovers its own files (:mod:`commtag.merge.engine.hosts`)
  and worker 0 receives the others' parts of the trace over the group.

``commtag merge -j N`` uses a :class:`FileWorld` without torchrun
(:class:`commtag.merge.engine.jobs.LocalWorld`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterable, Optional, Protocol, Sequence

import orjson

from commtag.atomic import temporary, write_atomic
from commtag.merge.errors import MergeInputError

if TYPE_CHECKING:
    from commtag.merge.inputs.load import RankInput


#: How long a worker waits for the others' records (they may still be merging their ranks).
EXCHANGE_TIMEOUT_S = float(os.environ.get("COMMTAG_MERGE_EXCHANGE_TIMEOUT_S", "7200"))
#: A waiting worker looks for the others' files again after a tenth of what it has waited so far,
#: within these bounds: a round of the analysis, where both arrive within milliseconds, costs a
#: fraction of a millisecond, and a wait of seconds a stat every 10 ms.
_POLL_MIN_S, _POLL_MAX_S, _POLL_SHARE = 0.0005, 0.01, 0.1
#: How long closing waits for the other workers to finish reading.
CLOSE_TIMEOUT_S = 60.0
#: Room each worker of a :class:`FileWorld` holds in the exchange folder for saying why it stopped
#: (an error is a path and a sentence) when the disk is full.
RESERVE_BYTES = 64 << 10


def _poll_after(waited_s: float) -> float:
    """How long to sleep before looking again, having waited ``waited_s``."""
    return min(_POLL_MAX_S, max(_POLL_MIN_S, waited_s * _POLL_SHARE))


class NotSent(MergeInputError):
    """This worker's data of an exchange round could not be written (a full disk): the round is
    not spent, and the worker may send its error in that place (:func:`commtag.merge.engine.exchange.all_done`)."""


class World(Protocol):
    """The merge job's workers (one, or torchrun's)."""

    index: int
    size: int
    #: Whether each worker sees only its own host's files (:class:`TorchWorld`), not one shared folder.
    apart: bool
    #: The ranks worker 0 discovered, when it sent them (a ``-j`` worker): not discovered again.
    discovered: Optional[list[RankInput]]

    def start(self, ranks: Sequence[RankInput]) -> None:
        """Discovery found ``ranks``: a world that starts its own workers starts them now."""

    def all_gather_bytes(self, data: bytes) -> list[bytes]: ...

    def close(self) -> None: ...


class SoloWorld:
    """This process alone: a world of one, whose exchanges hand its own data back."""

    index: int = 0
    size: int = 1
    apart: bool = False
    discovered: Optional[list[RankInput]] = None

    def start(self, ranks: Sequence[RankInput]) -> None:
        pass

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

    A full disk (the output's folder, where the workers' parts fill it)
    must not leave the others waiting for a round a worker could not
    write: each holds a reserve there, allocated before any part is
    written, that takes the error it sends instead (:class:`NotSent`).
    """

    apart = False

    def __init__(self, index: int, size: int, folder: Path, output: Path,
                 watch: Callable[[], Optional[str]] = lambda: None,
                 discovered: Optional[list[RankInput]] = None) -> None:
        self.index = index
        self.size = size
        self.discovered = discovered
        self._dir = folder
        #: The merge's output, which a write the exchange (beside it) cannot make names.
        self._output = output
        #: Why waiting on is pointless (a worker is gone), else None; asked while waiting.
        self._watch = watch
        self._round = 0
        #: This worker's :data:`RESERVE_BYTES`, set aside by :meth:`start` (None: spent, or none).
        self._reserve: Optional[Path] = None
        #: What the reserve carried and the round file it became, for later rounds saying the same.
        self._spent: Optional[tuple[bytes, Path]] = None

    def start(self, ranks: Sequence[RankInput]) -> None:
        """Set aside this worker's reserve, then wait for everyone's: no part is written before all are.
        A worker of ``-j`` takes the one worker 0 set aside for it (:meth:`set_aside`)."""
        if self.discovered is not None:
            self._reserve = self._reserve_of(self.index) if self._reserve_of(self.index).exists() else None
            return
        self.set_aside([self.index])
        self.all_gather_bytes(b"")

    def _reserve_of(self, index: int) -> Path:
        return self._dir / f"reserve.w{index}"

    def set_aside(self, workers: Iterable[int]) -> None:
        """Before any part is written, allocate the reserve of each of ``workers`` in the exchange
        folder: on a full disk (the merge's own parts fill it) a worker must still tell the others why
        it stops, or every worker would wait for its round. Without room even now, they go without."""
        for index in workers:
            reserve = self._reserve_of(index)
            try:
                self._dir.mkdir(exist_ok=True)
                fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
                try:
                    os.posix_fallocate(fd, 0, RESERVE_BYTES)
                finally:
                    os.close(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    reserve.unlink(missing_ok=True)
                continue
            if index == self.index:
                self._reserve = reserve

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        """Every worker's ``data`` of this round; :class:`NotSent` when this worker's could not be
        written: the round is not spent, and the caller sends something shorter in its place."""
        what = f"r{self._round + 1}"
        self._publish(what, data)
        self._round += 1
        paths = self._wait(what)
        # Its own part is ``data``: read back, it was every worker's records once more in memory.
        return [data if w == self.index else p.read_bytes() for w, p in enumerate(paths)]

    def close(self) -> None:
        """Say this worker is done; worker 0 waits for everyone's word, then removes the exchange;
        the others wait for that, so worker 0 is never stopped halfway by torchrun (which stops
        every worker once one has exited with an error)."""
        try:
            self._publish("done", b"")
            if self.index == 0:
                self._wait("done", timeout_s=CLOSE_TIMEOUT_S)
                shutil.rmtree(self._dir, ignore_errors=True)
            else:
                deadline = time.monotonic() + CLOSE_TIMEOUT_S
                while self._dir.exists() and time.monotonic() < deadline and self._watch() is None:
                    time.sleep(_POLL_MAX_S)
        except (OSError, MergeInputError):
            pass  # leaving the hidden directory behind must not fail a merge that succeeded

    def _publish(self, what: str, data: bytes) -> None:
        target = self._dir / f"{what}.w{self.index}"
        try:
            self._dir.mkdir(exist_ok=True)
            write_atomic(target, data, durable=False)  # read by live workers only, removed at the end
        except OSError as exc:
            if not self._from_reserve(target, data):
                raise NotSent(self._output, f"cannot write the output: {exc.strerror or exc}") from None

    def _from_reserve(self, target: Path, data: bytes) -> bool:
        """Publish ``data`` as ``target`` without new space: written over the reserve's own blocks,
        which then takes the round's name; the same bytes again (the last word repeating the error
        that spent it) as a hard link to that file. Whether it could."""
        try:
            if self._reserve is not None and len(data) <= RESERVE_BYTES:
                with open(self._reserve, "r+b") as stream:
                    stream.write(data)
                    stream.truncate(len(data))
                os.replace(self._reserve, target)
                self._reserve, self._spent = None, (data, target)
                return True
            if self._spent is not None and self._spent[0] == data:
                os.link(self._spent[1], target)
                return True
        except OSError:
            pass
        return False

    def _wait(self, what: str, timeout_s: float = EXCHANGE_TIMEOUT_S) -> list[Path]:
        paths = [self._dir / f"{what}.w{w}" for w in range(self.size)]
        began = time.monotonic()
        deadline = began + timeout_s
        while not all(p.exists() for p in paths):
            now = time.monotonic()
            if now > deadline:
                missing = [w for w, p in enumerate(paths) if not p.exists()]
                raise MergeInputError(self._dir, f"merge workers {missing} sent nothing for {timeout_s:.0f} s")
            gone = self._watch()
            if gone is not None:
                raise MergeInputError(self._dir, gone)
            time.sleep(_poll_after(now - began))
        return paths


#: Bytes one gloo message of the exchange or of a part carries: what a worker holds in flight per peer.
TRANSFER_CHUNK = 4 << 20


class TorchWorld:
    """torchrun's workers on several hosts, over a gloo group; no folder is shared.

    Each node finds its own rank files (:mod:`commtag.merge.engine.hosts`); the
    exchanges and the workers' parts of the trace travel over the group in
    chunks of :data:`TRANSFER_CHUNK`, so no worker holds a whole part.
    """

    #: The workers' folders are their own: discovery and the parts go through the group.
    apart = True
    discovered: Optional[list[RankInput]] = None

    def __init__(self) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        if not dist.is_initialized():  # as long as a worker may wait for another's merge
            dist.init_process_group("gloo", timeout=timedelta(seconds=EXCHANGE_TIMEOUT_S))
        self._dist = dist
        self.index = dist.get_rank()
        self.size = dist.get_world_size()

    def start(self, ranks: Sequence[RankInput]) -> None:
        pass

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        import torch

        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.size)]
        self._dist.all_gather(sizes, size)
        lengths = [int(s.item()) for s in sizes]
        # A round holds a chunk from every worker: TRANSFER_CHUNK in all (at least 64 KiB each).
        step = max(1, min(max(lengths), max(TRANSFER_CHUNK // self.size, 1 << 16)))
        out = [bytearray() for _ in range(self.size)]
        for at in range(0, max(lengths), step):
            piece = data[at:at + step]
            mine = torch.zeros(step, dtype=torch.uint8)
            if piece:
                mine[: len(piece)] = torch.frombuffer(bytearray(piece), dtype=torch.uint8)
            chunks = [torch.zeros(step, dtype=torch.uint8) for _ in range(self.size)]
            self._dist.all_gather(chunks, mine)
            for got, chunk, length in zip(out, chunks, lengths):
                got += chunk[: max(0, min(step, length - at))].numpy().tobytes()
        # One part at a time to bytes, its bytearray dropped: copying all at once held every part twice.
        gathered = []
        while out:
            gathered.append(bytes(out.pop(0)))
        return gathered

    def send_part(self, path: Path) -> None:
        """Send this worker's part to worker 0, chunk by chunk (a length, then the bytes; 0 ends it,
        -1 says it could not be read, and worker 0 stops the merge)."""
        import torch

        try:
            with open(path, "rb") as stream:
                while block := stream.read(TRANSFER_CHUNK):
                    self._dist.send(torch.tensor([len(block)], dtype=torch.int64), dst=0)
                    self._dist.send(torch.frombuffer(bytearray(block), dtype=torch.uint8), dst=0)
        except OSError as exc:
            self._dist.send(torch.tensor([-1], dtype=torch.int64), dst=0)
            raise MergeInputError(path, f"cannot read this worker's part: {exc.strerror or exc}") from None
        self._dist.send(torch.tensor([0], dtype=torch.int64), dst=0)

    def receive_part(self, source: int, sink: BinaryIO) -> None:
        """Worker 0: write worker ``source``'s part into ``sink`` as it comes; every chunk is
        received even when writing fails, so that the sender is never left waiting."""
        import torch

        failed: Optional[OSError] = None
        length = torch.zeros(1, dtype=torch.int64)
        while True:
            self._dist.recv(length, src=source)
            n = int(length.item())
            if n == -1:
                raise MergeInputError(f"merge worker {source}", "could not read its part of the trace")
            if n == 0:
                break
            block = torch.empty(n, dtype=torch.uint8)
            self._dist.recv(block, src=source)
            if failed is None:
                try:
                    sink.write(block.numpy().tobytes())
                except OSError as exc:
                    failed = exc
        if failed is not None:
            raise failed

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


def under_launcher() -> bool:
    """Whether a launcher (torchrun) started this process as one of its workers, even as its only
    one (``--nproc-per-node=1``): then each worker is one merge worker and ``-j`` starts none."""
    return "WORLD_SIZE" in os.environ


def launcher_world(output: Path) -> Optional[World]:
    """The workers of this launch when torchrun started several; None for a plain process."""
    if not under_launcher():
        return None
    size = int(os.environ["WORLD_SIZE"])
    if size <= 1:
        return None
    if int(os.environ.get("LOCAL_WORLD_SIZE", "0")) == size:
        launch = hashlib.sha1(f"{socket.gethostname()}:{os.getppid()}:{os.environ.get('TORCHELASTIC_RUN_ID', '')}:"
                              f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}".encode()).hexdigest()[:16]
        # Named as a temporary of the torchrun agent (every local worker's parent): a merge after a
        # killed launch removes it (commtag.merge.engine.output.remove_stale).
        return FileWorld(int(os.environ["RANK"]), size,
                         temporary(output.parent / f"commtag-merge-{launch}", pid=os.getppid()), output)
    return TorchWorld()



"""How merge workers started by torchrun find each other and exchange their records.

Records travel as JSON bytes, never pickle. Two transports:

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
import socket
import time
from pathlib import Path
from typing import Optional, Protocol

import orjson

from commtag.merge.load import MergeInputError
from commtag.merge.output import temporary

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
        final = self._dir / f"{what}.w{self.index}"
        tmp = self._dir / f".{what}.w{self.index}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, final)

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

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
* :class:`TorchWorld` (workers on several hosts, each with its own disk):
  a gloo group; each node discovers its own files (:mod:`commtag.merge.hosts`)
  and worker 0 receives the others' parts of the trace over the group.

``commtag merge -j N`` (:class:`LocalWorld`) uses the same exchange without
torchrun: the merge is worker 0 and starts the other workers itself, each a
``python -c`` process given its request as JSON on stdin (never pickle).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, astuple, fields
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Optional, Protocol, Sequence, TypeVar

import orjson

from commtag.atomic import temporary, write_atomic
from commtag.merge.convert import EventAccount
from commtag.merge.errors import MergeFailed, MergeInputError, sigterm_stops_cleanly
from commtag.merge.output import output_errors
from commtag.merge.records import CollectiveInstance, GroupLane, Interner, RankSummary
from commtag.merge.runs import FileSpan

if TYPE_CHECKING:
    from commtag.merge.load import RankInput
    from commtag.merge.selection import Selection

#: How long a worker waits for the others' records (they may still be merging their ranks).
EXCHANGE_TIMEOUT_S = float(os.environ.get("COMMTAG_MERGE_EXCHANGE_TIMEOUT_S", "7200"))
_POLL_S = 0.01
#: How long closing waits for the other workers to finish reading.
_CLOSE_TIMEOUT_S = 60.0
#: How long an interrupted -j merge lets its workers stop by themselves (a Ctrl-C reaches them too).
_INTERRUPT_GRACE_S = 0.5


class World(Protocol):
    """The merge job's workers (one, or torchrun's)."""

    index: int
    size: int
    #: Whether each worker sees only its own host's files (:class:`TorchWorld`), not one shared folder.
    apart: bool
    #: The ranks worker 0 discovered, when it sent them (a ``-j`` worker): not discovered again.
    discovered: Optional[list[RankInput]]

    def start(self, ranks: int) -> None:
        """Discovery found ``ranks`` ranks: a world that starts its own workers starts them now."""

    def all_gather_bytes(self, data: bytes) -> list[bytes]: ...

    def close(self) -> None: ...


class SoloWorld:
    index = 0
    size = 1
    apart = False
    discovered = None

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
    """

    apart = False

    def __init__(self, index: int, size: int, folder: Path,
                 watch: Callable[[], Optional[str]] = lambda: None,
                 discovered: Optional[list[RankInput]] = None) -> None:
        self.index = index
        self.size = size
        self.discovered = discovered
        self._dir = folder
        #: Why waiting on is pointless (a worker is gone), else None; asked while waiting.
        self._watch = watch
        self._round = 0

    def start(self, ranks: Sequence[RankInput]) -> None:
        pass

    def all_gather_bytes(self, data: bytes) -> list[bytes]:
        self._round += 1
        self._publish(f"r{self._round}", data)
        paths = self._wait(f"r{self._round}")
        # Its own part is ``data``: read back, it was every worker's records once more in memory.
        return [data if w == self.index else p.read_bytes() for w, p in enumerate(paths)]

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
                while self._dir.exists() and time.monotonic() < deadline and self._watch() is None:
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
            gone = self._watch()
            if gone is not None:
                raise MergeInputError(self._dir, gone)
            time.sleep(_POLL_S)
        return paths


#: What a -j worker process runs (its request comes on stdin).
_SERVE = "from commtag.merge.workers import serve; raise SystemExit(serve())"
#: Input (compressed bytes as found on disk) per extra worker before -j's default starts one:
#: below it a worker's start (an interpreter, the merge's imports: ~0.4 s) costs more than its share saves.
MIN_INPUT_PER_WORKER = 16 << 20
#: A merge worker's peak RSS, measured by launch/bench_merge.py and bench_ranks.py: a fixed part
#: (interpreter, imports, output buffers), a part per byte of the largest rank's JSON (the rank it
#: holds while writing it), and every rank's collective records, which every worker holds for the
#: analysis (~750 bytes per instance, ~700 bytes of sidecar each: counted per sidecar byte).
#: Taken on the high side, so that -j's default never starts more workers than memory holds.
WORKER_BASE_RSS = 64 << 20
WORKER_RSS_PER_JSON_BYTE = 3
WORKER_RSS_PER_SIDECAR_BYTE = 2


def worker_rss_estimate(largest_rank_json: int, all_sidecars: int = 0) -> int:
    """The peak RSS one merge worker is expected to reach: its largest rank has ``largest_rank_json``
    bytes of JSON, and the job's sidecars (every rank's records) ``all_sidecars`` bytes."""
    return WORKER_BASE_RSS + WORKER_RSS_PER_JSON_BYTE * largest_rank_json + WORKER_RSS_PER_SIDECAR_BYTE * all_sidecars


def jobs_for(cpus: int, input_bytes: int, largest_rank_json: int, available_memory: Optional[int],
             all_sidecars: int = 0) -> int:
    """-j's default from what it depends on: no more workers than CPUs, than the input keeps busy,
    or than the memory available holds (None: unknown, no cap)."""
    jobs = min(cpus, input_bytes // MIN_INPUT_PER_WORKER)
    if available_memory is not None:
        jobs = min(jobs, available_memory // worker_rss_estimate(largest_rank_json, all_sidecars))
    return max(1, jobs)


def available_memory() -> Optional[int]:
    """The kernel's estimate of memory new processes can use (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def usable_cpus() -> int:
    """The CPUs this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs(ranks: Sequence[RankInput]) -> int:
    """-j's default: the CPUs this process may use, no more than the input keeps busy and memory holds."""
    cpus = usable_cpus()
    from commtag.merge.budget import json_bytes  # the budget's module pulls in the writer; -j's default runs once

    largest = max((sum(json_bytes(f.path) for f in rank.files) for rank in ranks), default=0)
    sidecars = sum(f.sidecar.stat().st_size for rank in ranks for f in rank.files if f.sidecar is not None)
    return jobs_for(cpus, sum(r.size for r in ranks), largest, available_memory(), sidecars)


class LocalWorld(FileWorld):
    """``-j N``: this process is worker 0 and starts the other workers itself, on this host.

    They exchange as torchrun's workers on one host do (:class:`FileWorld`),
    through a folder named as a temporary of this process. Each is
    ``python -c`` running :func:`serve` with ``request`` (the merge's
    arguments, JSON) and its place; its stderr goes to an unnamed temporary
    file, whose last line names what stopped it. ``jobs``: how many
    workers (None: :func:`default_jobs`); never more than ranks.

    With ``jobs`` given, the other interpreters (as many as there are CPUs
    for) start at once and wait for their request: their start and imports
    (~0.4 s) overlap this process's discovery instead of delaying their first
    rank while worker 0 already reads its own (every worker then waits for the
    last). Those that discovery shows are not needed (fewer ranks than
    workers) get no request and exit.
    """

    def __init__(self, jobs: Optional[int], output: Path, request: dict) -> None:
        super().__init__(0, 1, temporary(output.parent / "commtag-merge-j", pid=os.getpid()), self._gone)
        self._jobs = jobs
        self._output = output
        self._request = request
        self._children: list[subprocess.Popen] = []
        self._errors: list[BinaryIO] = []
        #: Started, waiting for a request (:meth:`start` gives it, :meth:`stop` sends them away).
        self._waiting: list[tuple[subprocess.Popen, BinaryIO]] = []
        if jobs is not None:
            try:
                self._waiting = [self._spawn() for _ in range(min(jobs, usable_cpus()) - 1)]
            except OSError:  # no process to spare now: start() starts them as it would have
                self._release()

    @staticmethod
    def _spawn() -> tuple[subprocess.Popen, BinaryIO]:
        err = tempfile.TemporaryFile()
        try:
            return subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=err), err
        except BaseException:
            err.close()
            raise

    def start(self, ranks: Sequence[RankInput]) -> None:
        jobs = self._jobs or default_jobs(ranks)
        size = max(1, min(jobs, len(ranks)))
        try:
            with output_errors(self._output, " the output"):  # the folder goes beside it
                if size > 1:
                    self._dir.mkdir(exist_ok=True)
                found = ranks_to_wire(ranks)  # what worker 0 discovered: each worker would find the same
                for index in range(1, size):
                    child, err = self._waiting.pop(0) if self._waiting else self._spawn()
                    self._children.append(child)
                    self._errors.append(err)
                    child.stdin.write(orjson.dumps({**self._request, "index": index, "size": size,
                                                    "folder": str(self._dir), "owner": os.getpid(),
                                                    "ranks": found}))
                    child.stdin.close()
        except BaseException:
            self.stop(interrupted=True)  # those started already would wait for worker 0 in vain
            raise
        self._release()
        self.size = size

    def _release(self) -> None:
        """Send away the started workers no request went to: an empty request ends them."""
        for child, err in self._waiting:
            try:
                child.stdin.close()
            except OSError:
                pass  # it is gone already
            child.wait()
            err.close()
        self._waiting = []

    def _gone(self) -> Optional[str]:
        for index, child in enumerate(self._children, 1):
            if child.poll() is not None:
                return f"merge worker {index} stopped (exit status {child.returncode}): {self._last_words(index)}"
        return None

    def _last_words(self, index: int) -> str:
        try:
            err = self._errors[index - 1]
            err.seek(0)
            lines = err.read().decode(errors="replace").strip().splitlines()
        except OSError:
            lines = []
        return lines[-1] if lines else "it said nothing"

    def close(self) -> None:
        super().close()
        self.stop()

    def stop(self, interrupted: bool = False) -> None:
        """Wait for the workers this process started to end, then remove their folder. When the
        merge was interrupted, a worker still running after a moment (a Ctrl-C reaches them all
        at once) is stopped too, so that it removes its part as this process removed its own: by
        SIGTERM, which it handles as an interrupt, as SIGINT is ignored by every process of a merge
        started in the background (a shell's ``&``, a script's job) and reaches none."""
        self._release()
        if interrupted:
            time.sleep(_INTERRUPT_GRACE_S)
            for child in self._children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
        for child in self._children:
            try:
                child.wait(timeout=_CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for err in self._errors:
            err.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def ranks_to_wire(ranks: Sequence[RankInput]) -> list:
    """Discovered ranks as JSON data for a -j worker: each rank's files, sidecars, sizes, base times."""
    return [[r.rank, [[str(f.path), None if f.sidecar is None else str(f.sidecar), f.size, f.base_ns]
                      for f in r.files]] for r in ranks]


def ranks_from_wire(data: list) -> list[RankInput]:
    """The ranks :func:`ranks_to_wire` sent."""
    from commtag.merge.load import RankInput, TraceFile

    return [RankInput(rank, [TraceFile(Path(path), None if sidecar is None else Path(sidecar), size, base)
                             for path, sidecar, size, base in files]) for rank, files in data]


def selection_to_wire(selection: Optional[Selection]) -> Optional[dict]:
    """A --steps/--window/--detail selection as JSON data for a -j worker."""
    if selection is None:
        return None
    return {name: None if value is None else sorted(value) if isinstance(value, frozenset) else list(value)
            for name, value in (("steps", selection.steps), ("window", selection.window),
                                ("detail", selection.detail))}


def selection_from_wire(data: Optional[dict]) -> Optional[Selection]:
    """The selection :func:`selection_to_wire` sent."""
    if data is None:
        return None
    from commtag.merge.selection import Selection

    window = data["window"]
    return Selection(steps=None if data["steps"] is None else frozenset(data["steps"]),
                     window=None if window is None else (window[0], window[1]),
                     detail=None if data["detail"] is None else frozenset(data["detail"]))


def serve() -> int:
    """A worker a ``-j`` merge started: merge its share of the request read from stdin; every
    error goes to worker 0 (which reports), and the exit status is the merge's."""
    from commtag.merge import pipeline
    from commtag.merge.analyze import MergeAnalysis

    sent = sys.stdin.buffer.read()
    if not sent:  # started ahead (-j N), then not needed: fewer ranks than workers, or worker 0 stopped
        return 0
    request = orjson.loads(sent)
    owner = request.pop("owner")
    world = FileWorld(request.pop("index"), request.pop("size"), Path(request.pop("folder")),
                      lambda: None if os.getppid() == owner else "merge worker 0 is gone",
                      ranks_from_wire(request.pop("ranks")))
    analysis = MergeAnalysis() if request.pop("analysis") else None
    selection = selection_from_wire(request.pop("selection"))
    error: Optional[MergeInputError] = None
    try:
        with sigterm_stops_cleanly():  # killed alone, it removes its part as an interrupted one does
            pipeline.merge(request.pop("inputs"), request.pop("output"), world=world, analysis=analysis,
                           selection=selection, progress=False, **request)
    except MergeInputError as exc:
        error = exc
    failed = bool(settle(world, error))
    world.close()
    return 2 if failed else 0


#: Bytes one gloo message of the exchange or of a part carries: what a worker holds in flight per peer.
TRANSFER_CHUNK = 4 << 20


class TorchWorld:
    """torchrun's workers on several hosts, over a gloo group; no folder is shared.

    Each node finds its own rank files (:mod:`commtag.merge.hosts`); the
    exchanges and the workers' parts of the trace travel over the group in
    chunks of :data:`TRANSFER_CHUNK`, so no worker holds a whole part.
    """

    #: The workers' folders are their own: discovery and the parts go through the group.
    apart = True
    discovered = None

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
        # killed launch removes it (commtag.merge.output.remove_stale).
        return FileWorld(int(os.environ["RANK"]), size,
                         temporary(output.parent / f"commtag-merge-{launch}", pid=os.getppid()))
    return TorchWorld()


_Result = TypeVar("_Result")


def launched(output: Path, work: Callable[[Optional[World]], _Result], local: Optional[LocalWorld] = None
             ) -> _Result:
    """Run ``work`` on this launch's workers (:func:`launcher_world`; else ``local``, the
    workers of ``-j``; None for a plain process) from their start to their close.

    Raises :class:`MergeFailed` with every worker's errors on every worker
    (each then exits with the same status; ``lead`` says which one reports).
    """
    world = launcher_world(output) or local
    error: Optional[MergeInputError] = None
    try:
        result = work(world)
    except MergeInputError as exc:
        error = exc
    except BaseException:  # interrupted: the workers this process started go with it
        if isinstance(world, LocalWorld):
            world.stop(interrupted=True)
        raise
    if isinstance(world, LocalWorld) and world.size == 1:
        world.stop()  # the workers started ahead of discovery, if any, are not needed
    if world is None or world.size == 1:  # one process (-j found one worker enough): nobody to tell
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
             skipped: Optional[list[MergeInputError]] = None,
             notices: Optional[list[str]] = None) -> list[RankSummary]:
    """Every worker's summaries (``produce`` makes this worker's), in rank order; an input
    error anywhere stops all workers.

    ``skipped`` (--skip-bad-ranks) becomes every worker's skipped files, and
    ``notices`` every worker's notices (those ``produce`` added while reading
    its ranks too), each once, in worker order. A worker keeps its own
    summaries as they are and decodes only the others'.
    """
    if world.size == 1:
        # Nothing to exchange: a JSON round trip of every instance would cost more than the merge.
        return sorted(produce(), key=lambda s: s.rank)
    mine: list[RankSummary] = []
    batches: list[list[RankSummary]] = [[]]

    def step() -> dict:
        nonlocal mine, batches
        mine = produce()
        batches = _rounds(mine)
        return {**to_wire(batches[0]), "rounds": len(batches),
                "skipped": [[str(e.path), e.problem] for e in skipped or ()], "notices": list(notices or ())}

    parts = all_done(world, step)
    if notices is not None:
        notices[:] = dict.fromkeys(n for part in parts for n in (notices if part is None else part["notices"]))
    if skipped is not None:
        every = [[[str(e.path), e.problem] for e in skipped] if part is None else part["skipped"] for part in parts]
        union = dict.fromkeys((path, problem) for listed in every for path, problem in listed)
        skipped[:] = [MergeInputError(path, problem) for path, problem in union]
    rounds = max([len(batches)] + [part["rounds"] for part in parts if part is not None])
    others = [s for part in parts if part is not None for s in from_wire(part, interner)]
    del parts
    for r in range(1, rounds):
        for part in all_done(world, lambda r=r: to_wire(batches[r] if r < len(batches) else [])):
            if part is not None:
                others += from_wire(part, interner)
    return sorted(mine + others, key=lambda s: s.rank)


#: Collective instances a merge worker sends per exchange round. orjson parses a whole document
#: into a tree of its own before it makes the Python objects: a 512-rank torchrun-2 worker's part
#: (11.5 MB of JSON) took 69 MB at once. Rounds of this many keep that peak a few MB.
EXCHANGE_ROUND_INSTANCES = 8192


def _rounds(summaries: list[RankSummary]) -> list[list[RankSummary]]:
    """Consecutive summaries, each round at most EXCHANGE_ROUND_INSTANCES instances (a rank
    with more goes alone); at least one round, maybe empty."""
    rounds: list[list[RankSummary]] = [[]]
    count = 0
    for summary in summaries:
        if rounds[-1] and count + len(summary.instances) > EXCHANGE_ROUND_INSTANCES:
            rounds.append([])
            count = 0
        rounds[-1].append(summary)
        count += len(summary.instances)
    return rounds


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
    blobs = world.all_gather_bytes(payload)
    del payload
    # Each part parsed, then its bytes dropped: every worker's records are in memory once at a time, not twice.
    parts: list[Optional[dict]] = []
    for i in range(len(blobs)):
        blob, blobs[i] = blobs[i], b""
        parts.append(None if i == world.index else orjson.loads(blob))
        del blob
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
#: Numbers that many instances repeat (a rank, a call site's sizes): after decoding, one object each
#: (those of the call sites' args where they hold them), as where the instances were made, not
#: 28 bytes per instance each (an int above 256 is a new object each time orjson reads it).
_REPEATED_AT = [_FIELDS.index(name) for name in ("rank", "in_nelems", "out_nelems", "group_size", "lane_id")]
_ARGS_AT = _FIELDS.index("args")


def to_wire(summaries: list[RankSummary]) -> dict:
    """Summaries as JSON data: a rank's instances as one column per field (not a list per
    instance: on both ends those were most of what the exchange added to a worker's peak), their
    ``common_args``, texts and member ranks indexes into tables, so that what many instances
    share travels once. Shared objects are found by identity (member tuples are interned), not
    hashed again for every instance."""
    index: dict[int, int] = {}
    table: list[dict] = []
    texts: dict[str, int] = {}
    rank_lists: dict[int, tuple[int, tuple]] = {}
    out = []
    for s in summaries:
        columns: list[list] = [[] for _ in _FIELDS]
        for inst in s.instances:
            row = [getattr(inst, name) for name in _FIELDS]
            ref = index.get(id(inst.common_args))
            if ref is None:
                ref = index[id(inst.common_args)] = len(table)
                table.append(inst.common_args)
            row[_COMMON_AT] = ref
            for at in _TEXTS_AT:
                row[at] = texts.setdefault(row[at], len(texts))
            ranks = row[_RANKS_AT]
            found = rank_lists.get(id(ranks))
            if found is None:  # held with its number, so that its id stays its own
                found = rank_lists[id(ranks)] = (len(rank_lists), ranks)
            row[_RANKS_AT] = found[0]
            for column, value in zip(columns, row):
                column.append(value)
        out.append({"rank": s.rank, "host": s.host, "first_ns": s.first_ns, "groups": [list(g) for g in s.groups],
                    "lane_kernels": s.lane_kernels, "windows": s.windows, "world_size": s.world_size,
                    "files": [astuple(f) for f in s.files], "instances": columns, "notes": s.notes,
                    "account": None if s.account is None else asdict(s.account)})
    return {"common": table, "texts": list(texts), "ranks": [ranks for _, ranks in rank_lists.values()],
            "summaries": out}


def from_wire(data: dict, interner: Interner) -> list[RankSummary]:
    """The summaries :func:`to_wire` sent, their shared args and rank lists interned again (by the merge's ``interner``)."""
    # Rebuilt key by key, texts shared: orjson sizes a dict's table for more keys than it holds (a
    # 21-key call site's args took 1,168 bytes against 464) and gives every dict its own copy of a
    # text that many call sites repeat (a group's ranks); these are kept for the whole merge.
    table = [interner.common({key: interner.shared(value) if value.__class__ is str else value
                              for key, value in args.items()}) for args in data["common"]]
    texts = [interner.shared(text) for text in data["texts"]]  # the same objects as the args' (a pg uid, a lane)
    rank_lists = [interner.shared(tuple(ranks)) for ranks in data["ranks"]]
    # The call sites' numbers first, for the instance fields that repeat them (sizes, lane id).
    same = {value: value for args in table for value in args.values() if value.__class__ is int}
    summaries = []
    for s in data["summaries"]:
        instances = []
        columns = s.pop("instances")
        for at in _REPEATED_AT:
            columns[at] = [same.setdefault(value, value) for value in columns[at]]
        columns[_ARGS_AT] = [{key: same.setdefault(value, value) if value.__class__ is int else value
                              for key, value in own.items()} for own in columns[_ARGS_AT]]
        for values in zip(*columns):
            row = list(values)
            row[_COMMON_AT] = table[row[_COMMON_AT]]
            row[_RANKS_AT] = rank_lists[row[_RANKS_AT]]
            for at in _TEXTS_AT:
                row[at] = texts[row[at]]
            instances.append(CollectiveInstance(*row))
        s["groups"] = [GroupLane(name, lane_id, uid, interner.shared(tuple(ranks)))
                       for name, lane_id, uid, ranks in s["groups"]]
        s["windows"] = [tuple(w) for w in s["windows"]]
        s["account"] = None if s["account"] is None else EventAccount(**s["account"])
        s["files"] = [FileSpan(*f) for f in s["files"]]
        summaries.append(RankSummary(**s, instances=instances))
    return summaries

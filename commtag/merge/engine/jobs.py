"""``commtag merge -j N``: this process is worker 0 and starts the other workers itself.

Each is a ``python -c`` process (:data:`_SERVE`) given its request as JSON on
stdin, never pickle: the inputs, the output and the :class:`MergeOptions`
whole (:func:`request_to_wire`); :func:`serve` is its end. -j's default
(:func:`default_jobs`) weighs CPUs, input and memory. :func:`launched` runs
a merge on whichever workers this launch has (torchrun's, -j's or none).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO, Callable, Optional, Sequence, TypeVar

import orjson

from commtag.atomic import temporary
from commtag.merge.errors import MergeFailed, MergeInputError, sigterm_stops_cleanly
from commtag.merge.engine.options import MergeOptions
from commtag.merge.engine.output import output_errors
from commtag.merge.engine.worlds import CLOSE_TIMEOUT_S, FileWorld, World, launcher_world, settle

if TYPE_CHECKING:
    from commtag.merge.inputs.load import RankInput


#: How long an interrupted -j merge lets its workers stop by themselves (a Ctrl-C reaches them too).
_INTERRUPT_GRACE_S = 0.5


#: What a -j worker process runs (its request comes on stdin).
_SERVE = "from commtag.merge.engine.jobs import serve; raise SystemExit(serve())"


#: Trace JSON (uncompressed: what a worker parses) per extra worker before -j's default starts
#: one: below it the exchanges between workers cost more than a share saves. Measured on the first
#: 8, 16 and 32 ranks of the 128-rank scale set (2 CPUs, 2026-11-29): -j 2 took 1.10x -j 1's wall
#: time at 11 MB of JSON, 0.89x at 22 MB, 0.76x at 43 MB. Counted as found on disk, gzip's 12:1
#: hid 173 MB of JSON (a 1.6x faster -j 2) behind 14 MB.
MIN_JSON_PER_WORKER = 12 << 20


#: A merge worker's peak RSS, measured by launch/bench_merge.py, bench_ranks.py and bench_shards.py:
#: a fixed part (interpreter, imports, output buffers), a part per byte of the largest rank's JSON
#: (the rank it holds while writing it), and its share of the job's collective records (~750 bytes
#: per instance, ~700 bytes of sidecar each: counted per sidecar byte). One process holds every
#: rank's; each of N workers holds 1/N of them at a time (engine/shards.py: its ranks' packed,
#: the collectives it owns matched a bucket at a time), so the records are 2/N per worker.
#: Taken on the high side, so that -j's default never starts more workers than memory holds.
WORKER_BASE_RSS = 64 << 20


WORKER_RSS_PER_JSON_BYTE = 3


WORKER_RSS_PER_SIDECAR_BYTE = 2


def worker_rss_estimate(largest_rank_json: int, all_sidecars: int = 0, workers: int = 1) -> int:
    """The peak RSS one of ``workers`` merge workers is expected to reach: its largest rank has
    ``largest_rank_json`` bytes of JSON, and the job's sidecars (every rank's records) ``all_sidecars``
    bytes, of which it holds its share."""
    return (WORKER_BASE_RSS + WORKER_RSS_PER_JSON_BYTE * largest_rank_json
            + WORKER_RSS_PER_SIDECAR_BYTE * all_sidecars // workers)


#: Sidecar bytes per byte worker 0 holds besides its share when it replays the impact: every
#: record's member times, as flat columns (start, end, rank and the replay's links: about 40
#: bytes per ~700-byte record; engine/shards.py, analysis/columns.py). Job-wide: with many
#: workers it outgrows a worker's share of the records.
LEAD_SIDECAR_BYTES_PER_RSS_BYTE = 16


def job_rss_estimate(largest_rank_json: int, all_sidecars: int, workers: int) -> int:
    """The peak RSS ``workers`` merge workers are expected to reach together: each its share, and
    worker 0 the impact replay over the whole job."""
    return (workers * worker_rss_estimate(largest_rank_json, all_sidecars, workers)
            + all_sidecars // LEAD_SIDECAR_BYTES_PER_RSS_BYTE)


def jobs_for(cpus: int, input_json: int, largest_rank_json: int, available_memory: Optional[int],
             all_sidecars: int = 0) -> int:
    """-j's default from what it depends on: no more workers than CPUs, than the input keeps busy,
    or than the memory available holds, each holding its share of the records (None: unknown, no cap)."""
    jobs = min(cpus, input_json // MIN_JSON_PER_WORKER)
    if available_memory is not None:
        while jobs > 1 and job_rss_estimate(largest_rank_json, all_sidecars, jobs) > available_memory:
            jobs -= 1
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
    from commtag.merge.engine.budget import json_bytes  # the budget's module pulls in the writer; -j's default runs once

    per_rank = [sum(json_bytes(f.path) for f in rank.files) for rank in ranks]
    sidecars = sum(f.sidecar.stat().st_size for rank in ranks for f in rank.files if f.sidecar is not None)
    return jobs_for(cpus, sum(per_rank), max(per_rank, default=0), available_memory(), sidecars)


def _stdin(child: subprocess.Popen) -> IO[bytes]:
    """The pipe to a worker's stdin (every worker is started with one)."""
    if child.stdin is None:
        raise RuntimeError("a merge worker was started without a pipe to its stdin")
    return child.stdin


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
        super().__init__(0, 1, temporary(output.parent / "commtag-merge-j", pid=os.getpid()), output, self._gone)
        self._jobs = jobs
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
                    self.set_aside(range(size))
                found = ranks_to_wire(ranks)  # what worker 0 discovered: each worker would find the same
                for index in range(1, size):
                    child, err = self._waiting.pop(0) if self._waiting else self._spawn()
                    self._children.append(child)
                    self._errors.append(err)
                    request = _stdin(child)
                    request.write(orjson.dumps({**self._request, "index": index, "size": size,
                                                "folder": str(self._dir), "owner": os.getpid(), "ranks": found}))
                    request.close()
        except BaseException:
            self.stop(interrupted=True)  # those started already would wait for worker 0 in vain
            raise
        self._release()
        self.size = size

    def _release(self) -> None:
        """Send away the started workers no request went to: an empty request ends them."""
        for child, err in self._waiting:
            try:
                _stdin(child).close()
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
                child.wait(timeout=CLOSE_TIMEOUT_S)
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
    from commtag.merge.inputs.load import RankInput, TraceFile

    return [RankInput(rank, [TraceFile(Path(path), None if sidecar is None else Path(sidecar), size, base)
                             for path, sidecar, size, base in files]) for rank, files in data]


def request_to_wire(inputs: Sequence[Path], output: Path, options: MergeOptions, analysis: bool) -> dict:
    """What a -j worker is asked to merge, as JSON data: the inputs, the output and the options whole."""
    return {"inputs": [str(p) for p in inputs], "output": str(output), "options": options.to_wire(),
            "analysis": analysis}


def options_from_wire(data: dict) -> MergeOptions:
    """The options :func:`request_to_wire` sent, for a worker: it shows no progress bar (worker 0 does)."""
    from commtag.merge.inputs.selection import Selection

    chosen = data["selection"]
    window = None if chosen is None else chosen["window"]
    selection = None if chosen is None else Selection(
        steps=None if chosen["steps"] is None else frozenset(chosen["steps"]),
        window=None if window is None else (window[0], window[1]),
        detail=None if chosen["detail"] is None else frozenset(chosen["detail"]))
    inspector = data.get("nccl_inspector")
    return MergeOptions(**{**data, "json_dir": None if data["json_dir"] is None else Path(data["json_dir"]),
                           "nccl_inspector": None if inspector is None else Path(inspector),
                           "selection": selection, "progress": False})


def serve() -> int:
    """A worker a ``-j`` merge started: merge its share of the request read from stdin; every
    error goes to worker 0 (which reports), and the exit status is the merge's."""
    from commtag.merge.engine import pipeline
    from commtag.merge.analysis.hook import MergeAnalysis

    sent = sys.stdin.buffer.read()
    if not sent:  # started ahead (-j N), then not needed: fewer ranks than workers, or worker 0 stopped
        return 0
    request = orjson.loads(sent)
    owner = request.pop("owner")
    world = FileWorld(request.pop("index"), request.pop("size"), Path(request.pop("folder")),
                      Path(request["output"]), lambda: None if os.getppid() == owner else "merge worker 0 is gone",
                      ranks_from_wire(request.pop("ranks")))
    analysis = MergeAnalysis() if request["analysis"] else None
    error: Optional[MergeInputError] = None
    try:
        with sigterm_stops_cleanly():  # killed alone, it removes its part as an interrupted one does
            pipeline.merge(request["inputs"], request["output"], options_from_wire(request["options"]),
                           analysis=analysis, world=world)
    except MergeInputError as exc:
        error = exc
    failed = bool(settle(world, error))
    world.close()
    return 2 if failed else 0


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

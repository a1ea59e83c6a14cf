"""What is kept while the profiler runs, and the profiler's on_trace_ready handler.

The wrappers append one entry per collective only while the autograd
profiler is enabled (the active steps of a schedule; not wait or warmup), so
a job that is not being profiled accumulates nothing. An entry is the
wrapper's own record of the call (cheap on the hot path), which builds the
annotation's fields itself; they are built and validated once, when
:func:`trace_handler` writes the sidecar.

A call belongs to the window it started in. One still running when that
window's trace is handed over (an async work not complete yet, another
thread's call) is written there as unfinished, ending at that moment
(:func:`drain`), and its own end, when it comes, is not kept again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Union

import torch
import torch.distributed as dist
from pydantic import ValidationError
from torch.profiler import ProfilerAction

from commtag.atomic import temporary
from commtag.constants import MAX_UNWATCHED_SPANS, TRACE_SUFFIX, sidecar_name_for
from commtag.runtime import capture
from commtag.runtime.describe import groups
from commtag.runtime.record import sidecar
from commtag.runtime.failopen import log_once
from commtag.schema import RecordedCollective, Sidecar, UnwatchedSpan

#: The calling thread's profiler check (a C call) and the module holding torch's process-wide
#: flag, bound once: the collectives' idle path reads them on every call.
thread_profiled: Callable[[], bool] = torch._C._autograd._profiler_enabled
autograd_profiler = torch.autograd.profiler
_now_ns = time.time_ns


def profiler_enabled() -> bool:
    """Is a profiler recording ops right now (~100 ns)?

    The thread-local check alone misses ``profile(experimental_config=
    _ExperimentalConfig(profile_all_threads=True))``: that profiler records
    every thread's ops while reporting itself disabled on each of them; torch
    sets its process-wide Python flag for every profiler start, so read both.
    """
    return thread_profiled() or autograd_profiler._is_profiler_enabled


class Entry(Protocol):
    """A finished call as the recorder keeps it (:class:`commtag.runtime.describe.calls.CallRecord`)."""

    start_ns: int
    tid: int
    thread_name: str

    def annotation_fields(self) -> dict[str, Any]:
        """Its CollectiveAnnotation fields by name; asked once, by :func:`drain`."""


_buffer: list[tuple[Entry, int, Optional[int]]] = []
_buffer_lock = threading.Lock()
#: Recorded calls started and not finished yet, by id (the wrappers put each in as it starts):
#: what a window's end finds still running.
IN_FLIGHT: dict[int, Entry] = {}
#: Calls already written as unfinished, by id, until their own end arrives (then not kept again).
_written_unfinished: dict[int, Entry] = {}
#: The end of a call drained while it ran: it is written ending at the drain, as unfinished.
_NO_END = -1


def add(entry: Entry, end_ns: int, done_tid: Optional[int] = None) -> None:
    """Keep one finished call, ending at ``end_ns`` on the trace's clock.

    ``entry`` must not change after this call; its fields are built by
    :func:`drain`, off the collective's path. ``done_tid``: the thread that
    saw an async work complete, at ``end_ns`` (see ``RecordedCollective.done_tid``).
    """
    with _buffer_lock:  # against drain: a call is written once, finished or not
        if _resumed_at is not None:
            _watching_since(entry.start_ns)
        if IN_FLIGHT.pop(id(entry), None) is None and _written_unfinished.pop(id(entry), None) is entry:
            return  # its window was written while it ran: it is there, unfinished
        _buffer.append((entry, end_ns, done_tid))


def drain(since_ns: Optional[int] = None) -> list[RecordedCollective]:
    """Take every kept collective (started at or after ``since_ns``), validated, and every call
    started since then and still running, as unfinished at this moment.

    An entry whose fields cannot be built or fail validation is dropped and
    logged once: the rest of the sidecar is still worth writing.
    """
    global _buffer
    with _buffer_lock:
        now = _now_ns()
        running = [e for e in IN_FLIGHT.values() if since_ns is None or e.start_ns >= since_ns]
        for entry in running:
            del IN_FLIGHT[id(entry)]
            _written_unfinished[id(entry)] = entry
        taken, _buffer = _buffer, []
    taken.extend((entry, _NO_END, None) for entry in running)
    recorded = []
    for entry, end_ns, done_tid in taken:
        if since_ns is not None and entry.start_ns < since_ns:
            continue
        unfinished = end_ns == _NO_END
        try:
            annotation = entry.annotation_fields()
        except Exception as exc:  # noqa: BLE001 - one bad entry must not cost the sidecar
            log_once("building a recorded collective's annotation", exc)
            continue
        try:
            recorded.append(
                RecordedCollective.model_validate(
                    {
                        "annotation": annotation,
                        "start_ns": entry.start_ns,
                        "end_ns": max(now, entry.start_ns) if unfinished else end_ns,
                        "tid": entry.tid,
                        "thread_name": entry.thread_name,
                        "done_tid": done_tid,
                        "unfinished": True if unfinished else None,
                    }
                )
            )
        except ValidationError as exc:
            log_once("validating a recorded collective", exc)
    return recorded


#: Spans ``(start_ns, end_ns)`` in which commtag was not installed in this process, in time order:
#: the calls then were not recorded. The first runs from 0 (the process before its first install).
_off_spans: list[tuple[int, int]] = []
#: When the span now open began (None: none is open); kept under ``_buffer_lock``.
_off_since: Optional[int] = 0
#: When commtag was installed again, while the profiler recorded, with a span open. The span
#: stays open until the first call recorded since then starts: a call that fetched torch's own
#: function before the install may still be running (unrecorded) after it, so the install's
#: moment is no proof of watching. (Installed while nothing records, the span ends there.)
_resumed_at: Optional[int] = None


def note_installed(installed: bool) -> None:
    """commtag is now installed (True, after its install) or about to be uninstalled (False,
    before anything is put back); :mod:`commtag.runtime.install.hooks` calls it under its lock."""
    global _off_since, _resumed_at
    now = _now_ns()
    with _buffer_lock:
        if installed:
            if _off_since is not None and _resumed_at is None:
                _resumed_at = now
                if not profiler_enabled():
                    _watching_since(now)
        else:
            _resumed_at = None
            if _off_since is None:
                _off_since = now


def _watching_since(start_ns: int) -> None:
    """A recorded call started at ``start_ns``: an open span whose install came before it ends
    there (hold ``_buffer_lock``)."""
    global _off_since, _resumed_at
    if _resumed_at is None or start_ns < _resumed_at or _off_since is None:
        return
    _off_spans.append((_off_since, start_ns))
    _off_since = _resumed_at = None
    if len(_off_spans) >= MAX_UNWATCHED_SPANS:  # one more may be open: the two oldest become one
        _off_spans[0:2] = [(_off_spans[0][0], _off_spans[1][1])]


def unwatched(since_ns: Optional[int], until_ns: int) -> list[tuple[int, int]]:
    """The spans between ``since_ns`` (None: the beginning) and ``until_ns`` in which commtag was
    not installed, clipped to them; spans that end before ``since_ns`` are forgotten (a later
    window begins later still)."""
    low = since_ns or 0
    with _buffer_lock:
        spans = list(_off_spans)
        if _off_since is not None:
            spans.append((_off_since, until_ns))
        _off_spans[:] = [span for span in _off_spans if span[1] >= low]
    return [(max(start, low), min(end, until_ns)) for start, end in spans if end >= low and start <= until_ns]


def pending() -> int:
    """How many collectives are kept and not yet written (tests, summaries)."""
    return len(_buffer)


#: The run id agreed through a default group's store: kept for the process's later lives of the
#: world (destroy_process_group and init again), whose new store would agree on another one.
_agreed_run_id: Optional[str] = None
#: The run id chosen while no group could agree on one.
_own_run_id: Optional[str] = None


def run_id() -> str:
    """An id shared by every rank of this run, agreed once through the default store.

    COMMTAG_RUN_ID wins when set. Otherwise every rank proposes a random id
    with compare_set on the default process group's store: the first proposal
    stays and every rank reads it back, with no rank waiting for another. The
    agreed id stays for the whole process, so profiles taken before and after
    a re-init of the world merge as one run. Without a process group,
    TORCHELASTIC_RUN_ID (unless torchrun's placeholder "none") or a fresh id
    is used.
    """
    global _agreed_run_id, _own_run_id
    explicit = os.environ.get("COMMTAG_RUN_ID")
    if explicit:
        return explicit
    if _agreed_run_id is not None:
        return _agreed_run_id
    if dist.is_initialized():
        try:
            store = dist.distributed_c10d._get_default_store()
            value = store.compare_set("commtag/run_id", "", uuid.uuid4().hex).decode()
        except Exception as exc:  # noqa: BLE001 - any store trouble: fall back below
            log_once("agreeing on a run id through the store", exc)
        else:
            if value:
                _agreed_run_id = value
                return value
    if _own_run_id is None:
        elastic = os.environ.get("TORCHELASTIC_RUN_ID", "")
        _own_run_id = elastic if elastic and elastic != "none" else uuid.uuid4().hex
    return _own_run_id


def _rank_and_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _nccl_version() -> Optional[str]:
    try:
        if not torch.cuda.is_available() or not dist.is_nccl_available():
            return None
        version = torch.cuda.nccl.version()
        return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:  # noqa: BLE001 - a version string is not worth failing over
        return None


def build_sidecar(trace_file: str, since_ns: Optional[int] = None, until_ns: Optional[int] = None) -> Sidecar:
    """This rank's sidecar for one trace: drains the kept collectives."""
    rank, world_size = _rank_and_world()
    return Sidecar(
        run_id=run_id(),
        rank=rank,
        world_size=world_size,
        host=socket.gethostname(),
        pid=os.getpid(),
        torch_version=torch.__version__,
        nccl_version=_nccl_version(),
        trace_file=trace_file,
        process_groups=groups.table(),
        collectives=drain(since_ns),
        captures=capture.captures_snapshot(since_ns, until_ns),
        unwatched=[UnwatchedSpan(start_ns=start, end_ns=end)
                   for start, end in unwatched(since_ns, _now_ns() if until_ns is None else until_ns)],
    )


_RECORDING = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)


def profiled_steps(prof: Any, again: bool = False) -> str:
    """The ProfilerStep numbers a trace handed over now holds, as its file names give them: "2-3", "5".

    A profiler without a schedule writes no step markers: its ``step_num``
    is used. With one, the trace is handed over either by ``step()`` leaving
    a RECORD_AND_SAVE step (the trace ends at the step before the current
    one) or by ``stop()`` (it ends at the current step); the recorded steps
    before the end are those the schedule says RECORD. Both are possible
    only when the current step records and the one before saved: ``step()``
    hands its trace over first there, so a second trace at the same step
    (``again``) is ``stop()``'s.
    """
    step = int(getattr(prof, "step_num", 0))
    schedule = getattr(prof, "schedule", None)
    if not getattr(prof, "record_steps", False) or schedule is None:
        return str(step)
    saved_before = step > 0 and schedule(step - 1) == ProfilerAction.RECORD_AND_SAVE
    last = step - 1 if saved_before and (schedule(step) not in _RECORDING or not again) else step
    first = last
    while first > 0 and schedule(first - 1) == ProfilerAction.RECORD:
        first -= 1
    return str(first) if first == last else f"{first}-{last}"


def trace_handler(dir_name: Union[str, Path]) -> Callable[[Any], None]:
    """A profiler ``on_trace_ready`` that writes this rank's trace and its sidecar into ``dir_name``.

    Files: ``rank{R}.step{S}.pt.trace.json.gz`` and ``rank{R}.step{S}.commtag.json``
    (R = global rank, S = the profiler steps the trace holds, see
    :func:`profiled_steps`), never over an existing file: a name already
    taken gets ``.2``, ``.3``, ... before the suffix (see
    :mod:`commtag.runtime.record.sidecar`). Both are written to a temporary name and
    renamed. A failure while writing either (a full disk, a directory that
    cannot be written) is logged once and does not stop training; the trace
    is written first, and without it no sidecar.
    """
    directory = Path(dir_name)
    #: Profiler -> the step_num of the last trace it handed this handler.
    handed: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def handler(prof: Any) -> None:
        rank, _ = _rank_and_world()
        # export_chrome_trace gzips when the name ends in .gz; the temporary's name keeps that suffix.
        tmp = temporary(directory / f"rank{rank}{TRACE_SUFFIX}")
        step = int(getattr(prof, "step_num", 0))
        try:
            steps = profiled_steps(prof, again=handed.get(prof) == step)
            handed[prof] = step
        except Exception as exc:  # noqa: BLE001 - a schedule we cannot ask still gets its trace written
            log_once("telling the profiled steps", exc)
            steps = str(step)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(tmp))
            trace_file = sidecar.publish_trace(tmp, rank, steps)
        except Exception as exc:  # noqa: BLE001 - never let the trace's own write stop training
            log_once("writing the trace", exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            drain()  # what it would have annotated is dropped, not kept for ever
            return
        try:
            since_ns = _trace_start_ns(prof)
            side = build_sidecar(trace_file, since_ns=since_ns)
            sidecar.write_sidecar(directory / sidecar_name_for(trace_file), side)
        except Exception as exc:  # noqa: BLE001 - never let the sidecar stop training
            log_once("writing the sidecar", exc)

    return handler


def _trace_start_ns(prof: Any) -> Optional[int]:
    """Where the trace's window begins on CLOCK_REALTIME, when the profiler says."""
    try:
        return int(prof.profiler.kineto_results.trace_start_ns())
    except Exception:  # noqa: BLE001 - older profilers: keep every entry
        return None

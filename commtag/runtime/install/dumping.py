"""commtag's flight recorder turned on and off: the ring, the idle gate held, and the signals that
write the dump (SIGTERM and SIGINT: torchrun stops the other ranks when one fails; SIGUSR1: on demand).

Signals are chained, never swallowed: after the dump the job's previous handler runs, and where
there was none the signal's default action happens as it would have (SIGTERM and SIGINT end the
process, by that signal; SIGUSR1, whose default would end it, only dumps and the job goes on); a
signal the job ignored is still ignored after its dump.
Python runs a handler only between bytecodes of the main thread, which a rank blocked inside a
collective never reaches: a watcher thread, woken through ``signal.set_wakeup_fd`` the moment the
signal arrives, writes the dump then (where the job set no wakeup fd of its own), and for a signal
whose default action was to end the process, ends it as that default would.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any, Optional

from commtag.runtime.failopen import log_once
from commtag.runtime.install.idle import less_slow, more_slow
from commtag.runtime.record import ring

#: The signals that write the dump; the first two end the process afterwards as they would have.
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUMP_SIGNALS = (*ENDING_SIGNALS, signal.SIGUSR1)

_lock = threading.Lock()
#: signal -> the handler before commtag's, while commtag's is installed.
_previous: dict[int, Any] = {}
_wakeup: Optional[tuple[int, int]] = None  # (read end, write end) of the watcher's pipe


def enable(dump_dir: Path, size: int) -> None:
    """Keep the ring and write it on a failed call, on the signals, and on :func:`dump`."""
    with _lock:
        if ring.RING is not None:
            ring.RING.dump_dir = Path(dump_dir)
            return
        ring.RING = ring.Ring(Path(dump_dir), size)
        more_slow()  # every collective takes the path that describes it, so the ring sees it
        if threading.current_thread() is threading.main_thread():
            _install_signals()


def disable() -> None:
    """Stop keeping the ring; the job's own handlers back where commtag's still are."""
    global _wakeup
    with _lock:
        if ring.RING is None:
            return
        ring.RING = None
        less_slow()
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(_previous.items()):
            if signal.getsignal(signum) is _handler:
                signal.signal(signum, previous)
            del _previous[signum]
        if _wakeup is not None:
            current = signal.set_wakeup_fd(-1)
            if current != _wakeup[1]:
                signal.set_wakeup_fd(current)  # the job's own since: it stays
            os.close(_wakeup[1])  # the watcher sees the end of its pipe and stops
            _wakeup = None


def dump(reason: str = "commtag.dump()") -> Optional[Path]:
    """Write the ring now (None where it is off or could not be written)."""
    kept = ring.RING
    return None if kept is None else kept.dump(reason)


def _install_signals() -> None:
    global _wakeup
    for signum in DUMP_SIGNALS:
        try:
            _previous[signum] = signal.signal(signum, _handler)
        except (ValueError, OSError) as exc:  # not the main thread of the main interpreter
            log_once("installing commtag's dump signal handlers", exc)
            return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        old = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except (ValueError, OSError) as exc:
        log_once("watching signals for commtag's dump", exc)
        os.close(read_end)
        os.close(write_end)
        return
    if old != -1:  # the job watches its own (asyncio): it keeps it; dumps then wait for the main thread
        signal.set_wakeup_fd(old)
        os.close(read_end)
        os.close(write_end)
        return
    _wakeup = (read_end, write_end)
    threading.Thread(target=_watch, args=(read_end,), name="commtag-dump-signals", daemon=True).start()


def _watch(read_end: int) -> None:
    """The watcher thread: dump as each signal arrives, even while the main thread is blocked."""
    try:
        while True:
            data = os.read(read_end, 64)
            if not data:
                break
            for signum in data:
                if signum in DUMP_SIGNALS:
                    _dump_for(signum)
                    if signum in ENDING_SIGNALS and _previous.get(signum) is signal.SIG_DFL:
                        _die_by(signum)
    except Exception as exc:  # noqa: BLE001 - fail open: the main thread's handler still dumps
        log_once("watching signals for commtag's dump", exc)
    finally:
        os.close(read_end)


def _dump_for(signum: int) -> None:
    kept = ring.RING
    if kept is not None:
        kept.dump(f"signal {signal.Signals(signum).name}")


def _handler(signum: int, frame: Any) -> None:
    """The main thread's handler: dump, then what the job had (the watcher may have dumped already:
    a second write replaces the file whole, and the job's handler never runs before the dump is on disk;
    a dump this thread was writing when the signal came is left to finish)."""
    _dump_for(signum)
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous is signal.SIG_DFL and signum in ENDING_SIGNALS:
        _die_by(signum)


def _die_by(signum: int) -> None:
    """End the process by ``signum``, as its default action would have."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
    else:
        _reset_c(signum)
    os.kill(os.getpid(), signum)


def _reset_c(signum: int) -> None:
    """The signal's default action, set from any thread (Python's signal.signal is main-thread only)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal(ctypes.c_int(signum), ctypes.c_void_p(0))  # SIG_DFL is 0 on Linux and macOS

"""The merge's one error type: bad input (or an output it cannot write), named by its file."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from commtag.errors import CommtagError


class MergeInputError(CommtagError):
    """Bad input: the message names the file and the problem."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


class MergeFailed(MergeInputError):
    """A merge that stopped: every distinct error of its workers, in worker order.

    One error for a single process. Under torchrun every worker raises the
    same list (each exits with the same status); ``lead`` is true on the one
    worker that should report them (worker 0).
    """

    def __init__(self, errors: Sequence[MergeInputError], lead: bool = True) -> None:
        super().__init__(errors[0].path, errors[0].problem)
        self.errors = list(errors)
        self.lead = lead

    def told(self) -> list[CommtagError]:
        """Every worker's errors, told by worker 0 alone (every worker fails alike)."""
        return list(self.errors) if self.lead else []


class Terminated(KeyboardInterrupt):
    """SIGTERM (kill, a job scheduler, torchrun stopping its workers): the merge stops as Ctrl-C
    stops it, its temporaries and the workers it started gone, rather than dying where it stood."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


@contextmanager
def sigterm_stops_cleanly() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` (main thread only: signals reach no other)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        # A merge that failed ignores SIGTERM while it tidies up and exits (torchrun stops the other
        # workers once one exits): that choice outlives this block, only our own handler is undone.
        if signal.getsignal(signal.SIGTERM) is _terminate:
            signal.signal(signal.SIGTERM, previous)

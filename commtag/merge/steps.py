"""A rank's profiler steps: which ``ProfilerStep#N`` spans its traces hold, how the merged trace
keeps them, and which step a time lies in.

Under a schedule, torch's profiler writes one ``ProfilerStep#N`` slice (a user annotation on the
thread that calls ``prof.step()``) from each step() to the next. The rank's pass keeps their spans
(:func:`step_spans`), so the impact replay can say what a late rank cost each step. The merged
trace carries them on each rank's window markers (:func:`encode`, :func:`decode`) rather than
asking its slices: a rank --detail leaves out has none written, and the summary of the merged
trace must find the steps the summary of its directory finds.
"""

from __future__ import annotations

import bisect
import re
from typing import Iterable, Optional, Sequence

from commtag.vocab import PROFILER_STEP_PREFIX

#: ``(step number, start_ns, end_ns)`` of one ``ProfilerStep#N`` slice.
StepSpan = tuple[int, int, int]

_ENCODED = re.compile(r"(\d+)@(-?\d+)\+(\d+)")


def step_spans(found: Iterable[tuple[str, int, int]]) -> list[StepSpan]:
    """The ``(name, start_ns, end_ns)`` of a file's ``ProfilerStep#`` slices as step spans, in time
    order; a name whose suffix is no step number (``ProfilerStep#x``) names no step."""
    out = []
    for name, start, end in found:
        digits = name[len(PROFILER_STEP_PREFIX):]
        if digits.isascii() and digits.isdigit():
            out.append((int(digits), start, end))
    return sorted(out, key=lambda s: (s[1], s[0]))


def encode(steps: Sequence[StepSpan], origin_ns: int) -> str:
    """``N@offset+length`` per step, ns from ``origin_ns`` (its window's start), space-separated."""
    return " ".join(f"{n}@{start - origin_ns}+{end - start}" for n, start, end in steps)


def decode(text: object, origin_ns: int) -> Optional[list[StepSpan]]:
    """What :func:`encode` wrote; None when ``text`` is not that (a file not written so)."""
    if not isinstance(text, str):
        return None
    out = []
    for part in text.split():
        match = _ENCODED.fullmatch(part)
        if match is None:
            return None
        n, offset, length = (int(g) for g in match.groups())
        out.append((n, origin_ns + offset, origin_ns + offset + length))
    return out


def in_window(steps: Sequence[StepSpan], first_ns: int, last_ns: int) -> list[StepSpan]:
    """The steps that start in the window ``[first_ns, last_ns]``."""
    return [s for s in steps if first_ns <= s[1] <= last_ns]


class StepIndex:
    """One rank's steps, asked which step a time lies in. As ``--steps`` cuts them, a step runs
    from its start to the next step's start in its window, the last step of a window to the
    window's end (``windows``: the rank's; a step in none reaches to its own end): device work
    its CPU launched late in the step, run after the step's slice ended, stays with it."""

    def __init__(self, steps: Sequence[StepSpan], windows: Sequence[tuple[int, int]] = ()) -> None:
        self.steps = sorted(steps, key=lambda s: (s[1], s[0]))
        self._starts = [s[1] for s in self.steps]
        self._reach = []
        for k, (_, start, end) in enumerate(self.steps):
            reach = next((last for first, last in windows if first <= start <= last), end)
            if k + 1 < len(self.steps) and self._starts[k + 1] <= reach:
                reach = self._starts[k + 1]  # a time at the next start is the next step's (bisect)
            self._reach.append(max(reach, end))

    def at(self, ts_ns: int) -> Optional[StepSpan]:
        k = bisect.bisect_right(self._starts, ts_ns) - 1
        return self.steps[k] if k >= 0 and ts_ns <= self._reach[k] else None

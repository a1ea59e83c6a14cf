"""SIGTERM while a merge runs stops it as Ctrl-C does; once a failed merge chose to ignore SIGTERM
(torchrun stops the other workers when one exits, and a worker tidying up must not die half-way),
that choice holds until the process exits."""

from __future__ import annotations

import os
import signal

import pytest

from commtag.merge.errors import Terminated, sigterm_stops_cleanly


def test_sigterm_inside_raises_terminated_and_the_handler_is_restored_after() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_stops_cleanly():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_failed_merges_choice_to_ignore_sigterm_outlives_the_block() -> None:
    before = signal.getsignal(signal.SIGTERM)
    try:
        with sigterm_stops_cleanly():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what workers.settle does once a worker failed
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)

"""A wrong call fails exactly as it does without commtag, and commtag says nothing about it.

Each call below is a user's mistake that torch rejects on this rank before any
message is sent (so every rank can make it without waiting for the others).
It is made on real gloo ranks without commtag, with commtag installed and idle,
and with commtag recording under the profiler: the exception's type and
message must be the same three times, and neither the ``commtag`` logger nor
stderr may carry a word from commtag.
"""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gloo_world import run_world

pytestmark = pytest.mark.slow


def _wrong_calls(rank: int) -> dict:
    """name -> a call torch rejects (each one fails on this rank alone)."""
    t = torch.ones(2)
    return {
        "group by keyword not a group": lambda: dist.all_reduce(t, group="notagroup"),
        "group by position not a group": lambda: dist.all_reduce(t, dist.ReduceOp.SUM, "notagroup"),
        "barrier on a string": lambda: dist.barrier(group="notagroup"),
        "broadcast src out of range": lambda: dist.broadcast(t, src=7),
        "reduce dst out of range": lambda: dist.reduce(t, dst=5),
        "broadcast group_src out of range": lambda: dist.broadcast(t, group_src=9),
        "all_reduce of a list": lambda: dist.all_reduce([t]),
        "all_reduce of an int": lambda: dist.all_reduce(3),
        "all_reduce unknown keyword": lambda: dist.all_reduce(t, bogus=1),
        "all_reduce no tensor, group not a group": lambda: dist.all_reduce(group="notagroup"),
        "all_reduce too many arguments": lambda: dist.all_reduce(t, dist.ReduceOp.SUM, None, False, 5),
        "all_reduce group twice": lambda: dist.all_reduce(t, dist.ReduceOp.SUM, None, group=None),
        "broadcast unknown keyword, group not a group": lambda: dist.broadcast(t, 0, bogus=1, group="notagroup"),
        "all_gather_into_tensor wrong size": lambda: dist.all_gather_into_tensor(torch.ones(3), t),
        "all_to_all_single bad splits": lambda: dist.all_to_all_single(
            torch.ones(3), torch.ones(3), output_split_sizes=[5]),
        "send to itself": lambda: dist.send(t, dst=rank),
        "recv from itself": lambda: dist.recv(t, src=rank),
        "batch of tensors, not P2POps": lambda: dist.batch_isend_irecv([t]),
    }


def _failures(rank: int) -> dict[str, tuple[str, str]]:
    out = {}
    for name, call in _wrong_calls(rank).items():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - what the user would see
            out[name] = (type(exc).__name__, str(exc))
        else:
            out[name] = ("no error", "")
    return out


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _body(rank: int, world_size: int) -> dict:
    import commtag
    from torch.profiler import ProfilerActivity, profile

    records = _Records()
    logging.getLogger("commtag").addHandler(records)
    stderr, sys.stderr = sys.stderr, io.StringIO()
    try:
        plain = _failures(rank)
        commtag.install()
        idle = _failures(rank)
        with profile(activities=[ProfilerActivity.CPU]):
            recording = _failures(rank)
        commtag.uninstall()
        captured = sys.stderr.getvalue()
    finally:
        sys.stderr = stderr
    # The ranks meet before they exit by an all_reduce, not a barrier: gloo's barrier waits on every
    # work still listed as running and rethrows a failed one's error, and the failed all_to_all's
    # work can still be listed there for a moment after its caller saw it fail (a loaded machine).
    dist.all_reduce(torch.zeros(1))
    # torch's own warnings name torch's files, whose path may contain anything (a venv named
    # after commtag): those paths are not commtag speaking.
    torch_dir = str(Path(torch.__file__).parent)
    return {"plain": plain, "idle": idle, "recording": recording, "logged": records.messages,
            "stderr": [line for line in captured.splitlines() if "commtag" in line.replace(torch_dir, "torch")]}


def test_wrong_calls_fail_as_without_commtag_and_commtag_says_nothing():
    for result in run_world(_body, 2, timeout=120):
        plain = result["plain"]
        assert all(kind != "no error" for kind, _ in plain.values()), plain
        assert result["idle"] == plain
        assert result["recording"] == plain
        assert result["logged"] == []
        assert result["stderr"] == []

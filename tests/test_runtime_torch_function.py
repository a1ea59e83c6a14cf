"""A user's __torch_function__ sees exactly the calls the job makes, with commtag or without.

commtag reads the caller's tensors to describe a recorded collective (numel,
dtype, is_complex). Those reads are no calls of the job: a TorchFunctionMode
or a tensor subclass that acts on each call it sees (logs it, counts it,
stops the profiler) must not be handed them. Otherwise a mode that stops
the profiler on its first call would stop it on commtag's ``numel`` and then
again on the collective: torch 2.11 raises "Can't disable Kineto profiler
when it's not running" there, 2.13 warns.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from gloo_world import run_world

pytestmark = pytest.mark.slow


class _Seen(TorchFunctionMode):
    """Writes down every call it is handed, then makes it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _Counted(torch.Tensor):
    """A tensor subclass that writes down the calls made on it (class-wide, per process)."""

    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", str(func)))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _collectives(rank: int, world: int) -> None:
    peer = 1 - rank
    dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.ones(2), src=0)
    dist.all_gather_into_tensor(torch.empty(2 * world), torch.ones(2))
    dist.all_to_all_single(torch.empty(4), torch.ones(4))
    dist.all_reduce(torch.ones(2).as_subclass(_Counted))
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), peer),
                                        dist.P2POp(dist.irecv, torch.zeros(2), peer)]):
        work.wait()
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
    else:
        dist.recv(torch.zeros(2), src=0)


def _seen(rank: int, world: int, out_dir: str) -> dict[str, list[str]]:
    """The calls a mode and a subclass are handed: without commtag, with it while recording, and with
    only its flight-recorder ring keeping the calls (no profiler)."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    import commtag

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor is deprecated
    seen: dict[str, list[str]] = {}
    for label in ("without", "with", "ring"):
        if label == "with":
            commtag.install()
        _Counted.calls = []
        if label == "ring":
            commtag.install(dump_dir=f"{out_dir}/ring")
            with _Seen() as mode:
                _collectives(rank, world)
            seen["ring entries"] = [str(commtag.dump())]
        else:
            with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(f"{out_dir}/{label}")):
                with _Seen() as mode:
                    _collectives(rank, world)
        seen[f"mode {label}"] = mode.calls
        seen[f"subclass {label}"] = list(_Counted.calls)
    commtag.uninstall()
    return seen


def test_a_users_mode_and_subclass_see_only_the_jobs_calls(tmp_path):
    for rank, seen in enumerate(run_world(_seen, 2, str(tmp_path))):
        assert "all_reduce" in seen["mode without"] and "all_reduce" in seen["subclass without"]
        assert seen["mode with"] == seen["mode without"], rank
        assert seen["subclass with"] == seen["subclass without"], rank
        assert seen["mode ring"] == seen["mode without"], rank
        assert seen["subclass ring"] == seen["subclass without"], rank
        assert seen["ring entries"] == [str(tmp_path / "ring" / f"commtag_fr_{rank}")]
    # commtag did record the calls it kept its reads from the mode on
    assert (tmp_path / "with" / "rank0.step0.commtag.json").exists()

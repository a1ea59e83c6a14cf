"""Faults at every commtag step inside a real gloo job: results unchanged, one warning per kind, the job finishes.

tests/test_runtime_failopen.py injects a RuntimeError into the metadata,
Seq counter, recorder, validation and sidecar-writer functions. This file
covers the remaining steps and the failures users actually meet:

* lane lookup (building a group's uid/lane on first use) raising;
* every op's metadata extraction raising a KeyError (a torch signature change);
* validation rejecting what was recorded (a real pydantic ValidationError);
* the sidecar written to a full disk (ENOSPC half-way through the write);
* the trace directory not writable at all (a real permission-denied path);
* cuda-python missing (import blocked) or failing (driver call errors, CUDA
  calls raising while a capture is open) while the job runs collectives.

Each fault runs the same collectives (plain, async, broadcast, all_gather,
p2p batch, send/recv, barrier, a subgroup) twice, under the real profiler with
commtag's trace handler, on 3 ranks. Results and return values must equal
the run without commtag; every warning is logged once.
"""

from __future__ import annotations

import errno
import logging
import os
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gloo_world import run_world

pytestmark = pytest.mark.slow

WORLD = 3
#: A directory nobody may create files in, root included (sysfs).
UNWRITABLE = Path("/sys/kernel/commtag-trace")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.messages.append(record.getMessage())


def _round(rank: int, world_size: int, pair) -> dict:
    """Collectives whose results and return values a user would check."""
    out: dict = {}
    t = torch.arange(4.0) + rank
    out["all_reduce_ret"] = dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    work = dist.all_reduce(torch.ones(2) * rank, async_op=True)
    out["async_type"] = type(work).__name__
    out["async_wait"] = work.wait()
    b = torch.full((3,), float(rank))
    out["broadcast_ret"] = dist.broadcast(b, src=2)
    out["broadcast"] = b.tolist()
    gathered = [torch.zeros(2) for _ in range(world_size)]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    out["all_gather"] = [g.tolist() for g in gathered]
    peer_to, peer_from = (rank + 1) % world_size, (rank - 1) % world_size
    recv = torch.zeros(2)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(rank)), peer_to),
                                    dist.P2POp(dist.irecv, recv, peer_from)])
    out["batch_n"] = len(works)
    for w in works:
        w.wait()
    out["batch"] = recv.tolist()
    x = torch.full((1,), 10.0 + rank)
    if rank == 0:
        dist.send(x, 1)
    elif rank == 1:
        out["recv_ret"] = dist.recv(x, 0)
    out["p2p"] = x.tolist()
    if pair is not None:
        p = torch.full((2,), float(rank + 1))
        dist.all_reduce(p, group=pair)
        out["pair"] = p.tolist()
    out["barrier_ret"] = dist.barrier()
    return out


def _profiled(out_dir: Path, body) -> None:
    import commtag
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        body()


def _full_disk_open(file, mode: str = "r", *args, **kwargs):
    """Stands in for ``open`` in :mod:`commtag.atomic`, which writes every sidecar: the disk fills up mid-write."""
    stream = open(file, mode, *args, **kwargs)
    real_write = stream.write

    def write(data) -> int:
        real_write(data[: len(data) // 2])
        stream.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    stream.write = write
    return stream


class _FailingGraphAPI:
    """cuda-python present but every driver call fails."""

    def __getattr__(self, name: str):
        def fail(*_args, **_kwargs):
            raise RuntimeError(f"cudaErrorUnknown in {name}")
        return fail


def _faults(rank: int, world_size: int, out_dir: str) -> dict:
    import commtag
    import commtag.runtime.capture as capture
    import commtag.atomic as atomic
    import commtag.runtime.failopen as failopen
    import commtag.runtime.describe.groups as groups
    import commtag.runtime.install.hooks as hooks
    import commtag.runtime.describe.metadata as metadata
    import commtag.runtime.install.grouped as grouped
    from commtag.runtime.describe.calls import CallRecord

    root = Path(out_dir)
    pair = dist.new_group([0, 1])
    pair = pair if rank < 2 else None
    results: dict = {"plain": _round(rank, world_size, pair)}
    handler = _Collect()
    logging.getLogger("commtag").addHandler(handler)
    commtag.install()

    def run(name: str) -> None:
        """Two rounds under the profiler with commtag's trace handler, logs collected for this fault."""
        failopen.reset()
        handler.messages = []
        rounds = []
        _profiled(root / f"{name}-rank{rank}", lambda: rounds.extend(_round(rank, world_size, pair) for _ in range(2)))
        results[name] = rounds
        results[name + "_logs"] = handler.messages
        where = root / f"{name}-rank{rank}"
        results[name + "_files"] = sorted(p.name for p in where.iterdir()) if where.is_dir() else None

    # Lane lookup: building a group's state (uid, lane) fails on first use.
    saved_build, saved_states = groups.build_state, dict(groups.GROUP_STATES)
    groups.GROUP_STATES.clear()
    groups.build_state = lambda pg: (_ for _ in ()).throw(RuntimeError("injected: lane lookup"))
    try:
        run("lane_lookup")
    finally:
        groups.build_state = saved_build
        groups.GROUP_STATES.update(saved_states)

    # Metadata extraction: every op's describer raises (as after a torch signature change).
    commtag.uninstall()
    saved_ops = dict(metadata.OPS)
    saved_p2p = grouped.p2p_call
    for name in metadata.OPS:
        metadata.OPS[name] = lambda *a, **k: {}["injected: metadata"]
    grouped.p2p_call = lambda *a, **k: {}["injected: p2p metadata"]
    commtag.install()
    try:
        run("metadata")
    finally:
        commtag.uninstall()
        metadata.OPS.update(saved_ops)
        grouped.p2p_call = saved_p2p
        commtag.install()

    # Validation: what was recorded does not validate (a real ValidationError at sidecar time).
    saved_fields = CallRecord.annotation_fields
    CallRecord.annotation_fields = lambda record: {**saved_fields(record), "dtype": "float32-not-a-c10-name"}
    try:
        run("validation")
    finally:
        CallRecord.annotation_fields = saved_fields

    # Sidecar write to a full disk: ENOSPC half-way through the write.
    atomic.open = _full_disk_open  # a module global shadows the builtin for write_atomic alone
    try:
        run("disk_full")
    finally:
        del atomic.open

    # The trace directory cannot be written at all (permission denied, even for root).
    failopen.reset()
    handler.messages = []
    rounds = []
    _profiled(UNWRITABLE / f"rank{rank}", lambda: rounds.extend(_round(rank, world_size, pair) for _ in range(2)))
    results["unwritable"] = rounds
    results["unwritable_logs"] = handler.messages

    # cuda-python missing: its import is blocked while CUDA looks available.
    saved_available = torch.cuda.is_available
    saved_modules = {k: sys.modules.get(k) for k in ("cuda", "cuda.bindings")}
    torch.cuda.is_available = lambda: True
    try:
        for label, module in (("cuda_missing", None), ("cuda_failing", _broken_bindings())):
            sys.modules["cuda.bindings"] = module
            failopen.reset()
            handler.messages = []
            capture.reset_tracker()  # the next capture loads the graph API again
            graph = types.SimpleNamespace()
            begin = hooks.capture_begin_hook(lambda self, *a, **k: ("captured", a))
            results[label + "_begin"] = begin(graph, "pool")
            results[label + "_tracker"] = capture.tracker() is None
            rounds = [_round(rank, world_size, pair)]
            results[label] = rounds
            results[label + "_logs"] = list(handler.messages)
    finally:
        torch.cuda.is_available = saved_available
        for key, value in saved_modules.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value

    # cuda-python failing while a capture is open: every graph query raises mid-job.
    tracker = capture.CaptureTracker(_FailingGraphAPI())
    capture.use_tracker(tracker)
    capture.OPEN_CAPTURES[7] = capture.OpenCapture(0, 7, object(), 0, 0)
    try:
        run("cuda_calls_failing")
    finally:
        capture.OPEN_CAPTURES.clear()
        capture.use_tracker(None)

    commtag.uninstall()
    results["after"] = _round(rank, world_size, pair)
    return results


def _broken_bindings() -> types.ModuleType:
    """A cuda.bindings whose driver query fails, as with a driver older than the bindings."""
    module = types.ModuleType("cuda.bindings")
    runtime = types.SimpleNamespace(
        cudaError_t=types.SimpleNamespace(cudaSuccess=0),
        cudaDriverGetVersion=lambda: (35, 0),  # cudaErrorInsufficientDriver
    )
    module.runtime = runtime
    module.driver = types.SimpleNamespace()
    return module


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if os.access(UNWRITABLE.parent, os.W_OK) and UNWRITABLE.parent.is_dir():
        probe = UNWRITABLE.parent / ".commtag-probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip(f"{UNWRITABLE.parent} is writable here")
    out = tmp_path_factory.mktemp("faults")
    return [dict(r, out=out) for r in run_world(_faults, WORLD, str(out), timeout=240)]


FAULTS = ["lane_lookup", "metadata", "validation", "disk_full", "unwritable", "cuda_missing", "cuda_failing",
          "cuda_calls_failing"]


@pytest.mark.parametrize("fault", FAULTS)
def test_collectives_unchanged_and_logged_once(results: list[dict], fault: str):
    for rank, res in enumerate(results):
        plain = res["plain"]
        # The run without commtag is itself right (so equality below means right, too).
        assert plain["all_reduce"] == [3.0, 6.0, 9.0, 12.0] and plain["broadcast"] == [2.0] * 3
        assert plain["batch"] == [float((rank - 1) % WORLD)] * 2 and plain["batch_n"] == 2
        assert plain["all_reduce_ret"] is None and plain["barrier_ret"] is None
        for got in res[fault]:
            assert got == plain, (rank, fault)
        assert res["after"] == plain
        logs = res[fault + "_logs"]
        assert logs, (rank, fault, "the fault went unnoticed")
        assert len(logs) == len(set(logs)), (rank, fault, logs)  # once per kind, not once per call


def test_each_fault_names_what_failed(results: list[dict]):
    expect = {
        "lane_lookup": "injected: lane lookup",
        "metadata": "injected: metadata",
        "validation": "validating a recorded collective failed (ValidationError",
        "disk_full": "writing the sidecar failed (OSError: [Errno 28] No space left on device",
        "unwritable": "writing the trace failed",
        "cuda_missing": "cuda-python unusable",
        "cuda_failing": "cuda-python unusable",
        "cuda_calls_failing": "capture graph failed",
    }
    for rank, res in enumerate(results):
        for fault, words in expect.items():
            assert any(words in m for m in res[fault + "_logs"]), (rank, fault, res[fault + "_logs"])
        # p2p metadata failed too, under its own kind, still once.
        assert any("injected: p2p metadata" in m for m in res["metadata_logs"]), res["metadata_logs"]


def test_files_left_by_each_fault(results: list[dict]):
    for rank, res in enumerate(results):
        trace, side = f"rank{rank}.step0.pt.trace.json.gz", f"rank{rank}.step0.commtag.json"
        # No group table without lane lookup: the trace is written, the sidecar (logged) is not.
        assert res["lane_lookup_files"] == [trace]
        # The sidecar is still written when only some annotations fail; never a temporary left behind.
        assert res["metadata_files"] == [side, trace]
        assert res["validation_files"] == [side, trace]
        assert res["cuda_calls_failing_files"] == [side, trace]
        # A full disk: the trace made it, the sidecar did not, and no half-written file remains.
        assert res["disk_full_files"] == [trace]
        # cuda-python missing or failing: the capture itself went ahead, bookkeeping off.
        for label in ("cuda_missing", "cuda_failing"):
            assert res[label + "_begin"] == ("captured", ("pool",)) and res[label + "_tracker"]
    assert not UNWRITABLE.exists()


def test_annotations_survive_the_faults_that_allow_them(results: list[dict]):
    from commtag.sidecarfile import read_sidecar

    out = results[0]["out"]
    for rank in range(WORLD):
        for fault in ("metadata", "validation"):
            # Nothing wrong is ever written: the calls that could not be described or validated are left out.
            side = read_sidecar(out / f"{fault}-rank{rank}" / f"rank{rank}.step0.commtag.json")
            assert side.collectives == [] and side.rank == rank, (fault, rank)
        # Failing CUDA graph queries only cost the capture bookkeeping: every call is still annotated.
        side = read_sidecar(out / f"cuda_calls_failing-rank{rank}" / f"rank{rank}.step0.commtag.json")
        ops = [rc.annotation.collective_name for rc in side.collectives]
        assert ops.count("allreduce") == 2 * (3 if rank < 2 else 2) and ops.count("barrier") == 2

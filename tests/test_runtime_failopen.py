"""Never harm the job: faults inside commtag leave collectives untouched, uninstall
restores the exact originals, P2POp keeps working, and training is bitwise identical."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from gloo_world import run_world
from torch_ops import delegating_ops, has

pytestmark = pytest.mark.slow

#: The collectives a user calls; those this torch has are wrapped, except the ones whose original
#: only calls another of them (read from this torch by tests/torch_ops.py): left in place, the
#: inner wrapper annotates them (torch 2.13: all_gather_into_tensor, reduce_scatter_tensor).
COLLECTIVES = [
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_single", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single", "all_to_all",
    "gather", "scatter", "barrier", "send", "recv", "batch_isend_irecv",
]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _round(rank: int, world_size: int) -> dict:
    """A few collectives whose results and return values a user would check."""
    out: dict = {}
    t = torch.arange(4.0) + rank
    out["all_reduce_ret"] = dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    work = dist.all_reduce(torch.ones(2), async_op=True)
    out["async_type"] = type(work).__name__
    work.wait()
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    gathered = torch.zeros(2 * world_size)
    dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
    out["all_gather"] = gathered.tolist()
    recv = torch.zeros(2)
    works = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.full((2,), float(rank)), 1 - rank), dist.P2POp(dist.irecv, recv, 1 - rank)]
    )
    for w in works:
        w.wait()
    out["batch"] = recv.tolist()
    try:
        dist.broadcast(torch.ones(1), src=99)  # the collective's own error
    except Exception as exc:  # noqa: BLE001 - the collective's own error, whatever its type, is compared
        out["own_error"] = (type(exc).__name__, str(exc))
    return out


def _faults(rank: int, world_size: int, out_dir: str) -> dict:
    import commtag
    import commtag.runtime.describe.groups as groups
    import commtag.runtime.describe.metadata as metadata
    import commtag.runtime.record.recorder as recorder
    import commtag.runtime.record.sidecar as sidecar
    import commtag.schema as schema
    from torch.profiler import ProfilerActivity, profile

    results = {"plain": _round(rank, world_size)}
    handler = _Collect()
    logging.getLogger("commtag").addHandler(handler)
    commtag.install()

    def boom(*_a, **_k):
        raise RuntimeError("injected fault")

    faults = {
        "metadata": (metadata, "nelems"),
        "groups": (groups.GroupState, "next_collective_seq"),
        "recorder": (recorder, "add"),
        "validation": (schema.RecordedCollective, "model_validate"),
        "sidecar": (sidecar, "write_atomic"),
    }
    for name, (owner, attr) in faults.items():
        saved = owner.__dict__.get(attr)  # None: inherited (pydantic's model_validate)
        setattr(owner, attr, classmethod(boom) if isinstance(owner, type) else boom)
        try:
            step_dir = Path(out_dir) / f"{name}-rank{rank}"
            with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(step_dir)):
                results[name] = _round(rank, world_size)
                results[name + "_again"] = _round(rank, world_size)
            results[name + "_files"] = sorted(p.name for p in step_dir.iterdir())
        finally:
            if saved is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, saved)
    results["logs"] = handler.messages
    return results


def test_faults_inside_commtag_leave_collectives_untouched(tmp_path: Path):
    for rank, res in enumerate(run_world(_faults, 2, str(tmp_path))):
        plain = res["plain"]
        assert plain["all_reduce_ret"] is None and plain["batch"] == [1.0 - rank] * 2
        for fault in ("metadata", "groups", "recorder", "validation", "sidecar"):
            assert res[fault] == plain, (rank, fault)
            assert res[fault + "_again"] == plain, (rank, fault)
            trace = f"rank{rank}.step0.pt.trace.json.gz"
            side = f"rank{rank}.step0.commtag.json"
            # The trace is always written; a failed sidecar leaves nothing half-written.
            expected = [side, trace] if fault in ("metadata", "groups", "recorder") else [trace]
            assert res[fault + "_files"] == sorted(expected), (rank, fault)
        # Logged once per kind, not once per call (each fault hit many calls in two rounds).
        logs = res["logs"]
        assert len(logs) == len(set(logs)) and sum("injected fault" in m for m in logs) >= 4
        assert any("describing a collective" in m for m in logs)
        assert any("writing the sidecar" in m for m in logs)


def _training(rank: int, world_size: int, out_dir: str) -> bool:
    import commtag
    from torch.profiler import ProfilerActivity, profile

    def train() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(4):
            x = torch.randn(5, 8, generator=gen)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
            for w in works:
                w.wait()
            for p in model.parameters():
                p.grad /= world_size
            opt.step()
            dist.broadcast(model[0].bias.data, src=0)
        return [p.detach().clone() for p in model.parameters()]

    without = train()
    commtag.install()
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        with_commtag = train()
    commtag.uninstall()
    return all(torch.equal(a, b) for a, b in zip(without, with_commtag)) and len(without) == 4


def test_training_is_bitwise_identical_with_commtag(tmp_path: Path):
    assert run_world(_training, 2, str(tmp_path)) == [True, True]
    assert (tmp_path / "rank1.step0.commtag.json").exists()


def test_uninstall_restores_the_exact_objects_and_leaves_isend_alone():
    import commtag

    present = [name for name in COLLECTIVES if has(name)]
    delegating = sorted(delegating_ops(present))
    patched = [name for name in present if name not in delegating]
    assert "all_reduce" in patched and len(patched) >= 14, patched
    before = {name: (getattr(dist, name), getattr(c10d, name)) for name in present}
    coalescing = c10d._coalescing_manager
    isend, irecv = dist.isend, dist.irecv
    threads = [threading.Thread(target=commtag.install) for _ in range(8)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert commtag.is_installed()
        for name in patched:
            assert getattr(dist, name) is getattr(c10d, name) is not before[name][0], name
            assert getattr(dist, name).__wrapped__ is not None  # functools.wraps keeps help() and signature
        for name in delegating:
            assert getattr(dist, name) is before[name][0] and getattr(c10d, name) is before[name][1], name
        assert dist.isend is isend and dist.irecv is irecv and c10d.isend is isend
        commtag.install()  # idempotent: still wraps the originals, not our wrappers
    finally:
        commtag.uninstall()
        commtag.uninstall()
    assert not commtag.is_installed()
    for name in patched:
        assert getattr(dist, name) is before[name][0] and getattr(c10d, name) is before[name][1], name
    assert c10d._coalescing_manager is coalescing


def _compiled(rank: int, world_size: int) -> tuple[list[float], int, bool]:
    """Under torch.compile the wrapper steps aside, so Dynamo sees the original collective."""
    import commtag
    from commtag.runtime.describe.groups import state_for

    commtag.install()

    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * (rank + 1)
        dist.all_reduce(y)
        return y + 1

    compiled = torch.compile(step, backend="eager")
    out = compiled(torch.ones(2))
    dist.all_reduce(torch.ones(1))  # eager
    # The Seq the next collective would take, less one: gloo counts both calls of the group.
    return out.tolist(), state_for(None).next_collective_seq() - 1, commtag.is_installed()


def test_torch_compile_traces_through_the_wrappers():
    # 1 + 2 = 3 summed over both ranks, plus one; the traced call ran on the group too, so the
    # eager one is its second call (Seq is the group's own count, not the calls commtag saw).
    assert run_world(_compiled, 2) == [([4.0, 4.0], 2, True)] * 2


@pytest.mark.parametrize("when", ["before", "after"])
def test_install_before_or_after_init(when: str, tmp_path: Path):
    assert run_world(_install_when, 2, when, str(tmp_path)) == [3, 3]


def _install_when(rank: int, world_size: int, when: str, out_dir: str) -> int:
    import commtag
    from torch.profiler import ProfilerActivity, profile

    from commtag.sidecarfile import read_sidecar

    if when == "before":
        # Re-initialise the world after install: the wrappers resolve groups lazily.
        store = dist.PrefixStore("again", c10d._get_default_store())
        dist.destroy_process_group()
        commtag.install()
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    else:
        commtag.install()
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        for _ in range(3):
            dist.all_reduce(torch.ones(1))
    side = read_sidecar(Path(out_dir) / f"rank{rank}.step0.commtag.json")
    return max(rc.annotation.seq for rc in side.collectives)

"""Which implementation runs a group, told at run time, and the record format that follows."""

from __future__ import annotations

import os
import socket

import pytest
import torch.distributed as dist

from commtag.runtime.describe import groups
from commtag.vocab import LEGACY_FORMAT, NCCL2_FORMAT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_gloo_group_is_told_by_its_backend_object_and_keeps_the_legacy_format() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        state = groups.lookup(None)
        assert state is not None
        assert set(state.backend_impls.values()) == {"gloo"} and "cpu" in state.backend_impls
        assert state.record_format == LEGACY_FORMAT and state.info().record_format == LEGACY_FORMAT
        assert state.annotation_fields["pg_desc"] == "default_pg"
    finally:
        groups.GROUP_STATES.clear()
        dist.destroy_process_group()


def test_the_format_follows_the_nccl_implementation_not_the_backend_string() -> None:
    """'nccl' names legacy ProcessGroupNCCL and ProcessGroupNCCL2 alike (docs/nccl2.md §1):
    the backend object's own name decides; a group with an nccl2 CUDA backend writes nccl2's
    format for all its calls."""
    assert groups.record_format({"cuda": "nccl"}) == LEGACY_FORMAT
    assert groups.record_format({"cuda": "nccl2"}) == NCCL2_FORMAT
    assert groups.record_format({"cuda": "nccl-lazy"}) == NCCL2_FORMAT
    assert groups.record_format({"cpu": "gloo", "cuda": "nccl2"}) == NCCL2_FORMAT
    assert groups.record_format({"cpu": "gloo"}) == LEGACY_FORMAT
    assert groups.record_format({}) == LEGACY_FORMAT


def _as_if_nccl2(rank: int, world: int, out_dir: str) -> list[tuple]:
    """A real gloo job whose default group is told to be nccl2 (what backend_impls reads from an
    nccl2 backend object, which needs a GPU), through the patched paths a job takes."""
    import dataclasses
    import warnings

    import torch
    from torch.profiler import ProfilerActivity, profile

    import commtag
    from commtag.sidecarfile import read_sidecar

    warnings.simplefilter("ignore")
    commtag.install()
    pg = dist.group.WORLD
    groups.GROUP_STATES[pg] = dataclasses.replace(groups.state_for(None), backend_impls={"cuda": "nccl2"},
                                                  record_format=NCCL2_FORMAT)
    x = torch.ones(4)
    with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(4 * world), x)
        with dist._coalescing_manager(group=pg):
            dist.all_reduce(x)
            dist.all_reduce(torch.ones(6))
        peer = 1 - rank
        ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, torch.empty(4), peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    commtag.uninstall()
    import glob

    (path,) = glob.glob(f"{out_dir}/rank{rank}.*.commtag.json")
    side = read_sidecar(path)
    assert side.process_groups[0].record_format == NCCL2_FORMAT
    return [(c.annotation.collective_name, c.annotation.in_msg_nelems, c.annotation.out_msg_nelems,
             c.annotation.in_split_size, c.annotation.out_split_size, c.annotation.seq, c.annotation.pg_desc,
             c.annotation.pg_ranks, c.annotation.send_peers, c.annotation.recv_peers) for c in side.collectives]


@pytest.mark.slow
def test_an_nccl2_group_is_annotated_in_nccl2s_format_through_every_patched_path(tmp_path) -> None:
    """docs/nccl2.md §3/§4 on the patched paths: engine names, per-tensor splits, a coalesced
    block as one record per tensor with one Seq, a batch as one batch_op_issue; no description,
    "[]" ranks. (The batch's Seq is the group's own p2p count here: a gloo group has no nccl2
    counter to read the last collective's Seq from.)"""
    from gloo_world import run_world

    results = run_world(_as_if_nccl2, 2, str(tmp_path))
    for got in results:
        assert [row[:6] for row in got] == [
            ("all_reduce", 4, 4, "[4]", "[4]", 1),
            ("allGatherSingleImpl", 4, 8, "[4]", "[8]", 2),
            ("all_reduce", 4, 4, "[4]", "[4]", 3),
            ("all_reduce", 6, 6, "[6]", "[6]", 3),
            ("batch_op_issue", 4, 4, "[4]", "[4]", 1),
        ]
        assert all(row[6] is None and row[7] == "[]" for row in got)
    # The batch names each op's global peer (nccl2 writes none): what pairs it with the peer's batch.
    assert [got[-1][8:] for got in results] == [("[1]", "[1]"), ("[0]", "[0]")]
    from commtag.merge import merge

    from merging import analysed

    analysis = analysed(merge(tmp_path, tmp_path / "merged.pftrace", jobs=1))
    batches = [m for m in analysis.collectives if m.collective == "batch_op_issue"]
    assert [sorted(m.members) for m in batches] == [[0, 1]] and not analysis.findings, analysis.findings

"""pytorch#194693 asks for collective metadata on ``batch_isend_irecv``'s work: the eager profiler
writes none (its ops launch at the group's end, after each op's scope closed:
docs/eager-metadata.md). With commtag, on a real 3-rank gloo job, every op of
every batch carries the eager keys of its own send or receive, and the merge pairs each send with
its receive. The truth is what each rank recorded it batched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gloo_world import run_world

pytestmark = pytest.mark.slow

WORLD = 3
BATCHES = 3


def _sent(src: int, dst: int, batch: int) -> int:
    """Elements rank ``src`` sends rank ``dst`` in batch ``batch``: every pair and batch differ."""
    return 8 * (1 + src) + 3 * dst + 100 * batch


def _body(rank: int, world_size: int, out_dir: str) -> list[list[tuple[str, int, int]]]:
    import torch
    import torch.distributed as dist

    import commtag

    commtag.install()
    peers = [p for p in range(world_size) if p != rank]
    done: list[list[tuple[str, int, int]]] = []
    dist.barrier()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                on_trace_ready=commtag.trace_handler(out_dir)):
        for batch in range(BATCHES):
            # A batch sends to and receives from both peers at once.
            ops, record = [], []
            for peer in peers:
                ops.append(dist.P2POp(dist.isend, torch.full((_sent(rank, peer, batch),), float(rank)), peer))
                record.append(("send", peer, _sent(rank, peer, batch)))
                ops.append(dist.P2POp(dist.irecv, torch.empty(_sent(peer, rank, batch)), peer))
                record.append(("recv", peer, _sent(peer, rank, batch)))
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            done.append(record)
    return done


@pytest.fixture(scope="module")
def batched(tmp_path_factory) -> tuple[Path, list]:
    out = tmp_path_factory.mktemp("batched")
    return out, run_world(_body, WORLD, str(out))


def test_every_batched_op_carries_its_own_metadata_and_meets_its_peer(batched):
    from commtag.report.inputs import load

    out, records = batched
    analysis, _ = load(out)
    transfers = [m for m in analysis.collectives if m.is_p2p]
    # What the ranks batched: each send, and the receive its peer posted for it.
    expected = {(rank, peer, n) for rank, batches in enumerate(records) for batch in batches
                for op, peer, n in batch if op == "send"}
    assert expected == {(peer, rank, n) for rank, batches in enumerate(records) for batch in batches
                        for op, peer, n in batch if op == "recv"}
    assert len(expected) == BATCHES * WORLD * (WORLD - 1)
    found = set()
    for m in transfers:
        ends = {inst.collective: inst for inst in m.members.values()}
        assert set(ends) == {"send", "recv"}, m.to_dict()
        send, recv = ends["send"], ends["recv"]
        # The eager keys of each end's own op: its peer, its size, its dtype; both ends agree.
        assert send.arg("Dst Rank") == recv.rank and recv.arg("Src Rank") == send.rank
        assert send.in_nelems == recv.out_nelems and send.dtype == recv.dtype == "Float"
        assert not m.findings, [f.message for f in m.findings]
        found.add((send.rank, recv.rank, send.in_nelems))
    assert found == expected
    # One p2p Seq per batch on each rank: all of a batch's ops share it, batches count up.
    for rank in range(WORLD):
        mine = sorted((i.start_ns, i.seq) for m in transfers for r, i in m.members.items() if r == rank)
        seqs = [s for _, s in mine]
        assert len(seqs) == BATCHES * 2 * (WORLD - 1)
        per_batch = [sorted(set(seqs))[b] for b in range(BATCHES)]
        assert sorted(seqs) == sorted(s for s in per_batch for _ in range(2 * (WORLD - 1)))

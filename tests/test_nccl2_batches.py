"""nccl2's batch_op_issue across ranks: one record per rank for a whole
batch_isend_irecv, with no peer and the Seq of the group's last collective (docs/nccl2.md §3,
§4). A batch pairs with its peers' batches by its own order per peer pair, never by that Seq,
and the merged trace links them as it links legacy batched p2p. Jobs from the generator
(commtag.testing.nccl2, nccl2_graph), on 2 and 4 ranks, with and without sidecars."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from commtag.merge import merge
from commtag.runtime.record.sidecar import write_sidecar
from commtag.testing.nccl2 import JobCall, JobGroup, job_trace
from commtag.testing.nccl2_graph import sidecar
from commtag.vocab import ANN_RECV_PEERS, ANN_SEND_PEERS, COLLECTIVE_NAME_KEY, NCCL2_BATCH_P2P, NCCL2_FORMAT
from pftrace_reader import read
from merging import matched

PAIR = JobGroup("0", "default_pg", (0, 1))
WORLD = JobGroup("0", "default_pg", (0, 1, 2, 3))


def _merged(tmp_path: Path, job, world: int, sidecars: bool, edit=None, jobs: int = 1):
    directory = tmp_path / "in"
    directory.mkdir(exist_ok=True)
    for rank in range(world):
        trace = job_trace(job, rank, world, NCCL2_FORMAT, skew_us=5.0 * rank)
        side = sidecar(job, rank, world, NCCL2_FORMAT, skew_us=5.0 * rank) if sidecars else None
        if edit is not None:
            edit(rank, trace, side)
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(orjson.dumps(trace)))
        if side is not None:
            write_sidecar(directory / f"rank{rank}.commtag.json", side)
    out = tmp_path / f"merged-j{jobs}.pftrace"
    return merge(directory, out, jobs=jobs), read(out)


def _batches(result) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(m.members)) for m in matched(result)
                  if {inst.collective for inst in m.members.values()} == {NCCL2_BATCH_P2P})


def _linked(parsed) -> list[tuple[int, ...]]:
    """The batch lane slices linked by flows on the merged trace: the ranks of each linked set
    (a slice linked to none is in none)."""
    slices = [s for s in parsed.slices if "commtag source" in s.args and s.args.get(COLLECTIVE_NAME_KEY) == NCCL2_BATCH_P2P]
    sets: list[set[int]] = []
    for s in slices:
        flows = set(s.flows_out + s.flows_in)
        ranks = {s.args["commtag rank"]} | {o.args["commtag rank"] for o in slices
                                           if o is not s and flows & set(o.flows_out + o.flows_in)}
        if len(ranks) > 1 and ranks not in sets:
            sets.append(ranks)
    return sorted(tuple(sorted(r)) for r in sets)


def _flowed(parsed) -> int:
    """How many batch lane slices a flow links."""
    return sum(1 for s in parsed.slices if "commtag source" in s.args
               and s.args.get(COLLECTIVE_NAME_KEY) == NCCL2_BATCH_P2P and (s.flows_out or s.flows_in))


@pytest.mark.parametrize("sidecars", [False, True], ids=["traces alone", "with sidecars"])
def test_two_ranks_batches_pair_in_order_whatever_seq_they_carry(tmp_path, sidecars: bool) -> None:
    """In a group of two a batch's peers are the other member: traces alone suffice. Each batch
    carries the last collective's Seq (the same for both batches before the all_reduce)."""
    exchange = ((0, 1), (1, 0))
    job = (JobCall(NCCL2_BATCH_P2P, PAIR, (8,), pairs=exchange), JobCall(NCCL2_BATCH_P2P, PAIR, (4,), pairs=exchange),
           JobCall("allreduce", PAIR, (8,)), JobCall(NCCL2_BATCH_P2P, PAIR, (2,), pairs=((0, 1),)))
    result, parsed = _merged(tmp_path, job, 2, sidecars)
    assert _batches(result) == [(0, 1)] * 3
    assert not result.analysis.findings, result.analysis.findings
    sizes = sorted(tuple(inst.in_nelems for _, inst in sorted(m.members.items())) for m in matched(result)
                   if m.members[0].collective == NCCL2_BATCH_P2P)
    assert sizes == [(2, 0), (4, 4), (8, 8)]  # each batch met its own peer batch, in order
    assert _linked(parsed) == [(0, 1)]


@pytest.mark.parametrize("sidecars", [False, True], ids=["traces alone", "with sidecars"])
def test_four_ranks_a_ring_is_one_batch_and_two_pair_exchanges_are_two(tmp_path, sidecars: bool) -> None:
    """On 4 ranks nccl2 names no peer: commtag's runtime records them (sidecars); from traces
    alone each batch stays alone on its rank, never paired by the Seq it carries."""
    ring = tuple((r, (r + 1) % 4) for r in range(4))
    pairs = ((0, 1), (1, 0), (2, 3), (3, 2))
    job = (JobCall("allreduce", WORLD, (8,)), JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=ring),
           JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=pairs))
    result, parsed = _merged(tmp_path, job, 4, sidecars)
    assert not result.analysis.findings, result.analysis.findings
    if sidecars:
        assert _batches(result) == [(0, 1), (0, 1, 2, 3), (2, 3)]
        ring_batch = next(m for m in matched(result) if len(m.members) == 4 and m.is_p2p)
        assert ring_batch.missing_ranks == () and ring_batch.skew_ns == 0  # timed by kernels that end together
        assert {inst.arg(ANN_SEND_PEERS) for inst in ring_batch.members.values()} == {"[1]", "[2]", "[3]", "[0]"}
        assert sorted(_linked(parsed)) == [(0, 1), (0, 1, 2, 3), (2, 3)]
    else:
        assert _batches(result) == [(r,) for r in range(4) for _ in range(2)]
        assert _linked(parsed) == []


@pytest.mark.slow
def test_merge_workers_link_the_batches_one_process_links(tmp_path) -> None:
    """Batches link across ranks (a ring joins four): under ``-j 2`` the worker owning a group's
    batches keys them all, so the flows and findings are one process's, whichever worker holds which rank."""
    ring = tuple((r, (r + 1) % 4) for r in range(4))
    pairs = ((0, 1), (1, 0), (2, 3), (3, 2))
    uneven = ((0, 1), (1, 0))
    job = (JobCall("allreduce", WORLD, (8,)), JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=ring),
           JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=pairs), JobCall(NCCL2_BATCH_P2P, WORLD, (4,), pairs=uneven))
    one, one_parsed = _merged(tmp_path, job, 4, True)
    two, two_parsed = _merged(tmp_path, job, 4, True, jobs=2)
    assert sorted(_linked(one_parsed)) == [(0, 1), (0, 1, 2, 3), (2, 3)]
    assert sorted(_linked(two_parsed)) == sorted(_linked(one_parsed))
    assert _flowed(two_parsed) == _flowed(one_parsed) == 4 + 4 + 2
    assert [(f.kind, f.pg_uid, f.seq) for f in two.analysis.findings] == [(f.kind, f.pg_uid, f.seq) for f in one.analysis.findings]


def test_a_batch_whose_peer_sends_other_sizes_is_a_size_mismatch(tmp_path) -> None:
    """Within a matched batch each rank's sends to a peer must be that peer's receives from it."""
    job = (JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=((0, 1), (1, 0))),)

    def shrink(rank: int, trace: dict, side) -> None:
        if rank == 1:
            ann = side.collectives[0].annotation
            side.collectives[0].annotation = ann.model_copy(update={"out_split_size": "[6]", "out_msg_nelems": 6})

    result, _ = _merged(tmp_path, job, 4, True, shrink)
    assert [(f.kind.value, f.ranks) for f in result.analysis.findings] == [("size_mismatch", (0, 1))]
    assert "rank 0 sends [8] elements to rank 1, which receives [6] from it" in result.analysis.findings[0].detail


def test_a_batch_whose_peer_has_no_batch_misses_that_rank(tmp_path) -> None:
    """Rank 1 of a 4-rank ring issued no batch (its record is gone): the ring's batch misses it."""
    ring = tuple((r, (r + 1) % 4) for r in range(4))
    job = (JobCall("allreduce", WORLD, (8,)), JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=ring),
           JobCall("allreduce", WORLD, (8,)))

    def drop(rank: int, trace: dict, side) -> None:
        if rank == 1:
            side.collectives = [c for c in side.collectives if c.annotation.collective_name != NCCL2_BATCH_P2P]
            gone = {e["args"]["External id"] for e in trace["traceEvents"]
                    if e["args"].get(COLLECTIVE_NAME_KEY) == NCCL2_BATCH_P2P}
            trace["traceEvents"] = [e for e in trace["traceEvents"] if e["args"].get("External id") not in gone]

    result, _ = _merged(tmp_path, job, 4, True, drop)
    ring_batch = next(m for m in matched(result) if m.is_p2p)
    assert sorted(ring_batch.members) == [0, 2, 3] and ring_batch.missing_ranks == (1,)
    assert [(f.kind.value, f.ranks) for f in result.analysis.findings] == [("missing_ranks", (1,))]
    assert {inst.arg(ANN_RECV_PEERS) for inst in ring_batch.members.values()} == {"[3]", "[1]", "[2]"}


def test_a_batch_naming_more_peers_than_its_split_sizes_is_bad_input(tmp_path: Path, capsys) -> None:
    """Rank 1's sidecar says its batch sends to two peers, its split size lists one send: which
    message went where is not known, so the sidecar is refused (one line naming it, exit 2)."""
    from commtag.cli import main

    exchange = ((0, 1), (1, 0))
    directory = tmp_path / "in"
    directory.mkdir()
    job = (JobCall(NCCL2_BATCH_P2P, WORLD, (8,), pairs=exchange),)
    for rank in range(4):
        (directory / f"rank{rank}.pt.trace.json.gz").write_bytes(
            gzip.compress(orjson.dumps(job_trace(job, rank, 4, NCCL2_FORMAT))))
        side = orjson.loads(sidecar(job, rank, 4, NCCL2_FORMAT).model_dump_json(by_alias=True, exclude_none=True))
        if rank == 1:
            annotation = side["collectives"][0]["annotation"]
            assert annotation[ANN_SEND_PEERS] == "[0]" and annotation["In split size"] == "[8]"
            annotation[ANN_SEND_PEERS] = "[0, 2]"
        (directory / f"rank{rank}.commtag.json").write_bytes(orjson.dumps(side))
    assert main(["merge", "--no-progress", str(directory), "-o", str(tmp_path / "m.pftrace")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(err) == 1 and f"{directory / 'rank1.commtag.json'}: " in err[0], err
    assert "commtag send peers: [0, 2] names 2 peers, but its split size [8] lists 1 messages" in err[0], err
    assert not (tmp_path / "m.pftrace").exists()

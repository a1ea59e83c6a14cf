"""monitored_barrier is annotated as a barrier on its group, and its inner p2p stays out.

torch runs gloo's monitored_barrier as sends and receives between group rank
0 and every other rank inside ProcessGroupGloo. Real 3-rank gloo world, two
groups (rank 2 is not in the pair and calls the pair's monitored_barrier
anyway, as torch allows): every member must number each monitored_barrier
with one collective Seq, the same on all members, the user's own send/recv
after it must still pair up with p2p Seq 1, and the merge must put it on its
group's lane without taking the gloo events of other calls (a later
barrier's ``gloo:barrier``, the inner ``gloo:send``/``gloo:recv``).
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

from merging import merge
from commtag.schema import Sidecar
from commtag.sidecarfile import read_sidecar
from gloo_world import run_world
from pftrace_reader import read

pytestmark = pytest.mark.slow


def _run(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import commtag

    commtag.install()
    try:
        pair = dist.new_group([0, 1])
        with profile(activities=[ProfilerActivity.CPU], on_trace_ready=commtag.trace_handler(out_dir)):
            t = torch.ones(4)
            dist.all_reduce(t)
            dist.monitored_barrier()
            dist.monitored_barrier(group=pair, timeout=timedelta(seconds=60), wait_all_ranks=True)
            dist.barrier()
            if rank == 0:
                dist.send(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
            if rank < 2:
                dist.all_reduce(t, group=pair)
            dist.monitored_barrier()
            dist.barrier()
    finally:
        commtag.uninstall()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("monitored")
    run_world(_run, 3, str(out), timeout=120)
    return out


def _sidecars(traces: Path) -> dict[int, Sidecar]:
    return {rank: read_sidecar(traces / f"rank{rank}.step0.commtag.json")
            for rank in range(3)}


def test_every_member_numbers_monitored_barriers_alike(traces: Path):
    calls: dict[str, dict[int, list]] = defaultdict(dict)
    for rank, side in _sidecars(traces).items():
        for c in side.collectives:
            a = c.annotation
            calls[a.pg_uid].setdefault(rank, []).append((a.collective_name, a.is_p2p, a.seq, a.p2p_pair_seq))
    world = next(uid for uid, by_rank in calls.items() if len(by_rank) == 3)
    pair = next(uid for uid in calls if uid != world)
    assert sorted(calls[pair]) == [0, 1]  # rank 2 is not in the pair: nothing recorded for it
    collectives = [(n, s) for n, p2p, s, _ in calls[world][0] if not p2p]
    assert [n for n, _ in collectives] == ["allreduce", "barrier", "barrier", "barrier", "barrier"]
    assert [s for _, s in collectives] == list(range(collectives[0][1], collectives[0][1] + 5))
    for rank in (1, 2):
        assert [(n, s) for n, p2p, s, _ in calls[world][rank] if not p2p] == collectives
    assert calls[pair][0] == calls[pair][1]
    assert [n for n, *_ in calls[pair][0]] == ["barrier", "allreduce"]
    # The user's send/recv take the group's first p2p number: the barrier's inner messages took none.
    sends = [(n, s, pair_seq) for n, p2p, s, pair_seq in calls[world][0] if p2p]
    recvs = [(n, s, pair_seq) for n, p2p, s, pair_seq in calls[world][1] if p2p]
    assert sends == [("send", 1, 1)] and recvs == [("recv", 1, 1)]


def test_the_merge_puts_them_on_their_lanes_without_taking_other_calls_events(traces: Path, tmp_path: Path):
    result = merge(traces, tmp_path / "merged.pftrace", json_dir=tmp_path / "json")
    lane = [s for s in read(result.output).slices if "commtag source" in s.args]
    members: dict[tuple, set] = defaultdict(set)
    for s in lane:
        members[(s.args["commtag pg uid"], s.args["Seq"], s.args["commtag p2p"])].add(s.args["commtag rank"])
    barriers = [s for s in lane if s.args["Collective name"] == "barrier"]
    assert len(barriers) == 3 * 4 + 2
    assert all(len(members[(s.args["commtag pg uid"], s.args["Seq"], False)]) == s.args["Group size"]
               for s in barriers)
    for rank in range(3):
        events = orjson.loads(gzip.decompress((tmp_path / "json" / f"rank{rank}.step0.pt.trace.json.gz").read_bytes()))
        slices = [e for e in events["traceEvents"] if e.get("ph") == "X"]
        seqs = defaultdict(list)
        for e in slices:
            if e["name"] in ("c10d::barrier", "c10d::monitored_barrier_", "gloo:barrier", "gloo:send", "gloo:recv"):
                seqs[e["name"]].append((e.get("args") or {}).get("Seq"))
        assert len(seqs["c10d::monitored_barrier_"]) == (3 if rank < 2 else 2)
        assert None not in seqs["c10d::monitored_barrier_"] + seqs["c10d::barrier"]
        # Each barrier's gloo event carries that barrier's own Seq, never a monitored_barrier's.
        assert sorted(s for s in seqs["gloo:barrier"]) == sorted(seqs["c10d::barrier"])
        # The inner sends and receives stay unannotated; only the user's own p2p call is.
        annotated_p2p = [s for s in seqs["gloo:send"] + seqs["gloo:recv"] if s is not None]
        assert annotated_p2p == ([1] if rank < 2 else [])

"""The analysis shared out between merge workers (commtag.merge.engine.shards) finds what one process finds.

Two workers exchange over a real :class:`FileWorld` (threads of this process, a folder between
them), each holding two of four ranks; the run has a world group (whose Seqs the two share out),
a group of each worker's own ranks, p2p transfers, stragglers, a size desync and a Seq gap. Every
instance's args and flows, every marker, counter and finding must equal a single process's, and
a worker must receive only the instances of the match parts it analyses. The slow tests merge a generated job with ``-j 1``, ``-j 2``
and torchrun and compare the files byte for byte.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from commtag.merge.analysis.analyze import MergeAnalysis, analyze, annotate, trace_annotations
from commtag.merge.engine import shards
from commtag.merge.engine.worlds import FileWorld, SoloWorld
from commtag.merge.pftrace.lanes import lane_flows
from commtag.merge.records import MATCH_PARTS, CollectiveInstance, Coverage, Interner, RankSummary, match_part
from commtag.vocab import ANN_SKEW_US, DST_RANK_KEY, RECV, SEND, SRC_RANK_KEY
from torchrun_merge import torchrun_merge

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
WORLD = (0, 1, 2, 3)
ORDERS = {"world": 0, "left": 1, "right": 2}


def _inst(rank: int, seq: int, pg: str, ranks: tuple[int, ...], start_ms: float, *, op: str = "allreduce",
          n: int = 1 << 20, p2p: bool = False, args: dict | None = None) -> CollectiveInstance:
    start = T0 + int(start_ms * MS)
    return CollectiveInstance(rank=rank, pg_uid=pg, is_p2p=p2p, seq=seq, replay=None, collective=op, in_nelems=n,
                              out_nelems=n, dtype="Float", group_size=len(ranks), group_ranks=ranks, start_ns=start,
                              end_ns=start + MS, source="gloo", lane_name=pg, args=dict(args or {}),
                              common_args={"Process Group Name": pg})


def _job() -> dict[int, list[CollectiveInstance]]:
    """Rank -> its instances, in the order a rank's trace gives them."""
    by_rank: dict[int, list[CollectiveInstance]] = {r: [] for r in WORLD}
    for seq in range(1, 13):
        late = 3 if seq in (4, 9) else 0  # rank 2 holds everyone up twice: a straggler over the noise
        for r in WORLD:
            if (seq, r) != (7, 0):  # rank 0 skipped Seq 7 of the world: a gap where the Seqs are shared out
                by_rank[r].append(_inst(r, seq, "world", WORLD, seq * 10 + (late if r == 2 else 0.01 * r)))
    for seq in range(1, 7):
        for r in (0, 1):
            n = (1 << 10) if (seq, r) == (5, 1) else 1 << 20  # a size desync on rank 1
            by_rank[r].append(_inst(r, seq, "left", (0, 1), seq * 10 + 2, n=n))
        for r in (2, 3):
            if (seq, r) != (3, 3):  # rank 3 skipped Seq 3 of its group: a gap
                by_rank[r].append(_inst(r, seq, "right", (2, 3), seq * 10 + 3))
    for k in range(1, 4):  # rank 1 sends to rank 2 over the world group
        by_rank[1].append(_inst(1, 100 + k, "world", WORLD, k * 30 + 5, op=SEND, p2p=True, args={DST_RANK_KEY: 2}))
        by_rank[2].append(_inst(2, 200 + k, "world", WORLD, k * 30 + 5.2, op=RECV, p2p=True, args={SRC_RANK_KEY: 1}))
    for insts in by_rank.values():
        insts.sort(key=lambda i: i.start_ns)
    return by_rank


def _held(by_rank: dict[int, list[CollectiveInstance]], ranks: tuple[int, ...], worker: int
          ) -> tuple[shards.Held, list[RankSummary]]:
    held = shards.Held()
    summaries = []
    for r in ranks:
        s = RankSummary(r, "host", None, [], instances=by_rank[r])
        s.count_lanes()
        summaries.append(s)
    return held, shards.hold(summaries, held, worker)


def _flow(entry: object) -> object:
    return entry if entry is None or isinstance(entry, int) else tuple(None if x is None else tuple(x) for x in entry)


def _single() -> tuple[dict[int, list[CollectiveInstance]], dict, list, list, list[str]]:
    """One process: analyze, annotate, every lane's flows (what the pipeline did alone)."""
    by_rank = _job()
    instances = [i for r in WORLD for i in by_rank[r]]
    result = analyze(instances, coverage=Coverage.unknown_windows(WORLD))
    annotate(result)
    marks = trace_annotations(result)
    flows = lane_flows(instances, ORDERS)
    return by_rank, {id(i): _flow(flows.get(id(i))) for i in instances}, marks.markers, marks.counters, \
        [f.message for f in result.findings]


def _sharded(folder: Path) -> list[tuple[dict[int, list[CollectiveInstance]], shards.Written]]:
    """Two workers, each holding two ranks, over one FileWorld folder."""
    by_rank = _job()
    halves = [_held(copy.deepcopy(by_rank), (0, 1), 0), _held(copy.deepcopy(by_rank), (2, 3), 1)]
    everyone = sorted(halves[0][1] + halves[1][1], key=lambda s: s.rank)
    out: list = [None, None]

    def work(index: int) -> None:
        held = halves[index][0]
        out[index] = (held.instances, shards.analyse(FileWorld(index, 2, folder), held, copy.deepcopy(everyone),
                                                     MergeAnalysis(), Coverage.unknown_windows(WORLD), ORDERS,
                                                     Interner()))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def test_two_workers_find_what_one_process_finds(tmp_path: Path) -> None:
    by_rank, flows, markers, counters, findings = _single()
    assert any(m.args["commtag marker"] == "straggler" for m in markers)
    assert any(m.args["commtag marker"] == "desync" for m in markers)
    assert any("seq_gap" in f and "group right" in f for f in findings)
    assert any("seq_gap" in f and "group world" in f for f in findings)
    assert any("missing_ranks" in f for f in findings) and any("size_mismatch" in f for f in findings)
    for held, written in _sharded(tmp_path / "exchange"):
        for rank, insts in held.items():
            assert [i.all_args() for i in insts] == [i.all_args() for i in by_rank[rank]]
            assert [i.pg_uid for i in insts] == [i.pg_uid for i in by_rank[rank]]
            assert [_flow(written.flows.get(id(i))) for i in insts] == [flows[id(i)] for i in by_rank[rank]]
        ranks = set(held)
        own_markers = [m for m in markers if m.rank in ranks]
        assert [(m.rank, m.ts_ns, m.name, m.args) for m in written.markers] == \
            [(m.rank, m.ts_ns, m.name, m.args) for m in own_markers]
        assert [(c.rank, c.track, sorted(c.points)) for c in written.counters] == \
            [(c.rank, c.track, sorted(c.points)) for c in counters if c.rank in ranks]
        assert [f.message for f in written.findings] == findings


def test_a_worker_receives_only_the_instances_of_the_parts_it_analyses(tmp_path: Path) -> None:
    by_rank = _job()
    halves = _sharded(tmp_path / "exchange")
    everyone = [s for half in (_held(_job(), (0, 1), 0), _held(_job(), (2, 3), 1)) for s in half[1]]
    owner = shards.Owners(everyone, 2)
    assert owner.lanes == {"left": 0, "right": 1}  # a lane one worker holds stays there, whole
    assert {owner("world", part) for part in range(-1, MATCH_PARTS)} == {0, 1}  # the world's is shared out
    for index, (_, written) in enumerate(halves):
        others = (2, 3) if index == 0 else (0, 1)
        expected = sum(1 for r in others for i in by_rank[r] if owner(i.lane_name, match_part(i)) == index)
        assert 0 < written.received == expected < sum(len(by_rank[r]) for r in others)


def test_one_worker_analyses_everything_it_holds() -> None:
    by_rank, flows, markers, _, findings = _single()
    held, everyone = _held(_job(), WORLD, 0)
    written = shards.analyse(SoloWorld(), held, everyone, MergeAnalysis(), Coverage.unknown_windows(WORLD), ORDERS,
                             Interner())
    assert written.received == 0 and written.analysis is not None
    assert [f.message for f in written.findings] == findings
    assert [(m.rank, m.ts_ns, m.name) for m in written.markers] == [(m.rank, m.ts_ns, m.name) for m in markers]


def _scaleset(directory: Path) -> None:
    made = subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", "16", "--events", "64000",
                           "--tp", "4", "--ranks-per-node", "4", "-o", str(directory)],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr


@pytest.mark.slow
def test_workers_and_torchrun_write_the_bytes_one_process_writes(tmp_path: Path) -> None:
    """A 16-rank job of 1 + 4 + 4 groups (world, tensor- and data-parallel), --detail none as at scale."""
    job = tmp_path / "job"
    _scaleset(job)
    outputs, said = {}, {}
    for name in ("j1", "j2", "j3"):
        out = outputs[name] = tmp_path / f"{name}.pftrace"
        proc = subprocess.run([sys.executable, "-m", "commtag.merge", str(job), "-o", str(out), "--detail", "none",
                               "--no-progress", "-j", name[1:]], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        said[name] = (proc.stdout.replace(name, "j1"), proc.stderr)
    out = outputs["torchrun"] = tmp_path / "torchrun.pftrace"
    proc = torchrun_merge([str(job), "-o", str(out), "--detail", "none", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = outputs["j1"].read_bytes()
    assert ANN_SKEW_US.encode() in single  # the analysis's figures are in it
    for name, path in outputs.items():
        assert path.read_bytes() == single, f"{name} wrote other bytes than -j 1"
    assert said["j2"] == said["j3"] == said["j1"]

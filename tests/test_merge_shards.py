"""The analysis shared out between merge workers (engine/shards.py) says what one process says.

Two workers over a real FileWorld (two threads, files between them) analyse a job with a
straggler, a missing member, a Seq gap, a size mismatch and p2p messages: every instance's
args and flows, every marker, counter and finding must be those of the same driver in a world
of one (one process merging alone). Each worker holds
only its share: the instances it matches at once are counted, not timed. Then the CLI: `-j 2`
and `-j 3` on a generated job read back as `-j 1`'s trace, and torchrun's 2 workers write
`-j 2`'s bytes.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

import orjson
import pytest

from commtag.merge.analysis.hook import MergeAnalysis
from commtag.merge.analysis.parts import SeqRuns, seq_runs
from commtag.merge.engine import shards
from commtag.merge.engine.exchange import addressed
from commtag.merge.engine.owned import FigureTables, run_hook
from commtag.merge.engine.routes import Carrier, unpacked
from commtag.merge.engine.worlds import FileWorld, NotSent
from commtag.merge.pftrace.readback import read_trace
from commtag.merge.errors import MergeInputError
from commtag.merge.records import CollectiveInstance, Coverage, Interner, RankSummary
from commtag.vocab import ANN_MARKER, ANN_WAIT_US
from merging import one_driver

T0 = 1_700_000_000_000_000_000
WORLD = tuple(range(8))


def _inst(rank: int, seq: int, start_us: float, *, pg: str = "0", ranks: tuple[int, ...] = WORLD,
          op: str = "allreduce", n: int = 1 << 16, p2p: bool = False, args: dict | None = None) -> CollectiveInstance:
    start = T0 + int(start_us * 1000)
    return CollectiveInstance(
        rank=rank, pg_uid=pg, is_p2p=p2p, seq=seq, replay=None, collective=op, in_nelems=n, out_nelems=n,
        dtype="Float", group_size=len(ranks), group_ranks=ranks, start_ns=start, end_ns=start + 40_000,
        source="gloo", lane_name=f"PG {pg} {list(ranks)}", args=dict(args or {}), common_args={"Process Group Name": pg},
    )


def _job() -> dict[int, list[CollectiveInstance]]:
    """8 ranks: the world group, two halves; rank 5 late to every 4th world call, rank 2 skipping
    Seq 7 of its half (a gap, and a missing member), a size mismatch, messages 0 -> 4."""
    out: dict[int, list[CollectiveInstance]] = {r: [] for r in WORLD}
    for seq in range(1, 25):
        for r in WORLD:
            late = 3000 if r == 5 and seq % 4 == 0 else 7 * r
            out[r].append(_inst(r, seq, seq * 10_000 + late))
        for half in ((0, 1, 2, 3), (4, 5, 6, 7)):
            pg = "1" if half[0] == 0 else "2"
            for r in half:
                if pg == "1" and r == 2 and seq == 7:
                    continue
                n = 1 << 10 if (pg == "2" and seq == 9 and r == 6) else 1 << 16
                out[r].append(_inst(r, seq, seq * 10_000 + 5000 + 3 * r, pg=pg, ranks=half, n=n))
    for k in range(6):
        out[0].append(_inst(0, 100 + k, 300_000 + k * 100, pg="0", op="send", p2p=True, args={"Dst Rank": 4}))
        out[4].append(_inst(4, 200 + k, 300_010 + k * 100, pg="0", op="recv", p2p=True, args={"Src Rank": 0}))
    return out


def _coverage() -> Coverage:
    return Coverage({r: [(T0, T0 + 10**12)] for r in WORLD}, 8)


def _one_process(job: dict[int, list[CollectiveInstance]]):
    """The job through the same driver in a world of one (one process merging alone)."""
    hook = MergeAnalysis()
    outcome = one_driver([inst for r in WORLD for inst in copy.deepcopy(job[r])], hook, _coverage())
    return _by_place(outcome), outcome.annotations, hook.result


def _by_place(outcome: shards.Outcome) -> dict:
    """Each instance's args and flows as its lanes writer gets them, by (rank, place among its rank's)."""
    by_place = {}
    for key in list(outcome.lanes):
        idxs = outcome.lanes.held[key][1]
        for inst, idx in zip(outcome.lanes.pop(key, []), idxs):
            by_place[(key[0], idx)] = (inst.all_args(), _flows(outcome.lanes.flows.get(id(inst))))
    return by_place


def _flows(found) -> object:
    if found is None or found.__class__ is int:
        return found
    return tuple(None if part is None else tuple(part) for part in found)


def _shared(job: dict[int, list[CollectiveInstance]], folder: Path, monkeypatch,
            budget: int | None = 0) -> list[dict]:
    """The job analysed by two workers, each holding ranks 0-3 or 4-7, over a FileWorld; each
    holds up to ``budget`` records as objects (None: all), packs the others."""
    monkeypatch.setattr(shards, "BUCKET_ROWS", 64)  # several buckets, as a big job has
    results: list[dict] = [{}, {}]

    def worker(index: int) -> None:
        world = FileWorld(index, 2, folder / "exchange", folder / "out.pftrace")
        mine = WORLD[4 * index:4 * index + 4]
        held = shards.Held(Carrier(budget))
        for r in mine:
            held.take(RankSummary(r, "host", None, [], instances=copy.deepcopy(job[r])))
        shards.settle(world, held)
        holdings = [held.records[r] for r in mine]
        hook = MergeAnalysis()
        outcome = shards.analyse(world, held, hook, _coverage(), Interner())
        results[index] = {"places": _by_place(outcome), "annotations": outcome.annotations, "result": hook.result,
                          "outcome": outcome, "mine": mine, "held": holdings}

    _on_threads(2, worker)
    return results


@pytest.mark.parametrize("budget", [0, 60, None], ids=["packed", "some-packed", "as-objects"])
def test_two_workers_analyse_the_job_as_one_process(tmp_path: Path, monkeypatch, budget: int | None) -> None:
    """Whether a worker holds its records as objects or packed (or some of each: a rank here
    has 47 to 54 records, so a bound of 60 packs all but each worker's first) changes nothing."""
    job = _job()
    places, annotations, result = _one_process(job)
    # The job has what it should: a desync and a straggler.
    assert result.desyncs and any(mk.args[ANN_MARKER] == "straggler" for mk in annotations.markers)
    shared = _shared(job, tmp_path, monkeypatch, budget)
    held_as = [[isinstance(kept, list) for kept in part["held"]] for part in shared]
    assert held_as == {0: [[False] * 4] * 2, 60: [[True, False, False, False]] * 2,
                       None: [[True] * 4] * 2}[budget]
    got = {**shared[0]["places"], **shared[1]["places"]}
    assert got == places  # every instance's figures, wait, straggler mark and flows
    for part in shared:
        mine = set(part["mine"])
        assert part["annotations"].counters == annotations.counters  # busbw of every group, the impact tracks
        # Its ranks' markers in one process's order (the lanes writer writes only its ranks').
        assert [mk for mk in part["annotations"].markers if mk.rank in mine] == \
            [mk for mk in annotations.markers if mk.rank in mine]
    lead = shared[0]["result"]
    assert [f.message for f in lead.findings] == [f.message for f in result.findings]
    assert [r.to_dict() for r in lead.impact.ranks] == [r.to_dict() for r in result.impact.ranks]
    assert shared[1]["result"] is None


def test_a_worker_holds_its_share_of_the_records(tmp_path: Path, monkeypatch) -> None:
    job = _job()
    total = sum(len(insts) for insts in job.values())
    shared = _shared(job, tmp_path, monkeypatch)
    outcomes = [part["outcome"] for part in shared]
    assert sum(o.analysed for o in outcomes) == total  # each instance matched once, by one worker
    for o in outcomes:
        assert 0 < o.analysed < total
        # Matched a bucket at a time: never more than a fraction of the job at once.
        assert o.most_at_once <= total // 4, (o.most_at_once, total)


@pytest.mark.parametrize("budget", [0, None], ids=["packed", "as-objects"])
def test_a_callers_own_hook_sees_every_rank_on_each_of_two_workers(tmp_path: Path, budget: int | None) -> None:
    """Each of two workers (ranks 0-3, 4-7) calls a caller's own hook over every rank's instances,
    rank by rank, and keeps its own ranks' with what the hook wrote into their args, held as before."""
    job = _job()
    seen: list[list[int]] = [[], []]
    kept: list[dict] = [{}, {}]
    forms: list[set[bool]] = [set(), set()]

    def worker(index: int) -> None:
        world = FileWorld(index, 2, tmp_path / "exchange", tmp_path / "out.pftrace")
        held = shards.Held(Carrier(budget))
        for r in WORLD[4 * index:4 * index + 4]:
            held.take(RankSummary(r, "host", None, [], instances=copy.deepcopy(job[r])))
        shards.settle(world, held)

        def hook(instances: list[CollectiveInstance], coverage: Coverage) -> None:
            seen[index] = [inst.rank for inst in instances]
            for inst in instances:
                inst.args["seen by"] = index

        run_hook(world, held, hook, _coverage(), Interner())
        kept[index] = {rank: [inst.args.get("seen by") for inst in unpacked(packed, Interner())]
                       for rank, packed in held.records.items()}
        forms[index] = {isinstance(packed, list) for packed in held.records.values()}

    _on_threads(2, worker)
    every = [r for r in WORLD for _ in job[r]]
    assert seen == [every, every]
    for index in range(2):
        assert kept[index] == {r: [index] * len(job[r]) for r in WORLD[4 * index:4 * index + 4]}
    assert forms == [{budget is None}] * 2


def test_keeping_the_matched_collectives_is_refused_across_workers(tmp_path: Path) -> None:
    """Kept, a worker's matched collectives would be only those it owns: a result missing the
    others', so a world of more than one refuses before any exchange."""
    # No second worker runs: were the driver to exchange, it would be told so, not wait for one.
    world = FileWorld(0, 2, tmp_path / "exchange", tmp_path / "out.pftrace", watch=lambda: "no worker 1 here")
    held = shards.Held()
    held.take(RankSummary(0, "host", None, [], instances=copy.deepcopy(_job()[0])))
    with pytest.raises(ValueError, match="world of one"):
        shards.analyse(world, held, MergeAnalysis(keep=True), _coverage(), Interner())


def test_seq_runs_say_which_seqs_each_rank_recorded_passed_and_skipped() -> None:
    """Rank 2 skipped Seq 7 of its half (group "1") between Seqs it recorded in its one window: not
    recorded but passed, and the one hole of the job, between the end of its Seq 6 and the start of its Seq 8."""
    instances = [inst for r in WORLD for inst in _job()[r]]
    runs = SeqRuns(seq_runs(instances, _coverage()), {})
    assert runs.holes() == {("1", 7, 7): {2: (T0 + 65_006_000 + 40_000, T0 + 85_006_000)}}
    for pg, ranks in (("0", WORLD), ("1", (0, 1, 2, 3)), ("2", (4, 5, 6, 7))):
        for r in WORLD:
            for seq in range(0, 27):
                member = r in ranks and 1 <= seq <= 24
                skipped = (pg, r, seq) == ("1", 2, 7)
                assert runs.recorded(pg, r, seq) == (member and not skipped), (pg, r, seq)
                assert runs.passed(pg, r, seq) == member, (pg, r, seq)


def _place(s) -> tuple:
    return s.ts, s.track, s.end, s.name, s.depth


@pytest.mark.slow
def test_workers_on_a_generated_job_write_one_process_trace(tmp_path: Path) -> None:
    job = tmp_path / "job"
    subprocess.run([sys.executable, "-m", "commtag.testing.scaleset", "--ranks", "16", "--events", "40000",
                    "--tp", "4", "-o", str(job)], check=True, capture_output=True, timeout=300)
    outs = {}
    for jobs in ("1", "2", "3"):
        outs[jobs] = tmp_path / f"j{jobs}.pftrace"
        done = subprocess.run([sys.executable, "-m", "commtag.merge", str(job), "-o", str(outs[jobs]), "-j", jobs,
                               "--no-progress"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    one = read_trace(outs["1"])
    for jobs in ("2", "3"):
        several = read_trace(outs[jobs])
        assert several.tracks == one.tracks
        assert sorted(several.slices, key=_place) == sorted(one.slices, key=_place)
    torchrun = tmp_path / "torchrun.pftrace"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "commtag.merge", str(job), "-o", str(torchrun), "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert torchrun.read_bytes() == outs["2"].read_bytes()


def test_a_world_of_one_hands_the_records_over_unpacked() -> None:
    """Alone, nothing leaves the process: the lanes writer gets the very records each rank's reading
    made, with their figures, none packed to JSON and rebuilt; the matched collectives a caller keeps
    are copies, which the lanes writer's figures do not reach."""
    job = _job()
    made = {id(inst) for insts in job.values() for inst in insts}
    hook = MergeAnalysis(keep=True)
    outcome = one_driver([inst for r in WORLD for inst in job[r]], hook, _coverage())
    written = [inst for key in list(outcome.lanes) for inst in outcome.lanes.pop(key, [])]
    assert len(written) == len(made) and {id(inst) for inst in written} == made
    waited = [inst for inst in written if ANN_WAIT_US in inst.args]
    assert waited  # the lanes writer annotated them
    assert hook.result is not None and hook.result.collectives
    kept = [inst for m in hook.result.collectives for inst in m.members.values()]
    assert kept and not any(ANN_WAIT_US in inst.args or id(inst) in made for inst in kept)


def test_exchange_rounds_are_renamed_into_place_without_an_fsync(tmp_path: Path, monkeypatch) -> None:
    """Two workers' exchange rounds arrive whole, each worker's in its place, with no fsync: the
    rounds are files only live workers of this host read, removed with their folder, and an
    fsync at every round made every worker wait on the disk."""
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    got: list[list] = [[], []]

    def worker(index: int) -> None:
        world = FileWorld(index, 2, tmp_path / "exchange", tmp_path / "out.pftrace")
        got[index] = [world.all_gather_bytes(f"{index}:{r}".encode()) for r in range(5)]

    _on_threads(2, worker)
    every = [[f"0:{r}".encode(), f"1:{r}".encode()] for r in range(5)]
    assert got == [every, every]
    assert synced == []


def _on_threads(count: int, worker: Callable[[int], None]) -> None:
    """``worker(i)`` for each of ``count`` merge workers at once, on threads; what any raised, re-raised here."""
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            worker(index)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors


def test_a_worker_parses_only_the_pieces_sent_to_it(tmp_path: Path, monkeypatch) -> None:
    """Three workers send each other worker a piece a round (worker 2 none to worker 0 in the
    first): each gets the pieces sent to it, in worker order, knows while any worker still
    sends, and parses none of the pieces sent to the others (parsing whole parts, each worker
    parsed every other worker's share too: the worker count times its own)."""
    size, filler = 3, 20_000
    parsed: dict[int, int] = {}
    real_loads = orjson.loads

    def counted(data: bytes) -> object:
        parsed[threading.get_ident()] = parsed.get(threading.get_ident(), 0) + len(data)
        return real_loads(data)

    monkeypatch.setattr(orjson, "loads", counted)
    got: list[list] = [[] for _ in range(size)]
    own: dict[int, int] = {}

    def worker(index: int) -> None:
        own[index] = threading.get_ident()
        world = FileWorld(index, size, tmp_path / "exchange", tmp_path / "out.pftrace")
        first = {w: {"from": index, "to": w, "fill": "x" * filler} for w in range(size)
                 if w != index and (index, w) != (2, 0)}
        got[index].append(addressed(world, first))
        got[index].append(addressed(world, {}))

    _on_threads(size, worker)
    for me in range(size):
        pieces, busy = got[me][0]
        senders = [w for w in range(size) if w != me and (w, me) != (2, 0)]
        assert [p["from"] if p else None for p in pieces] == [w if w in senders else None for w in range(size)]
        assert all(p["to"] == me for p in pieces if p is not None) and busy
        assert got[me][1] == ([None] * size, False)
        assert filler * len(senders) <= parsed[own[me]] < filler * (len(senders) + 1)


def test_a_worker_that_cannot_send_its_pieces_stops_every_worker(tmp_path: Path) -> None:
    """A worker whose round of pieces the disk cannot take (NotSent) sends why in its place: every
    worker, that one included, raises that error, naming the output, as every exchange does."""
    raised: dict[int, str] = {}

    class FullDisk(FileWorld):
        def _publish(self, what: str, data: bytes) -> None:
            if len(data) > 1000:  # the pieces: the error that replaces them is shorter
                raise NotSent(tmp_path / "out.pftrace", "cannot write the output: No space left on device")
            super()._publish(what, data)

    def worker(index: int) -> None:
        world = (FullDisk if index == 1 else FileWorld)(index, 3, tmp_path / "exchange", tmp_path / "out.pftrace")
        try:
            addressed(world, {w: {"fill": "x" * 2000} for w in range(3) if w != index})
        except MergeInputError as exc:
            raised[index] = str(exc)

    _on_threads(3, worker)
    assert raised == {i: f"{tmp_path / 'out.pftrace'}: cannot write the output: No space left on device"
                      for i in range(3)}


def test_equal_figures_tables_share_a_number_and_only_equal_ones_do() -> None:
    """A worker numbers each distinct figures table once (it travels, and is joined to a lane's
    args, once); tables equal as dicts but not as written (1, 1.0 and True; keys in another
    order) keep their own numbers and contents."""
    tables = FigureTables()
    first = tables.number({"skew_us": 1.5, "nodes": 1})
    assert tables.number({"skew_us": 1.5, "nodes": 1}) == first
    others = [tables.number(t) for t in ({"skew_us": 1.5, "nodes": 1.0}, {"skew_us": 1.5, "nodes": True},
                                         {"nodes": 1, "skew_us": 1.5})]
    assert sorted({first, *others}) == [0, 1, 2, 3]
    assert [[(k, type(v)) for k, v in t.items()] for t in tables] == [
        [("skew_us", float), ("nodes", int)], [("skew_us", float), ("nodes", float)],
        [("skew_us", float), ("nodes", bool)], [("nodes", int), ("skew_us", float)]]

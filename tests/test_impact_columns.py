"""The impact replay on its columns against a plain restatement of its rules, on varied jobs.

The jobs are drawn at random (seeded): groups of several sizes, members missing (incomplete
collectives), times on a coarse grain so that starts and ends tie, two profiled windows on some
ranks, profiler steps on some. The reference below replays every member of every collective
(no early stop), finds each instance's predecessor by scanning the rank's instances, and reads
the members from the matched collectives, not from columns; a sharded merge's lead, which builds
the columns from rows arriving in any order, must give the single process's result.
"""

from __future__ import annotations

import random

import pytest

from commtag.merge.engine.shards import analyze
from commtag.merge.analysis.columns import Columns
from commtag.merge.analysis.impact import MAX_REPLAYED_RANKS
from commtag.merge.analysis.impact import impact as replay_impact
from commtag.merge.analysis.parts import timed, timed_row
from commtag.merge.records import CollectiveInstance, Coverage

RANKS = 6
GROUPS = {"world": tuple(range(RANKS)), "pair01": (0, 1), "pair23": (2, 3), "half": (0, 1, 2), "half2": (3, 4, 5)}


def _job(rng: random.Random) -> tuple[list[CollectiveInstance], Coverage]:
    grain = rng.choice([1, 5, 1000])
    seqs = dict.fromkeys(GROUPS, 0)
    out, t = [], 0
    for _ in range(rng.randint(5, 40)):
        pg = rng.choice(list(GROUPS))
        seqs[pg] += 1
        t += rng.randint(0, 4) * grain
        op = rng.choice(["allreduce", "broadcast", "allgather"])
        for rank in GROUPS[pg]:
            if rng.random() < 0.1:
                continue  # not recorded: an incomplete collective
            start = t + rng.randint(0, 5) * grain
            out.append(CollectiveInstance(
                rank=rank, pg_uid=pg, is_p2p=False, seq=seqs[pg], replay=None, collective=op, in_nelems=8,
                out_nelems=8, dtype="Float", group_size=len(GROUPS[pg]), group_ranks=GROUPS[pg], start_ns=start,
                end_ns=start + rng.randint(0, 3) * grain, source="gloo", lane_name=pg, common_args={}))
    end = t + 20 * grain
    windows, steps = {}, {}
    for rank in range(RANKS):
        cut = rng.randint(0, end - 1)
        windows[rank] = [(0, cut), (cut + 1, end)] if rng.random() < 0.4 else [(0, end)]
        if rng.random() < 0.5:
            marks = sorted(rng.sample(range(end), rng.randint(1, 4)))
            steps[rank] = [(n + 1, a, b) for n, (a, b) in enumerate(zip(marks, marks[1:] + [end]))]
    return out, Coverage(windows, steps=steps)


def _reference_shifts(matched: list, coverage: Coverage, rank: int, removed: dict[int, int]) -> list[int]:
    """How much earlier each collective ends without ``rank``'s ``removed`` leads (the module's rules)."""
    nodes = [(k, r, i) for k, m in enumerate(matched)
             for r, i in sorted(m.members.items(), key=lambda item: -item[1].start_ns)]

    def window(r: int, ts: int) -> object:
        return coverage.window_of(r, ts) if len(coverage.windows.get(r, ())) > 1 else 0

    pred = []
    for n, (_, r, i) in enumerate(nodes):
        before = [(j.end_ns, j.start_ns, p) for p, (_, q, j) in enumerate(nodes)
                  if q == r and p != n and j.end_ns <= i.start_ns]
        p = max(before)[2] if before else -1
        pred.append(p if p < 0 or window(r, nodes[p][2].start_ns) == window(r, i.start_ns) else -1)
    synchronized = [m.complete and len(m.members) > 1 for m in matched]
    moved, own = [0] * len(matched), [0] * len(nodes)

    def shift(p: int) -> int:
        return 0 if p < 0 else moved[nodes[p][0]] if synchronized[nodes[p][0]] else own[p]

    for k in sorted(range(len(matched)), key=lambda k: (matched[k].last_start_ns, k)):
        mine = [n for n, node in enumerate(nodes) if node[0] == k]
        for n in mine:
            cut = removed.get(k, 0) if nodes[n][1] == rank else 0
            if cut and pred[n] >= 0:  # never before its own previous instance ends
                cut = min(cut, nodes[n][2].start_ns - nodes[pred[n]][2].end_ns)
            own[n] = shift(pred[n]) - cut
        moved[k] = max(nodes[n][2].start_ns + own[n] for n in mine) - matched[k].last_start_ns \
            if synchronized[k] else max(own[n] for n in mine)
    return moved


def _leads(matched: list, coverage: Coverage) -> dict[int, dict[int, int]]:
    """Rank -> collective -> its lead where it arrived last (a lead its own trace covers)."""
    out: dict[int, dict[int, int]] = {}
    for k, m in enumerate(matched):
        if m.complete and len(m.members) > 1 and m.last_rank is not None:
            before = max(i.start_ns for r, i in m.members.items() if r != m.last_rank)
            if m.last_start_ns > before and coverage.covers(m.last_rank, before, m.last_start_ns):
                out.setdefault(m.last_rank, {})[k] = m.last_start_ns - before
    return out


def _whole(result) -> tuple:
    return (result.profiled_ns, result.not_replayed, result.outside_steps,
            [(row.to_dict(), row.timeline, [(s.start_ns, s.end_ns) for s in row.steps]) for row in result.ranks])


@pytest.mark.parametrize("seed", range(40))
def test_the_columnar_replay_follows_the_rules_and_the_lead_matches_one_process(seed):
    rng = random.Random(seed)
    instances, coverage = _job(rng)
    analysis = analyze(instances, coverage=coverage)
    matched, result = analysis.collectives, analysis.impact
    leads = _leads(matched, coverage)
    ranked = sorted(leads, key=lambda r: (-sum(leads[r].values()), r))[:MAX_REPLAYED_RANKS]
    assert sorted(row.rank for row in result.ranks) == sorted(ranked)
    ends = [max(i.end_ns for i in m.members.values()) for m in matched]
    for row in result.ranks:
        assert (row.late_count, row.late_us) == (len(leads[row.rank]), round(sum(leads[row.rank].values()) / 1000, 3))
        moved = _reference_shifts(matched, coverage, row.rank, leads[row.rank])
        timeline = [(min(ends), 0)]
        for end, delta in sorted(zip(ends, moved)):
            if -delta != timeline[-1][1]:
                timeline.append((end, -delta))
        assert row.timeline == timeline
    # The lead: rows in the order they happen to arrive, put in one process's order by their keys.
    # Rows packed to travel between workers, and a world of one's, kept unpacked in its process.
    for travels in (True, False):
        rows = [timed_row([k, "key"], m, travels) for k, m in enumerate(matched)]
        assert all(isinstance(row[6], str) == travels for row in rows)
        rng.shuffle(rows)
        columns = Columns()
        timed(rows, columns)
        columns.into_key_order()
        assert _whole(replay_impact(columns, coverage)) == _whole(result)


def test_the_drawn_jobs_have_lateness_that_costs_and_steps():
    # The comparison above pins the replay only where ranks are replayed, some at a cost, with steps.
    costly = stepped = 0
    for seed in range(40):
        instances, coverage = _job(random.Random(seed))
        rows = analyze(instances, coverage=coverage).impact.ranks
        costly += any(row.cost_us > 0 for row in rows)
        stepped += any(row.steps for row in rows)
    assert costly >= 20 and stepped >= 10

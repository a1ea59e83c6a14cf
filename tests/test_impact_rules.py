"""The impact replay and the all-to-all matrix on hand-built instances, figures worked by hand.

The split-size texts are the eager format's (docs/eager-metadata.md: "[]" for
an even all_to_all_single, dim-0 rows otherwise, a list of more than 30 entries cut with "...");
the nccl2 rows are those of docs/nccl2.md's table (all_to_all_v_single
records "[in.numel]", allToAllSingleImpl "[in]").
"""

from __future__ import annotations

import pytest

from commtag.merge.engine.shards import analyze
from commtag.merge.records import CollectiveInstance, Coverage
from commtag.vocab import IN_SPLIT_KEY

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def inst(rank: int, seq: int, start_ms: float, end_ms: float, *, ranks: tuple[int, ...] = (0, 1, 2),
         op: str = "allreduce", pg: str = "world", n_in: int = 64, split: str | None = None) -> CollectiveInstance:
    return CollectiveInstance(
        rank=rank, pg_uid=pg, is_p2p=False, seq=seq, replay=None, collective=op, in_nelems=n_in, out_nelems=n_in,
        dtype="Float", group_size=len(ranks), group_ranks=ranks, start_ns=T0 + int(start_ms * MS),
        end_ns=T0 + int(end_ms * MS), source="gloo", lane_name=pg,
        common_args={} if split is None else {IN_SPLIT_KEY: split},
    )


def _three_steps(late_start_ms: float, second_start_ms: float) -> list[CollectiveInstance]:
    """Three world all_reduces; at the second, rank 1 arrives at ``late_start_ms``, rank 2 at
    ``second_start_ms``, rank 0 at 2 ms; each ends 1 ms after the last arrival."""
    last = max(late_start_ms, second_start_ms, 2)
    out = [inst(r, 1, 0, 1) for r in range(3)]
    out += [inst(r, 2, start, last + 1) for r, start in ((0, 2), (1, late_start_ms), (2, second_start_ms))]
    out += [inst(r, 3, last + 2, last + 3) for r in range(3)]
    return out


def test_a_late_rank_costs_its_lead_and_its_later_work_moves_with_it():
    result = analyze(_three_steps(7, 2)).impact
    (row,) = result.ranks
    assert (row.rank, row.late_count, row.late_us) == (1, 1, 5000.0)
    # Its lateness gone, the second all_reduce ends at 3 ms and the third (which waited for it) at 5.
    assert row.cost_us == 5000.0 and result.profiled_us == 10000.0 and row.share == 0.5
    assert row.by_op == {"allreduce": 5000.0}
    # The trace's track: from the second all_reduce's end on, 5 ms earlier (a point where that changes).
    assert row.timeline == [(T0 + 1 * MS, 0), (T0 + 8 * MS, 5 * MS)]


def test_a_late_rank_is_cut_only_to_the_next_latest_arrival():
    (row, *_) = analyze(_three_steps(7, 5)).impact.ranks
    assert (row.rank, row.cost_us) == (1, 2000.0)


def test_lateness_nobody_waited_for_costs_nothing():
    # Rank 0 is late to its pair's all_reduce, but the world's next all_reduce waits for rank 2's
    # long work anyway: without rank 0's lateness the window ends when it did; without rank 2's
    # (14 ms behind the next-latest), 14 ms earlier.
    pair = (0, 1)
    instances = [inst(r, 1, 0, 1) for r in range(3)]
    instances += [inst(0, 1, 4, 5, ranks=pair, pg="pair"), inst(1, 1, 2, 5, ranks=pair, pg="pair")]
    instances += [inst(r, 2, 20 if r == 2 else 6, 21) for r in range(3)]
    result = analyze(instances).impact
    assert [(r.rank, r.cost_us, r.late_us) for r in result.ranks] == [(2, 14000.0, 14000.0), (0, 0.0, 2000.0)]


def test_a_lead_outside_the_late_rank_s_own_window_is_not_its_lateness():
    coverage = Coverage({0: [(T0, T0 + 20 * MS)], 1: [(T0 + 6 * MS, T0 + 20 * MS)], 2: [(T0, T0 + 20 * MS)]})
    assert analyze(_three_steps(7, 2), coverage=coverage).impact.ranks == []


def test_each_profiled_window_has_its_own_cost():
    # Two windows (a scheduled profiler's two files per rank): rank 1 is 5 ms late in the first
    # and 1 ms late in the second.
    first = _three_steps(7, 2)
    later = [inst(r, 4 + seq, 20 + start, 20 + end) for seq, (start, end) in enumerate(((0, 1), (2, 4), (5, 6)))
             for r in range(3)]
    later = [i for i in later if not (i.seq == 5 and i.rank == 1)] + [inst(1, 5, 23, 24)]
    for i in later:
        if i.seq == 5:
            i.end_ns = T0 + 24 * MS
    windows = [(T0, T0 + 10 * MS), (T0 + 20 * MS, T0 + 26 * MS)]
    coverage = Coverage({r: windows for r in range(3)})
    (row,) = analyze(first + later, coverage=coverage).impact.ranks
    assert (row.late_count, row.late_us) == (2, 6000.0)
    # Window 1 ends 5 ms earlier; window 2 starts no earlier (nothing between the windows was
    # recorded), so it gains only its own 1 ms of lateness; the rank's cost is the sum.
    assert row.by_window == {1: 5000.0, 2: 1000.0}
    assert row.cost_us == 6000.0 and row.share == pytest.approx(6 / (10 + 6))


def test_an_incomplete_instance_moves_with_its_rank():
    instances = _three_steps(7, 2)
    # A fourth call recorded by ranks 0 and 1 only (rank 2 absent): it follows each one's own work.
    instances += [inst(r, 4, 13, 14) for r in (0, 1)]
    (row,) = analyze(instances).impact.ranks
    assert row.cost_us == 5000.0 and row.timeline[-1] == (T0 + 8 * MS, 5 * MS)
    # Without the fourth call the window ended at 10 ms; it now ends at 14, 5 ms earlier without rank 1.
    instances.pop()
    (alone,) = analyze(instances).impact.ranks
    assert alone.cost_us == 5000.0


def _a2a(op: str, splits: list[str], n_in: list[int], ranks: tuple[int, ...] = (0, 1)):
    instances = [inst(r, 1, 0, 1, ranks=ranks, op=op, n_in=n, split=s) for r, s, n in zip(ranks, splits, n_in)]
    (a,) = analyze(instances).all_to_all
    return a


def test_split_rows_become_elements_and_imbalance_is_max_over_mean():
    # Rank 0 sends 40 elements as 10 rows of 4 ([1, 9] rows), rank 1 sends 8 ([1, 1]).
    a = _a2a("all_to_allv", ["[1, 9]", "[1, 1]"], [40, 8])
    assert a.matrix == [[4, 36], [4, 4]]
    assert a.size_imbalance == pytest.approx(40 / 24)
    assert a.to_dict()["sent_bytes"] == [160, 32]


@pytest.mark.parametrize(("op", "splits"), [("all_to_allv", ["[]", "[]"]), ("allToAllSingleImpl", ["[8]", "[8]"])])
def test_an_even_split_is_known(op, splits):
    a = _a2a(op, splits, [8, 8])
    assert a.matrix == [[4, 4], [4, 4]] and a.size_imbalance == 1.0 and a.not_recorded == ""


@pytest.mark.parametrize(("op", "splits", "reason"), [
    ("all_to_all_v_single", ["[40]", "[8]"], "records only the totals"),
    ("all_to_allv", ["[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, "
                     "26, 27, 28, 29, ..., 31]", "[]"], "cut short"),
    ("all_to_allv", ["[3, 1]", "[]"], "not whole rows"),
])
def test_splits_not_recorded_are_said_never_guessed(op, splits, reason):
    a = _a2a(op, splits, [10, 8])
    assert a.matrix is None and a.size_imbalance is None and reason in a.not_recorded


def test_a_member_without_a_record_leaves_the_matrix_unknown():
    instances = [inst(0, 1, 0, 1, ranks=(0, 1), op="all_to_allv", n_in=8, split="[]")]
    (a,) = analyze(instances).all_to_all
    assert a.matrix is None and a.not_recorded == "rank 1 has no record of it"

"""Cross-rank analysis on hand-built instances: figures computed by hand, desyncs named."""

from __future__ import annotations

import pytest

from commtag.merge.analysis.analyze import bandwidth_gbps, busbw_factor
from commtag.merge.engine.shards import analyze
from commtag.merge.analysis.hook import MergeAnalysis
from commtag.merge.analysis.results import FindingKind
from commtag.merge.analysis.table import summarize
from commtag.merge.records import CollectiveInstance, Coverage
from commtag.vocab import ANN_SEQ_FROM
from merging import annotations_of, one_driver, written

MS = 1_000_000  # ns
T0 = 1_700_000_000_000_000_000


def inst(rank: int, seq: int, *, op: str = "allreduce", n_in: int = 1 << 20, n_out: int | None = None,
         dtype: str = "Float", start_us: float = 0.0, dur_us: float = 1000.0, ranks: tuple[int, ...] = (0, 1, 2, 3),
         pg: str = "pg0", p2p: bool = False, replay: int | None = None, args: dict | None = None) -> CollectiveInstance:
    start = T0 + int(start_us * 1000)
    return CollectiveInstance(
        rank=rank, pg_uid=pg, is_p2p=p2p, seq=seq, replay=replay, collective=op,
        in_nelems=n_in, out_nelems=n_in if n_out is None else n_out, dtype=dtype,
        group_size=len(ranks), group_ranks=ranks, start_ns=start, end_ns=start + int(dur_us * 1000),
        source="gloo", lane_name=f"{pg} lane", args=dict(args or {}),
    )


def world(seq: int, **kw) -> list[CollectiveInstance]:
    return [inst(r, seq, **kw) for r in range(4)]


# --- bandwidth -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "n_in", "n_out", "algbw", "busbw"),
    [
        # 1 Mi Float = 4 MiB = 4.194304 MB in 1 ms.
        ("allreduce", 1 << 20, 1 << 20, 4.194304, 4.194304 * 2 * 3 / 4),
        ("broadcast", 1 << 20, 1 << 20, 4.194304, 4.194304),
        ("reduce", 1 << 20, 1 << 20, 4.194304, 4.194304),
        # all_gather: S is the gathered output (4 x 1 Mi).
        ("_allgather_base", 1 << 20, 4 << 20, 16.777216, 16.777216 * 3 / 4),
        ("all_gather", 1 << 20, 4 << 20, 16.777216, 16.777216 * 3 / 4),
        # reduce_scatter: S is the input before splitting.
        ("_reduce_scatter_base", 4 << 20, 1 << 20, 16.777216, 16.777216 * 3 / 4),
        # all_to_all: a rank's whole send buffer.
        ("all_to_allv", 1 << 20, 1 << 20, 4.194304, 4.194304 * 3 / 4),
    ],
)
def test_bandwidth_follows_nccl_tests(op, n_in, n_out, algbw, busbw):
    analysis = analyze(world(1, op=op, n_in=n_in, n_out=n_out))
    (m,) = analysis.collectives
    assert m.bytes == max(n_in, n_out) * 4 if op != "all_to_allv" else n_in * 4
    assert m.algbw_gbps == pytest.approx(algbw)
    assert m.busbw_gbps == pytest.approx(busbw)


def test_bandwidth_uses_dtype_size_and_the_last_arrivals_duration():
    # BFloat16 halves the bytes; the late rank 2 took 0.5 ms, the others waited for it.
    members = [inst(r, 1, dtype="BFloat16", start_us=0, dur_us=3000) for r in (0, 1, 3)]
    members.append(inst(2, 1, dtype="BFloat16", start_us=2500, dur_us=500))
    (m,) = analyze(members).collectives
    assert m.bytes == (1 << 20) * 2
    assert m.transfer_ns == 500_000
    assert m.algbw_gbps == pytest.approx((1 << 21) / 0.5e-3 / 1e9)
    assert m.busbw_gbps == pytest.approx(m.algbw_gbps * 1.5)


def test_factors_at_the_edges():
    assert busbw_factor("allreduce", 1) == 0.0
    assert busbw_factor("allreduce", 8) == pytest.approx(1.75)
    assert busbw_factor("barrier", 4) is None
    assert bandwidth_gbps("allreduce", 1000, 0.0, 4) == (None, None)
    (m,) = analyze(world(1, op="barrier", n_in=0, dtype="Byte")).collectives
    assert (m.bytes, m.algbw_gbps, m.busbw_gbps) == (None, None, None)


# --- skew, waits, stragglers -----------------------------------------------------------------


def test_skew_last_rank_and_waits():
    starts = {0: 0.0, 1: 100.0, 2: 5000.0, 3: 250.0}
    members = [inst(r, 7, start_us=s, dur_us=5200 - s) for r, s in starts.items()]
    analysis = analyze(members)
    (m,) = analysis.collectives
    assert (m.first_rank, m.last_rank) == (0, 2)
    assert m.skew_ns == 5_000_000
    assert m.waits_ns == {0: 5_000_000, 1: 4_900_000, 2: 0, 3: 4_750_000}
    assert m.span_ns == 5_200_000
    assert m.straggler  # 5 ms late for a 0.2 ms transfer
    assert not m.findings
    (marker,) = analysis.markers
    assert (marker.args["commtag marker"], marker.rank, marker.ts_ns) == ("straggler", 2, members[2].start_ns)
    assert marker.name == "straggler: rank 2 5.000 ms late (allreduce Seq 7)"
    record = m.to_dict()
    assert record["last_rank"] == 2 and record["skew_us"] == 5000.0 and record["desync"] == []


def test_small_skew_is_not_a_straggler():
    members = [inst(r, 1, start_us=10.0 * r, dur_us=1000) for r in range(4)]
    analysis = analyze(members)
    assert not analysis.collectives[0].straggler
    assert analysis.markers == []


def test_the_figures_go_on_every_members_args():
    members = list(written(one_driver([inst(r, 3, start_us=2000.0 if r == 1 else 0.0, dur_us=1000) for r in range(4)],
                                      MergeAnalysis())).values())
    assert {i.arg("commtag last rank") for i in members} == {1}
    assert members[0].arg("commtag wait us") == 2000.0
    assert members[1].arg("commtag straggler") is True
    assert "commtag straggler" not in members[0].all_args()
    assert members[2].arg("commtag busbw GB/s") == pytest.approx(6.291456)
    assert members[3].arg("commtag ranks matched") == "[0, 1, 2, 3]"
    assert "commtag desync" not in members[3].all_args()


def test_busbw_counter_sums_overlapping_transfers_and_returns_to_zero():
    a = world(1, start_us=0, dur_us=1000)  # busbw 6.291456 from 0 to 1 ms
    b = world(2, start_us=500, dur_us=1000)  # overlaps from 0.5 to 1 ms
    c = [inst(r, 1, pg="pg1", ranks=(2, 3)) for r in (2, 3)]
    analysis = analyze(a + b + c)
    bw = 4.194304 * 1.5
    assert analysis.busbw["pg0"] == [
        (T0, pytest.approx(bw)),
        (T0 + 500_000, pytest.approx(2 * bw)),
        (T0 + 1_000_000, pytest.approx(bw)),
        (T0 + 1_500_000, 0.0),
    ]
    # One counter track per group, under the group's lowest rank.
    counters = {(c.rank, c.track): c.points for c in annotations_of(a + b + c).counters}
    assert set(counters) == {(0, "busbw pg0 lane (GB/s)"), (2, "busbw pg1 lane (GB/s)")}


def test_graph_replays_are_distinct_instances():
    members = [inst(r, 4, replay=k, start_us=1000.0 * k) for k in range(3) for r in range(4)]
    analysis = analyze(members)
    assert [(m.seq, m.replay) for m in analysis.collectives] == [(4, 0), (4, 1), (4, 2)]
    assert analysis.findings == []


# --- desync ----------------------------------------------------------------------------------


def _only(analysis, kind):
    found = [f for f in analysis.findings if f.kind == kind]
    assert len(found) == 1, [f.message for f in analysis.findings]
    return found[0]


def test_size_mismatch_names_the_rank_and_fields():
    members = world(5)
    members[3] = inst(3, 5, n_in=1000)
    f = _only(analyze(members), "size_mismatch")
    assert f.ranks == (3,) and f.fields == ("In msg nelems", "Out msg nelems") and f.desync
    assert "group pg0" in f.message and "Seq 5" in f.message and "ranks [3]" in f.message
    assert "1048576/1048576 on ranks [0, 1, 2]; 1000/1000 on ranks [3]" in f.message


def test_size_mismatch_names_only_the_field_that_differs():
    members = world(5, op="_allgather_base", n_in=8, n_out=32)
    members[0] = inst(0, 5, op="_allgather_base", n_in=8, n_out=33)
    found = [(f.ranks, f.fields) for f in analyze(members).findings]
    # Rank 0 differs from the others and breaks all_gather's out = in x n.
    assert found == [((0,), ("Out msg nelems",)), ((0,), ("In msg nelems", "Out msg nelems"))]


def test_dtype_mismatch():
    members = world(2)
    members[1] = inst(1, 2, dtype="BFloat16")
    f = _only(analyze(members), "dtype_mismatch")
    assert (f.ranks, f.fields, f.seq) == ((1,), ("dtype",), 2)


def test_op_mismatch_reports_the_op_and_not_the_sizes():
    members = world(9)
    members[0] = inst(0, 9, op="broadcast")
    analysis = analyze(members)
    f = _only(analysis, "op_mismatch")
    assert f.ranks == (0,) and "broadcast on ranks [0]" in f.message
    assert {x.kind for x in analysis.findings} == {"op_mismatch"}
    (m,) = analysis.collectives
    assert m.desync and m.to_dict()["desync"][0]["kind"] == "op_mismatch"


def test_missing_rank_and_its_seq_gap():
    members = world(1) + [i for i in world(2) if i.rank != 2] + world(3)
    analysis = analyze(members)
    missing = _only(analysis, "missing_ranks")
    assert (missing.ranks, missing.seq) == ((2,), 2)
    gap = _only(analysis, "seq_gap")
    assert (gap.ranks, gap.seq, gap.desync) == ((2,), 2, True)
    seq2 = next(m for m in analysis.collectives if m.seq == 2)
    assert {f.kind for f in seq2.findings} == {"missing_ranks", "seq_gap"}
    desync_markers = [mk for mk in analysis.markers if mk.args["commtag marker"] == "desync"]
    assert sorted(mk.rank for mk in desync_markers) == [0, 1, 3]
    assert all("missing_ranks" in mk.name and "Seq 2" in mk.name for mk in desync_markers)


def test_ranks_without_a_trace_are_not_blamed():
    members = [i for i in world(1) if i.rank < 2]
    assert analyze(members).findings == []
    assert _only(analyze(members, loaded_ranks=[0, 1, 2]), "missing_ranks").ranks == (2,)


def test_a_gap_every_rank_shares_is_a_warning_not_a_desync():
    analysis = analyze(world(1) + world(3))
    gap = _only(analysis, "seq_gap")
    assert not gap.desync and analysis.desyncs == []
    assert gap.message.startswith("warning seq_gap")


def test_all_gather_output_must_be_input_times_group():
    members = world(1, op="_allgather_base", n_in=10, n_out=40)
    members[2] = inst(2, 1, op="_allgather_base", n_in=10, n_out=30)
    kinds = {(f.kind, f.ranks) for f in analyze(members).findings}
    assert kinds == {("size_mismatch", (2,))}


def test_uneven_all_to_all_is_fine_but_unbalanced_totals_are_not():
    sizes = [(4, 6), (8, 2), (3, 7), (5, 5)]
    good = [inst(r, 1, op="all_to_allv", n_in=a, n_out=b) for r, (a, b) in enumerate(sizes)]
    assert analyze(good).findings == []
    bad = [inst(r, 1, op="all_to_allv", n_in=a, n_out=b + (1 if r == 0 else 0)) for r, (a, b) in enumerate(sizes)]
    f = _only(analyze(bad), "size_mismatch")
    assert f.ranks == (0, 1, 2, 3) and "send 20 elements in total but receive 21" in f.detail


# --- p2p -------------------------------------------------------------------------------------


def p2p(rank: int, seq: int, op: str, peer: int, n: int = 64, start_us: float = 0.0, dtype: str = "Float",
        pair_seq: int | None = None):
    args = {"Dst Rank" if op == "send" else "Src Rank": peer}
    if pair_seq is not None:
        args["commtag p2p pair seq"] = pair_seq
    return inst(rank, seq, op=op, n_in=n, p2p=True, start_us=start_us, dtype=dtype, args=args)


def test_p2p_pairs_by_sender_receiver_and_order_not_by_seq():
    # Rank 0 numbers its sends 1, 2, 3; each receiver counts its own receives.
    members = [
        p2p(0, 1, "send", 1), p2p(0, 2, "send", 2, start_us=10), p2p(0, 3, "send", 1, start_us=20),
        p2p(1, 1, "recv", 0, start_us=5), p2p(1, 2, "recv", 0, start_us=30), p2p(2, 1, "recv", 0, start_us=40),
    ]
    analysis = analyze(members)
    assert analysis.findings == []
    pairs = sorted((m.seq, m.ranks) for m in analysis.collectives)
    assert pairs == [(1, (0, 1)), (2, (0, 2)), (3, (0, 1))]
    assert all(m.busbw_gbps == m.algbw_gbps for m in analysis.collectives)


def test_p2p_uses_the_recorded_pair_seq():
    # The window starts after rank 1's first receive: counting would pair send 2 with recv 3.
    members = [p2p(0, 5, "send", 1, pair_seq=2, n=8), p2p(0, 6, "send", 1, pair_seq=3, n=16),
               p2p(1, 4, "recv", 0, pair_seq=2, n=8), p2p(1, 5, "recv", 0, pair_seq=3, n=16)]
    analysis = analyze(members)
    assert analysis.findings == []
    assert sorted((m.seq, m.bytes) for m in analysis.collectives) == [(5, 32), (6, 64)]


def test_p2p_size_dtype_and_missing_receiver():
    members = [p2p(0, 1, "send", 1, n=64), p2p(1, 1, "recv", 0, n=32, dtype="Half"), p2p(0, 2, "send", 3)]
    kinds = sorted((f.kind, f.ranks) for f in analyze(members, loaded_ranks=range(4)).findings)
    assert kinds == [("dtype_mismatch", (0, 1)), ("missing_ranks", (3,)), ("size_mismatch", (0, 1))]
    # Without rank 3's trace, its missing receive is not a desync.
    assert "missing_ranks" not in {f.kind for f in analyze(members).findings}


# --- summary table ---------------------------------------------------------------------------


def test_summary_rows_per_group_and_op():
    late = [inst(r, 2, start_us=3000.0 if r == 3 else 0.0, dur_us=1000 if r == 3 else 4000) for r in range(4)]
    members = world(1) + late + world(3, op="broadcast") + [inst(r, 1, pg="pg1", ranks=(0, 2)) for r in (0, 2)]
    rows = {(g.pg_uid, g.collective): g for g in summarize(analyze(members))}
    ar = rows[("pg0", "allreduce")]
    assert (ar.count, ar.bytes, ar.skew_max_us, ar.skew_p50_us) == (2, 2 * 4 * (1 << 20), 3000.0, 1500.0)
    assert ar.total_time_us == pytest.approx(1000 + (3 * 4000 + 1000) / 4)
    assert ar.stragglers == {3: 1}
    assert ar.busbw_p50_gbps == pytest.approx(6.291, rel=1e-3)
    assert rows[("pg0", "broadcast")].count == 1
    assert rows[("pg1", "allreduce")].busbw_p50_gbps == pytest.approx(4.194, rel=1e-3)  # n=2: factor 1


def test_a_graph_replay_after_a_ranks_window_is_not_its_desync():
    from commtag.merge.records import Coverage

    # Replay 0 at 0 ms on all ranks; replay 1 at 50 ms, after rank 1's trace ended at 10 ms.
    members = [inst(r, 4, replay=0, dur_us=1000) for r in range(4)]
    members += [inst(r, 4, replay=1, start_us=50_000, dur_us=1000) for r in (0, 2, 3)]
    windows = {r: [(T0, T0 + 100 * MS)] for r in (0, 2, 3)} | {1: [(T0, T0 + 10 * MS)]}
    analysis = analyze(members, coverage=Coverage(windows, 4))
    assert analysis.desyncs == []
    late = next(m for m in analysis.collectives if m.replay == 1)
    assert late.missing_ranks == (1,) and late.skew_ns is None and late.busbw_gbps is None


def _late(seq: int, rank: int, skew_us: float) -> list[CollectiveInstance]:
    """One all_reduce where ``rank`` arrives ``skew_us`` after the others and takes 0.1 ms."""
    return [inst(r, seq, start_us=skew_us if r == rank else 0.0,
                 dur_us=100.0 if r == rank else skew_us + 100.0) for r in range(4)]


def test_stragglers_stand_out_of_the_runs_noise():
    # Jitter of 1.5-2 ms, each time on another rank; then rank 1 is 5 ms late (noise) and 100 ms late.
    members = [i for s in range(1, 21) for i in _late(s, s % 3, 1500.0 + 25 * s)]
    members += _late(21, 1, 5000.0) + _late(22, 1, 100_000.0)
    named = [(m.seq, m.last_rank) for m in analyze(members).collectives if m.straggler]
    assert named == [(22, 1)]


def test_a_rank_late_to_every_collective_is_named_every_time():
    members = [i for s in range(1, 11) for i in _late(s, 3, 5000.0)]
    assert all(m.straggler and m.last_rank == 3 for m in analyze(members).collectives)


def test_kernels_paired_only_by_their_order_never_name_a_straggler():
    # NCCL kernels without metadata are paired across ranks by their order on each rank (a
    # guess): the lead is measured, but no rank is blamed for it.
    inferred = {"commtag inferred": "collective from the kernel name; group unknown; Seq = order on this rank"}
    members = [i for s in range(1, 11) for i in _late(s, 3, 5000.0)]
    for i in members:
        i.args.update(inferred)
    matched = analyze(members).collectives
    assert [m.skew_ns for m in matched] == [5_000_000] * 10
    assert not any(m.straggler for m in matched)


def test_the_summary_header_reads_as_a_sentence():
    from commtag.report import tables as report

    one = report.to_text(analyze([inst(0, 1, ranks=(0,))]))
    assert one.splitlines()[0] == "1 collective on 1 rank, 1 process group, 0 desyncs"
    two = report.to_text(analyze(world(1) + world(2, pg="pg1")))
    assert two.splitlines()[0] == "2 collectives on 4 ranks, 2 process groups, 0 desyncs"


class _WalkedRanks(tuple):
    """A group's member list (shared by its instances, as the merge interns it) that counts its walks."""

    walks = 0

    def __iter__(self):
        self.walks += 1
        return super().__iter__()


def test_a_groups_member_list_is_walked_per_collective_not_per_member():
    """The expected members of a collective come from its group's one rank list: walking it once
    per member made the analysis group size squared per collective (a 1,024-rank world group: 1 M
    set inserts per call, 3 of the 1,024-rank benchmark's 4 s of analysis; minutes at 16 k ranks)."""
    from commtag.merge.analysis.analyze import measure
    from commtag.merge.analysis.checks import check
    from commtag.merge.analysis.parts import SeqRuns

    ranks = _WalkedRanks(range(64))
    members = [inst(r, 1, ranks=ranks) for r in range(64) if r != 5]  # rank 5 never joined
    # Measured and checked as the merge's driver does once it has matched them (no Seq runs needed here).
    matched = measure(members, Coverage.unknown_windows(range(64)), SeqRuns([], {}))
    assert [f.ranks for f in check(matched) if f.kind == FindingKind.MISSING_RANKS] == [(5,)]
    assert ranks.walks <= 2, f"the 64-rank list was walked {ranks.walks} times for one collective of 63 members"


def test_a_seq_numbered_by_kernel_order_never_meets_a_recorded_calls_seq():
    """A torch that writes no Seq on kernels: a kernel no record claimed (a functional collective) is
    numbered by kernel order, from 1, beside recorded calls of the same group whose real Seqs start at 1
    too. Each must match its own kind across ranks: two complete collectives, not one of four members."""
    recorded = world(1, op="allreduce", n_in=1024)
    numbered = world(1, op="allgather", n_in=8, start_us=5000.0, args={ANN_SEQ_FROM: "kernel order"})
    analysis = analyze(recorded + numbered)
    got = sorted((m.collective, sorted(m.members), not m.missing_ranks) for m in analysis.collectives)
    assert got == [("allgather", [0, 1, 2, 3], True), ("allreduce", [0, 1, 2, 3], True)]
    assert not analysis.findings, [f.message for f in analysis.findings]


def test_a_finding_kind_is_one_of_the_enum_and_prints_as_its_name() -> None:
    members = world(9)
    members[0] = inst(0, 9, op="broadcast")
    found = analyze(members).findings
    assert found and all(isinstance(f.kind, FindingKind) for f in found)
    assert {f.kind for f in found} == {FindingKind.OP_MISMATCH}
    assert f"{FindingKind.OP_MISMATCH}" == "op_mismatch" == found[0].to_dict()["kind"]
    assert found[0].message.startswith("desync op_mismatch in ")

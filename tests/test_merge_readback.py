"""Reading a merged trace back gives the records the merge analyzed.

``commtag summary`` on a merged .pftrace rebuilds each collective from its lane
slice's annotations; the merge built the same record from the rank's events.
Both read the eager keys through one builder
(:meth:`commtag.merge.records.CollectiveInstance.from_args`), so a count that a
trace wrote as something other than a number reads alike on both sides.
"""

from __future__ import annotations

import io
from pathlib import Path

from commtag.merge.pftrace import writer
from commtag.merge.pftrace.lanes import LanesWriter
from commtag.merge.pftrace.readback import read_merged
from commtag.merge.records import CollectiveInstance, Interner
from commtag.merge.timeline import RankTimeline
from merging import one_driver
from commtag.vocab import (
    ANN_LANE, ANN_LANE_ID, ANN_PG_UID, ANN_RANK, COLLECTIVE_NAME_KEY, DTYPE_KEY, GROUP_SIZE_KEY, IN_NELEMS_KEY,
    OUT_NELEMS_KEY, PG_RANKS_KEY, SEQ_KEY,
)

T0 = 1_700_000_000_000_000_000


def test_readback_reads_each_lane_slice_as_the_merge_read_its_event(tmp_path: Path) -> None:
    """A count written as text or null (here In msg nelems and Group size) is what the analysis
    took it as, not a reason to drop the collective from the summary."""
    eager = {COLLECTIVE_NAME_KEY: "allreduce", IN_NELEMS_KEY: "n/a", OUT_NELEMS_KEY: 64, DTYPE_KEY: "Float",
             GROUP_SIZE_KEY: None, PG_RANKS_KEY: "[0, 1]", ANN_PG_UID: "0:abc", ANN_LANE: "PG 0 [0, 1]",
             ANN_LANE_ID: 60}
    interner = Interner()
    common = interner.with_source(interner.common(eager), "gloo")
    # What commtag.merge.rank.attach made of the two ranks' events (the analysis read these counts).
    merged = [CollectiveInstance(rank=rank, pg_uid="0:abc", is_p2p=False, seq=3, replay=None, collective="allreduce",
                                 in_nelems=0, out_nelems=64, dtype="Float", group_size=2, group_ranks=(0, 1),
                                 start_ns=T0 + 1000 * (rank + 1), end_ns=T0 + 50_000, source="gloo",
                                 lane_name="PG 0 [0, 1]", args={SEQ_KEY: 3, ANN_RANK: rank}, lane_id=60,
                                 common_args=common)
              for rank in (0, 1)]

    buf = io.BytesIO()
    buf.write(writer.header(T0))
    for rank in (0, 1):
        writer.write_rank(buf, RankTimeline(rank=rank, process_name=f"rank {rank}", tracks=[]))
    own = one_driver(merged).lanes
    LanesWriter().write(buf, {rank: [("PG 0 [0, 1]", 0)] for rank in (0, 1)}, own, own.flows, {})
    path = tmp_path / "merged.pftrace"
    path.write_bytes(buf.getvalue())

    read, _, _ = read_merged(path)
    fields = ("rank", "pg_uid", "seq", "collective", "in_nelems", "out_nelems", "dtype", "group_size",
              "group_ranks", "lane_name", "lane_id", "start_ns", "end_ns", "source")
    assert [tuple(getattr(i, f) for f in fields) for i in read] == [
        tuple(getattr(i, f) for f in fields) for i in merged]
    # The merge's builder makes these records from the same keys.
    assert [CollectiveInstance.from_args(common, rank=i.rank, seq=3, replay=None, group_ranks=(0, 1),
                                         start_ns=i.start_ns, end_ns=i.end_ns, source="gloo", own=i.args,
                                         common_args=common) for i in merged] == merged

"""Each collective of a group whose CUDA-graph replays ran gets its own place in the ring's dump,
whatever two threads do at once: one thread takes a Seq for an eager call while another counts a
replay on the same group, and the eager call is kept before or after the replay. The ring's own
classes, one group counted by commtag (neither NCCL nor gloo: its Seq is commtag's counter), the
two threads' steps taken in each order by one thread, so each interleaving is the same every run."""

from __future__ import annotations

from pathlib import Path

from commtag.runtime.describe.calls import OpCall
from commtag.runtime.describe.groups import GroupState
from commtag.runtime.install.inflight import ThreadState
from commtag.runtime.record.ring import Replayed, Ring, dump_document
from commtag.vocab import flight_recorder as fr


def _group() -> GroupState:
    return GroupState(uid="0:t", name="0", desc="default_pg", ranks=[0, 1], ranks_text="[0, 1]", size=2,
                      group_rank=0, global_rank_start=0, global_rank_stride=1, backend="fake", lane_id=60,
                      lane_name="PG 0", generation=0)


def _places(ring: Ring) -> list[int]:
    doc = dump_document(list(ring.slots), "test", 0, ring.size,
                        {name: state.replayed for name, state in ring.replay_groups.items()})
    return [entry[fr.E_SEQ] for entry in doc[fr.FR_ENTRIES]]


def _run(tmp_path: Path, steps: str) -> list[int]:
    """``steps``: "e" an eager call numbered and kept at once, "t" a Seq taken, "k" the taken call
    kept, "r" a replay of the captured call (capture Seq 1) counted and kept at once; "c" a replay
    counted (it reads the group's latest Seq), "a" the counted replay kept: what
    :meth:`Ring.replay_started` does, with the other thread's steps between."""
    state = _group()
    call = OpCall("all_reduce", state, 4, 4, "Float", 0)
    thread = ThreadState()
    ring = Ring(tmp_path, 16)
    taken = None
    counted = None
    for step in steps:
        if step in "et":
            taken = state.next_collective_seq()
        if step in "ek":
            assert taken is not None
            ring.keep(call, taken, thread)
        if step == "r":
            ring.replay_started([(call, 1)], 0, thread)
        if step == "c":
            ring.replay_groups[state.name] = state
            counted = Replayed(next(ring.ids), call, 1, 0, thread)
        if step == "a":
            assert counted is not None
            ring.slots.append(counted)
    return _places(ring)


def test_a_seq_taken_before_a_replay_and_kept_after_it_has_its_own_place(tmp_path: Path) -> None:
    # The replay reads Seq 2 as the group's latest; the call numbered 2 is kept after it.
    assert _run(tmp_path, "etrk") == [1, 2, 3]


def test_a_replay_that_read_a_seq_older_than_a_call_kept_before_it_has_its_own_place(tmp_path: Path) -> None:
    # The replay reads Seq 1; the call numbered 2 is taken and kept before the replay is kept.
    assert _run(tmp_path, "ectka") == [1, 2, 3]


def test_places_without_a_race_are_seq_plus_replays_before(tmp_path: Path) -> None:
    assert _run(tmp_path, "errer") == [1, 2, 3, 4, 5]


def test_a_replay_whose_eager_call_before_it_left_the_ring_stays_below_the_next_one(tmp_path: Path) -> None:
    state = _group()
    call = OpCall("all_reduce", state, 4, 4, "Float", 0)
    thread = ThreadState()
    ring = Ring(tmp_path, 2)  # holds the last two calls only
    ring.keep(call, state.next_collective_seq(), thread)  # Seq 1, dropped later
    taken = state.next_collective_seq()  # Seq 2 taken ...
    ring.replay_started([(call, 1)], 0, thread)  # ... the replay reads 2 as the latest ...
    ring.keep(call, taken, thread)  # ... and the call numbered 2 is kept after it
    places = _places(ring)
    assert len(set(places)) == 2 and places[0] < places[1], places

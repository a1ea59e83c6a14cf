"""nccl2's batched p2p across ranks: one ``batch_op_issue`` per rank and ``batch_isend_irecv``.

nccl2 writes one record for a whole batch (docs/nccl2.md §3): its sends' and receives'
sizes, no peer, and the Seq of the group's last collective (§4), which is no identity. A batch
names its peers only through commtag (``"commtag send peers"`` / ``"commtag recv peers"``:
the runtime records them; in a group of two they are the other member, see
:func:`commtag.merge.rank.events.mark_nccl2`). Batches pair as the p2p in them do, by their own
order per peer pair: the k-th batch of rank a that talks to b is the k-th batch of b that talks
to a (p2p between two ranks runs in order, as MPI's messages do). The batches so linked, across
the group, are one matched instance: a ring exchange of four ranks is one, two pair exchanges
in one call are two. A batch whose peers are not known stays alone on its rank.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional, Protocol, Sequence

from commtag.constants import parse_rank_list
from commtag.vocab import ANN_CROSS_RANK, ANN_RECV_PEERS, ANN_SEND_PEERS, IN_SPLIT_KEY, NCCL2_BATCH_P2P, OUT_SPLIT_KEY


#: The first item of a matched batch's key (:func:`batch_keys`).
BATCH_KEY = "batch"
#: A batch's key while it travels to the merge worker keying every batch of its group and replay.
BATCHES_OF = ("batches of",)


class Batch(Protocol):
    """What this module reads of a :class:`commtag.merge.records.CollectiveInstance`."""

    rank: int
    pg_uid: str
    replay: Optional[int]
    collective: str
    start_ns: int
    seq: int

    def arg(self, key: str, default: object = None) -> object: ...


def is_batch(inst: Batch) -> bool:
    return inst.collective == NCCL2_BATCH_P2P


def counts(text: object) -> Optional[list[int]]:
    """The numbers of a list string ("[]" is none); None when it is cut short or no such list."""
    if text == "[]":
        return []
    try:
        return parse_rank_list(text) if isinstance(text, str) and text.startswith("[") else None
    except ValueError:
        return None


def peers(inst: Batch) -> Optional[tuple[list[int], list[int]]]:
    """(the peer of each send, of each receive), global ranks; None when not known."""
    sends, recvs = counts(inst.arg(ANN_SEND_PEERS)), counts(inst.arg(ANN_RECV_PEERS))
    return None if sends is None or recvs is None else (sends, recvs)


def _sizes(inst: Batch) -> tuple[list[int], list[int]]:
    return counts(inst.arg(IN_SPLIT_KEY)) or [], counts(inst.arg(OUT_SPLIT_KEY)) or []


def batch_keys(instances: Sequence[Batch]) -> dict[int, tuple]:
    """id(batch) -> the key of the matched instance it is part of (see the module docstring)."""
    known = [inst for inst in instances
             if is_batch(inst) and inst.arg(ANN_CROSS_RANK) is not False and peers(inst) is not None]
    talks: dict[tuple, list[Batch]] = defaultdict(list)
    for inst in sorted(known, key=lambda i: (i.rank, i.start_ns, i.seq)):
        sends, recvs = peers(inst)  # type: ignore[misc]
        for peer in sorted(set(sends) | set(recvs)):
            talks[(inst.pg_uid, inst.replay, inst.rank, peer)].append(inst)
    parent: dict[int, Batch] = {id(inst): inst for inst in known}

    def root(inst: Batch) -> Batch:
        while parent[id(inst)] is not inst:
            parent[id(inst)] = parent[id(parent[id(inst)])]
            inst = parent[id(inst)]
        return inst

    for (pg, replay, rank, peer), mine in talks.items():
        for a, b in zip(mine, talks.get((pg, replay, peer, rank), ())):
            ra, rb = root(a), root(b)
            if ra is not rb:
                first, second = sorted((ra, rb), key=lambda i: (i.rank, i.start_ns))
                parent[id(second)] = first
    return {id(inst): (BATCH_KEY, inst.pg_uid, inst.replay, (head := root(inst)).rank, head.start_ns) for inst in known}


def batch_ranks(members: Sequence[Batch]) -> set[int]:
    """The ranks a matched batch should have: its members and every peer they name."""
    ranks = {inst.rank for inst in members}
    for inst in members:
        found = peers(inst)
        if found is not None:
            ranks.update(found[0])
            ranks.update(found[1])
    return ranks


def mismatches(members: Sequence[Batch]) -> list[tuple[tuple[int, int], str]]:
    """((sender, receiver), why) where a rank's sends to a peer are not that peer's receives
    from it, in order and size (elements), within one matched batch."""
    sent: dict[tuple[int, int], list[int]] = defaultdict(list)
    received: dict[tuple[int, int], list[int]] = defaultdict(list)
    for inst in members:
        found = peers(inst)
        if found is None:
            continue
        sizes = _sizes(inst)
        for peer, size in zip(found[0], sizes[0]):
            sent[(inst.rank, peer)].append(size)
        for peer, size in zip(found[1], sizes[1]):
            received[(peer, inst.rank)].append(size)
    present = {inst.rank for inst in members}
    out = []
    for pair in sorted(set(sent) | set(received)):
        if not set(pair) <= present:
            continue  # a missing member is reported as such
        if sent.get(pair, []) != received.get(pair, []):
            out.append((pair, f"rank {pair[0]} sends {sent.get(pair, [])} elements to rank {pair[1]}, "
                              f"which receives {received.get(pair, [])} from it"))
    return out

"""This worker's ranks' instances between the analysis and their lanes, and what comes back for them.

Under a sharded analysis (:mod:`commtag.merge.engine.shards`) a worker's own instances are
packed by (rank, lane) while other workers analyse them; the figures, waits, flows and markers
the analysing workers send back (:func:`back_pieces`, :func:`apply`) are kept by place, and each
lane's instances are unpacked with them only when the lanes writer takes that lane (:class:`OwnLanes`).
"""

from __future__ import annotations

from typing import Iterator

from commtag.merge.engine.routes import rows_pieces, unpack
from commtag.merge.pftrace.lanes import InstanceFlows
from commtag.merge.records import CollectiveInstance, Interner
from commtag.vocab import ANN_STRAGGLER, ANN_WAIT_US


def back_pieces(me: int, rows: list, tables: list[dict]) -> Iterator[dict]:
    """The rows going back to one worker in pieces, each with the figures its rows name that
    the worker has not been sent yet (a collective's figures travel once, not once per member:
    a 1,024-rank group's list of matched ranks is 5 KB)."""
    sent: set[int] = set()
    for piece in rows_pieces(rows, "rows"):
        needed = {row[3] for row in piece["rows"] if row[0] == "instance" and row[3] is not None} - sent
        sent |= needed
        yield {"from": me, "figures": [[k, tables[k]] for k in sorted(needed)], **piece}


def apply(piece: dict, lanes: OwnLanes, own_markers: list) -> None:
    """Figures, waits, flows and markers that came back for this worker's instances and ranks."""
    source = piece["from"]
    for k, table in piece["figures"]:
        lanes.figures[(source, k)] = table
    for row in piece["rows"]:
        if row[0] == "marker":
            own_markers.append((tuple(row[1]), row[2:]))
            continue
        _, rank, idx, k, wait, straggler, flow = row
        lanes.updates.setdefault(rank, {})[idx] = (None if k is None else (source, k), wait, straggler, flow)


class OwnLanes:
    """This worker's ranks' instances by (rank, lane), packed until the lanes writer takes them
    (:class:`commtag.merge.pftrace.lanes.LaneInstances`); each is then unpacked with what the
    analysis gave it (figures, wait, flows: into :attr:`flows`, replaced at every take)."""

    def __init__(self, interner: Interner) -> None:
        self.interner = interner
        #: (rank, lane) -> its instances packed, and their places among the rank's.
        self.packed: dict[tuple[int, str], tuple[bytes, list[int]]] = {}
        #: rank -> place -> ((worker, figures number) or None, wait us, straggler, flows as JSON).
        self.updates: dict[int, dict[int, tuple]] = {}
        self.figures: dict[tuple[int, int], dict] = {}
        self.flows: InstanceFlows = {}
        self._joined: dict[tuple[int, int, int], dict] = {}  # (worker, figures, id of the common args) -> both

    def pop(self, key: tuple[int, str], default: list[CollectiveInstance]) -> list[CollectiveInstance]:
        found = self.packed.pop(key, None)
        self.flows.clear()
        if found is None:
            return default
        packed, idxs = found
        insts = unpack(packed, self.interner)
        updates = self.updates.get(key[0], {})
        for inst, idx in zip(insts, idxs):
            update = updates.pop(idx, None)
            if update is None:
                continue
            figures, wait, straggler, flow = update
            if figures is not None:
                base = inst.common_args
                both = self._joined.get((*figures, id(base)))
                if both is None:
                    both = self._joined[(*figures, id(base))] = self.interner.common({**base, **self.figures[figures]})
                inst.common_args = both
                if wait is not None:
                    inst.args[ANN_WAIT_US] = wait
                if straggler:
                    inst.args[ANN_STRAGGLER] = True
            if flow is not None:
                self.flows[id(inst)] = flow if flow.__class__ is int else (
                    None if flow[0] is None else range(flow[0], flow[0] + flow[1]),
                    None if flow[2] is None else tuple(flow[2]))
        return insts

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(self.packed)

    def __len__(self) -> int:
        return len(self.packed)


def flow_to_wire(found) -> object:
    """A member's flows (:func:`commtag.merge.pftrace.lanes.group_flows`) as JSON: an id, or [first out, count, into]."""
    if found.__class__ is int:
        return found
    out, into = found
    return [None if out is None else out.start, 0 if out is None else len(out), None if into is None else list(into)]

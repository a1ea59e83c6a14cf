"""Bounded rounds of messages between merge workers, each to its own worker.

Why not :func:`commtag.merge.engine.exchange.all_done`: that gives every worker every worker's
whole part, parsed; what the analysis's workers send each other (:mod:`commtag.merge.engine.shards`)
is for one worker each, and in pieces, so that what a worker decodes at once stays a few MB.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import orjson

from commtag.merge.errors import MergeInputError

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World

#: Rows (instances, markers, Seq runs) a worker sends per round, to all other workers together:
#: each round is an all-gather, so every worker holds every worker's blob of the round at once.
ROUND_ROWS = 8192

#: The fewest rows of a piece, however many workers share a round.
MIN_PIECE_ROWS = 256


def piece_rows(workers: int) -> int:
    """Rows of one piece, to one worker, where ``workers`` share each round."""
    return max(MIN_PIECE_ROWS, ROUND_ROWS // max(1, workers - 1))


def route(world: World, sources: list[Iterator[dict]], receive: Callable[[dict], None]) -> None:
    """Send what ``sources[w]`` yields to worker ``w``, one piece per worker per round, and give
    ``receive`` each piece sent here, until no worker has any left. A blob is a JSON header (each
    piece's length, whether more follow) and the pieces: a worker parses only its own."""
    if world.size == 1:
        return
    while True:
        out = [b"" if w == world.index or (piece := next(source, None)) is None else orjson.dumps(piece)
               for w, source in enumerate(sources)]
        more = any(out)
        blobs = world.all_gather_bytes(orjson.dumps({"sizes": [len(p) for p in out], "more": more}) + b"\n"
                                       + b"".join(out))
        del out
        for w in range(len(blobs)):
            blob, blobs[w] = blobs[w], b""
            if w == world.index:
                continue
            cut = blob.find(b"\n")  # none: all_done's word of an error (a worker stopped in another step)
            head = orjson.loads(blob if cut < 0 else blob[:cut])
            if "error" in head:
                raise MergeInputError(*head["error"])
            more = more or head["more"]
            at = cut + 1 + sum(head["sizes"][:world.index])
            if head["sizes"][world.index]:
                receive(orjson.loads(memoryview(blob)[at:at + head["sizes"][world.index]]))
        if not more:
            return


def pieces(part: dict, listed: tuple[str, ...], size: int) -> Iterator[dict]:
    """``part`` in pieces of at most ``size`` rows of each list named in ``listed``; its other
    keys go with every piece (none when the lists are empty)."""
    rest = {key: value for key, value in part.items() if key not in listed}
    rows = max((len(part[name]) for name in listed), default=0)
    for at in range(0, rows, size):
        yield {**rest, **{name: part[name][at:at + size] for name in listed}}


def flow_to_wire(flow: object) -> object:
    """An instance's flows (:data:`commtag.merge.pftrace.lanes.InstanceFlows`) as JSON data."""
    if flow is None or flow.__class__ is int:
        return flow
    out, into = flow
    return [None if out is None else [out.start, out.stop], None if into is None else list(into)]


def flow_from_wire(flow: object) -> object:
    """The flows :func:`flow_to_wire` sent."""
    if flow.__class__ is int:
        return flow
    out, into = flow
    return (None if out is None else range(*out), None if into is None else tuple(into))

"""Pieces between merge workers: each goes to one worker, in bounded rounds.

The sharded analysis (:mod:`commtag.merge.engine.shards`) sends a worker's records to the
workers that own them and the figures back to the workers that write them. A round is one
:func:`commtag.merge.engine.exchange.all_done`: every worker sends at most one piece to each
other worker, each of at most :data:`PIECE_ROWS` rows, so what a worker holds of a round is
bounded whatever the job's size. Rounds go on until no worker has anything left.

How records are held and carried is the transport's (:func:`carrier`): workers pack them
(:class:`Packing`, compressed JSON columns); a world of one, where nothing leaves the process,
hands the objects over (:class:`HandingOver`). The driver is the same either way.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import orjson

from commtag.merge.engine.exchange import all_done, from_wire, to_wire
from commtag.merge.records import CollectiveInstance, Interner, RankSummary

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World

#: Rows (instances, or their figures) one piece carries: a round's bytes on every worker stay a few MB.
PIECE_ROWS = 8192


def route(world: World, outgoing: list[Iterator[dict]], arrived: Callable[[dict], object]) -> int:
    """Send each worker ``w`` the pieces ``outgoing[w]`` yields (this worker's own are handed to
    ``arrived`` here), one piece per worker a round, until every worker's are out; each piece sent
    to this worker goes to ``arrived`` as it comes. How many rounds it took."""
    me = world.index
    for piece in outgoing[me]:
        arrived(piece)
    rounds = 0
    while True:
        payload: dict[str, dict] = {}
        for w, pieces in enumerate(outgoing):
            if w != me:
                found: Optional[dict] = next(pieces, None)
                if found is not None:
                    payload[str(w)] = found
        sent = bool(payload)
        parts = all_done(world, lambda: {"pieces": payload})
        del payload
        rounds += 1
        for k, part in enumerate(parts):
            if part is None:
                continue
            parts[k] = None
            sent = sent or bool(part["pieces"])
            piece = part["pieces"].pop(str(me), None)
            del part
            if piece is not None:
                arrived(piece)
        if not sent:
            return rounds


def instance_pieces(rows: list[tuple[int, int, tuple, CollectiveInstance]]) -> Iterator[dict]:
    """``(rank, place, match key, instance)`` rows as pieces of at most :data:`PIECE_ROWS`; each
    row is let go once its piece is made (the list empties as it is sent)."""
    rows.reverse()
    while rows:
        chunk = [rows.pop() for _ in range(min(PIECE_ROWS, len(rows)))]
        by_rank: dict[int, list[tuple[int, tuple, CollectiveInstance]]] = {}
        for rank, place, key, inst in chunk:
            by_rank.setdefault(rank, []).append((place, key, inst))
        del chunk
        piece = to_wire([RankSummary(rank, "", None, [], instances=[inst for _, _, inst in listed])
                         for rank, listed in by_rank.items()])
        piece["places"] = [[place for place, _, _ in listed] for listed in by_rank.values()]
        piece["keys"] = [[key for _, key, _ in listed] for listed in by_rank.values()]
        del by_rank
        yield piece


def instances_from(piece: dict, interner: Interner) -> Iterator[tuple[int, int, tuple, CollectiveInstance]]:
    """The rows of an :func:`instance_pieces` piece, decoded."""
    for s, places, keys in zip(from_wire(piece, interner), piece["places"], piece["keys"]):
        for inst, place, key in zip(s.instances, places, keys):
            yield s.rank, place, tuple(key), inst


def rows_pieces(rows: list, name: str) -> Iterator[dict]:
    """Rows as pieces ``{name: rows}`` of at most :data:`PIECE_ROWS` each (the list empties as they go)."""
    rows.reverse()
    while rows:
        yield {name: [rows.pop() for _ in range(min(PIECE_ROWS, len(rows)))]}


#: Rows staged for one worker and bucket before they are sealed (compressed): the instances a
#: worker stages are at most this many per worker and bucket, not its ranks' all.
SEAL_ROWS = 512


class Packing:
    """How records travel between workers and wait on one: compressed JSON columns, bytes a worker
    can send and a fraction of the objects' room while other ranks are read and analysed."""

    hands_over = False

    def pack(self, rank: int, instances: list[CollectiveInstance]) -> object:
        """One rank's instances, held while the worker reads and analyses others'."""
        return zlib.compress(orjson.dumps(to_wire([RankSummary(rank, "", None, [], instances=instances)])), 1)

    def unpack(self, packed: object, interner: Interner) -> list[CollectiveInstance]:
        """The instances :meth:`pack` packed, in their order (new objects)."""
        assert isinstance(packed, bytes)
        return from_wire(orjson.loads(zlib.decompress(packed)), interner)[0].instances

    def seal(self, rows: list) -> tuple[int, object]:
        """Staged rows as one compressed piece (:func:`instance_pieces`), and how many."""
        return len(rows), zlib.compress(orjson.dumps(next(instance_pieces(rows))), 1)

    def open(self, sealed: object) -> object:
        """A sealed piece as it goes into a round."""
        assert isinstance(sealed, bytes)
        return orjson.loads(zlib.decompress(sealed))

    def rows(self, part: object, interner: Interner) -> Iterator[tuple[int, int, tuple, CollectiveInstance]]:
        """The rows of an opened piece, decoded."""
        assert isinstance(part, dict)
        return instances_from(part, interner)


class HandingOver(Packing):
    """A world of one: nothing leaves the process, so the records are handed on as the objects
    they are, not packed and rebuilt (the JSON round trips were a tenth of a 1,024-rank merge)."""

    hands_over = True

    def pack(self, rank: int, instances: list[CollectiveInstance]) -> object:
        return instances

    def unpack(self, packed: object, interner: Interner) -> list[CollectiveInstance]:
        assert isinstance(packed, list)
        return packed

    def seal(self, rows: list) -> tuple[int, object]:
        # Held as columns until their bucket is matched: a row's own tuple per record was 18 MiB of
        # a 1,024-rank merge's 274 MiB peak.
        return len(rows), tuple(zip(*rows))

    def open(self, sealed: object) -> object:
        return sealed

    def rows(self, part: object, interner: Interner) -> Iterator[tuple[int, int, tuple, CollectiveInstance]]:
        assert isinstance(part, tuple)
        return zip(*part)


def carrier(world: World) -> Packing:
    """How ``world`` carries records: handed over in a world of one, packed where workers exchange them."""
    return HandingOver() if world.size == 1 else Packing()


def unseal(sealed: list[tuple[int, object]], carrying: Packing) -> Iterator[dict]:
    """Sealed pieces, opened as they are sent, several to a piece of at most PIECE_ROWS rows (the
    list empties as they go)."""
    sealed.reverse()
    while sealed:
        parts: list[object] = []
        count = 0
        while sealed and (not parts or count + sealed[-1][0] <= PIECE_ROWS):
            rows, blob = sealed.pop()
            parts.append(carrying.open(blob))
            count += rows
        yield {"parts": parts}

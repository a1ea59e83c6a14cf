"""Pieces between merge workers: each goes to one worker, in bounded rounds.

The sharded analysis (:mod:`commtag.merge.engine.shards`) sends a worker's records to the
workers that own them and the figures back to the workers that write them. A round is one
:func:`commtag.merge.engine.exchange.addressed`: every worker sends at most one piece to each
other worker, each of at most :data:`PIECE_ROWS` rows, so what a worker holds of a round is
bounded whatever the job's size. Rounds go on until no worker has anything left.

How records are held and carried is the :class:`Carrier`'s: what goes to another worker travels
as compressed JSON columns; what stays in the worker stays objects, in a world of one all of it,
on a worker up to :data:`HELD_AS_OBJECTS` records, beyond which it is packed too. The driver is the
same either way.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Callable, Iterator, Optional

import orjson

from commtag.merge.engine.exchange import addressed, from_wire, to_wire
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
    for own in outgoing[me]:
        arrived(own)
    rounds = 0
    while True:
        payload: dict[int, dict] = {}
        for w, pieces in enumerate(outgoing):
            if w != me:
                found: Optional[dict] = next(pieces, None)
                if found is not None:
                    payload[w] = found
        parts, busy = addressed(world, payload)
        del payload
        rounds += 1
        for k, piece in enumerate(parts):
            if piece is not None:
                parts[k] = None  # let go once taken: a round's pieces are not all held to its end
                arrived(piece)
        del parts, piece
        if not busy:
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
#: Records (collective instances) a merge worker holds as objects before it packs the next rank's:
#: about 24 MiB of them (a quarter of that packed). Packing is CPU (held, dealt out and held again
#: by lane: about 7 us a record on a 128-rank set's worker) paid to hold a large share in a quarter
#: of the room; a share this small costs less held as it is.
HELD_AS_OBJECTS = 32_768


def packed(rank: int, instances: list[CollectiveInstance]) -> bytes:
    """One rank's instances as compressed JSON columns: what travels between workers."""
    return zlib.compress(orjson.dumps(to_wire([RankSummary(rank, "", None, [], instances=instances)])), 1)


def unpacked(held: object, interner: Interner) -> list[CollectiveInstance]:
    """Instances as :class:`Carrier` held them: the objects themselves, or new ones from :func:`packed`'s bytes."""
    if isinstance(held, list):
        return held
    assert isinstance(held, bytes)
    return from_wire(orjson.loads(zlib.decompress(held)), interner)[0].instances


class Carrier:
    """How a worker holds its ranks' records until they are analysed and written, and carries
    them to the others. A rank's records stay the objects they are while the worker holds fewer
    than ``budget`` (None: no bound, a world of one, where nothing leaves the process), else they
    are packed (:func:`packed`) and rebuilt when used. What goes to another worker is always
    packed; what a worker deals to itself from records it holds as objects stays objects."""

    def __init__(self, budget: Optional[int] = HELD_AS_OBJECTS) -> None:
        self.budget = budget
        self.as_objects = 0

    def hold(self, rank: int, instances: list[CollectiveInstance]) -> object:
        """One rank's instances, held while the worker reads and analyses others'."""
        if self.budget is None or self.as_objects + len(instances) <= self.budget:
            self.as_objects += len(instances)
            return instances
        return packed(rank, instances)

    @staticmethod
    def like(held: object, rank: int, instances: list[CollectiveInstance]) -> object:
        """``instances`` (some of ``held``'s, or the same changed) held as ``held`` is."""
        return instances if isinstance(held, list) else packed(rank, instances)

    @staticmethod
    def seal(rows: list, as_objects: bool) -> tuple[int, object]:
        """Staged rows as one piece, and how many: as columns of the objects (held as columns until
        their bucket is matched: a row's own tuple per record was 18 MiB of a 1,024-rank merge's
        274 MiB peak), or compressed (:func:`instance_pieces`)."""
        if as_objects:
            return len(rows), tuple(zip(*rows))
        return len(rows), zlib.compress(orjson.dumps(next(instance_pieces(rows))), 1)

    @staticmethod
    def open(sealed: object) -> object:
        """A sealed piece as it goes into a round."""
        if isinstance(sealed, tuple):
            return sealed
        assert isinstance(sealed, bytes)
        return orjson.loads(zlib.decompress(sealed))

    @staticmethod
    def rows(part: object, interner: Interner) -> Iterator[tuple[int, int, tuple, CollectiveInstance]]:
        """The rows of an opened piece (decoded where it was packed)."""
        if isinstance(part, tuple):
            return zip(*part)
        assert isinstance(part, dict)
        return instances_from(part, interner)


def carrier(world: World) -> Carrier:
    """How ``world`` holds and carries records: all as objects in a world of one, a bounded share on a worker."""
    return Carrier(None if world.size == 1 else HELD_AS_OBJECTS)


def unseal(sealed: list[tuple[int, object]]) -> Iterator[dict]:
    """Sealed pieces, opened as they are sent, several to a piece of at most PIECE_ROWS rows (the
    list empties as they go)."""
    sealed.reverse()
    while sealed:
        parts: list[object] = []
        count = 0
        while sealed and (not parts or count + sealed[-1][0] <= PIECE_ROWS):
            rows, blob = sealed.pop()
            parts.append(Carrier.open(blob))
            count += rows
        yield {"parts": parts}

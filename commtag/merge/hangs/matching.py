"""What the members of a group disagree on at one Seq, checked as torch's analyzer checks it
(types.py ``Op.match``: op, sizes, dtypes, state), all_to_all by its splits where commtag recorded them."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

from commtag.merge.hangs.dumps import FrEntry
from commtag.vocab import flight_recorder as fr


@dataclass(slots=True)
class Mismatch:
    """Members of one group disagreeing at one Seq: the odd ranks out, the field, both values."""

    pg: str
    seq: int
    kind: str  # "op", "size", "dtype", "state", "splits"
    ranks: list[int]
    detail: str

    @property
    def message(self) -> str:
        return f"desync {self.kind} in group {self.pg} Seq {self.seq}: ranks {self.ranks}: {self.detail}"

    def to_dict(self) -> dict[str, object]:
        return {"pg": self.pg, "seq": self.seq, "kind": self.kind, "ranks": self.ranks, "detail": self.detail}


def mismatches(table: dict[str, dict[int, dict[int, FrEntry]]], sizes: dict[str, int]) -> list[Mismatch]:
    """Every Seq two or more members hold, compared across them; the first disagreement per rank and Seq
    is said (torch's analyzer stops at it too)."""
    found: list[Mismatch] = []
    for group, ranks in table.items():
        by_seq: dict[int, list[tuple[int, FrEntry]]] = {}
        for rank in sorted(ranks):  # each Seq's holders in rank order, in one pass over the group
            for seq, entry in ranks[rank].items():
                holders = by_seq.get(seq)
                if holders is None:
                    by_seq[seq] = [(rank, entry)]
                else:
                    holders.append((rank, entry))
        for seq in sorted(by_seq):
            holders = by_seq[seq]
            if len(holders) < 2:
                continue
            found.extend(_compare(group, seq, holders, sizes.get(group, len(holders))))
    return found


def _compare(group: str, seq: int, holders: list[tuple[int, FrEntry]], size: int) -> list[Mismatch]:
    """The holders compared to the most common call among them (the lowest rank's on a tie): the odd
    ones out are named, not the reference (torch's analyzer takes the first rank it reads as the
    reference, and then names every other rank)."""
    first_entry = holders[0][1]
    reference = _call(first_entry)
    if first_entry.op not in fr.FR_ALL_TO_ALL_OPS and all(map(reference.__eq__, map(_call, map(_entry_of, holders)))):
        return []  # the common case, decided in C without building a signature (shared sizes compare by identity)
    counts: dict[tuple, int] = {}
    for _, entry in holders:
        counts[_signature(entry)] = counts.get(_signature(entry), 0) + 1
    first_rank, first = next((r, e) for r, e in holders if counts[_signature(e)] == max(counts.values()))
    others = [(r, e) for r, e in holders if r != first_rank]
    by_kind: dict[tuple[str, str], list[int]] = {}
    for rank, other in others:
        problem = _differs(first, other, size)
        if problem is not None:
            by_kind.setdefault(problem, []).append(rank)
    found = [Mismatch(group, seq, kind, ranks, f"{detail} (as rank {first_rank} and most members called it)")
             for (kind, detail), ranks in by_kind.items()]
    if first.op in fr.FR_ALL_TO_ALL_OPS:
        found.extend(_splits(group, seq, holders))
    return found


#: What two members' calls at one Seq must share to agree (torch's Op.match in the common case).
_call = operator.attrgetter("op", "state", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes")
_entry_of = operator.itemgetter(1)


def _signature(entry: FrEntry) -> tuple:
    return (entry.op, str(entry.input_sizes), str(entry.output_sizes), str(sorted(_dtypes(entry))), entry.state)


def _differs(ref: FrEntry, other: FrEntry, size: int) -> tuple[str, str] | None:
    """torch's Op.match, in its order; None where the two agree."""
    if ref.op != other.op:
        return "op", f"{other.op} where {ref.op} was expected"
    if ref.op not in fr.FR_UNCOMPARED_INPUTS and ref.input_sizes != other.input_sizes:
        return "size", f"input sizes {other.input_sizes} where {ref.input_sizes} were expected"
    if ref.op not in fr.FR_UNCOMPARED_OUTPUTS and ref.output_sizes != other.output_sizes:
        return "size", f"output sizes {other.output_sizes} where {ref.output_sizes} were expected"
    if ref.op == "all_reduce" and ref.input_sizes != other.output_sizes:
        return "size", f"output sizes {other.output_sizes} where the input sizes {ref.input_sizes} were expected"
    if ref.op in fr.FR_GATHERING_OPS and not _gathers(other.output_sizes, ref.input_sizes, size):
        return "size", f"output numel {_numel(other.output_sizes)} is not {size} x input numel"
    if ref.op in fr.FR_SCATTERING_OPS and not _gathers(other.input_sizes, ref.output_sizes, size):
        return "size", f"input numel {_numel(other.input_sizes)} is not {size} x output numel"
    if _dtypes(ref) != _dtypes(other):
        return "dtype", f"dtypes {sorted(_dtypes(other))} where {sorted(_dtypes(ref))} were expected"
    if ref.state != other.state:
        return "state", f"state {other.state!r} where {ref.state!r} was found"
    return None


def _gathers(gathered: list, shard: list, size: int) -> bool:
    """Whether a gathered buffer holds ``size`` shards: one flat tensor (the native backends), or the
    caller's list of one shard-shaped buffer per rank (torch 2.15's c10d hook; types.py ``_gathered_numel_matches``)."""
    if _numel(gathered) == _numel(shard) * size:
        return True
    shapes = [s for s in gathered if isinstance(s, list)], [s for s in shard if isinstance(s, list)]
    return (len(shapes[0]) == size * len(shapes[1])
            and sum(map(math.prod, shapes[0])) == sum(map(math.prod, shapes[1])) * size)


def _numel(sizes: list) -> int:
    return math.prod(sizes[0]) if sizes and isinstance(sizes[0], list) else 0


def _dtypes(entry: FrEntry) -> set:
    return set(entry.input_dtypes) | set(entry.output_dtypes)


def _splits(group: str, seq: int, holders: list[tuple[int, FrEntry]]) -> list[Mismatch]:
    """What rank a sends to rank b (its input split b) must be what b receives from a (its output split a);
    judged where every holder's splits are known and span the holders."""
    known = {r: (e.input_splits, e.output_splits) for r, e in holders
             if e.input_splits is not None and e.output_splits is not None}
    order = sorted(known)
    found = []
    for a in order:
        for b in order:
            sent, received = known[a][0], known[b][1]
            ia, ib = order.index(b), order.index(a)
            if len(sent) == len(order) and len(received) == len(order) and sent[ia] != received[ib]:
                found.append(Mismatch(group, seq, "splits", [a, b],
                                      f"rank {a} sends {sent[ia]} to rank {b}, which receives {received[ib]}"))
    return found

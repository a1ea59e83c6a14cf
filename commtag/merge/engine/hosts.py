"""Merge workers on several hosts that share no filesystem: who sees which rank, who merges it.

Under ``torchrun --nnodes=M`` each node's workers discover the rank files of
the folders given on that node's command line (each node its own local
disk). :func:`share` gathers what every node found (paths, sizes, base
times: no event) and what each node was given (the options and the output:
they must be one merge's, else an error naming both values), and decides,
the same on every worker:

* a rank found on several nodes is taken once, from one of them, when every
  copy holds the same files: the same path, size and modification time (one
  shared file, or a faithful copy), else the same size and SHA-256 (each
  node hashes its own copies, only of the ranks found twice). Any other
  difference is an error naming both files and nodes: the merge cannot know
  which one is right.
* each worker merges consecutive ranks that its own node holds
  (:func:`assign`), so that its part of the trace fits between the others'
  in rank order; worker 0 receives the parts over the gloo group
  (:mod:`commtag.merge.engine.worlds`) and writes the file.
* a node that found no trace merges nothing, and the merge says so; when no
  node found any, that is the error it would be on one host.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import orjson

from commtag.merge.errors import MergeInputError
from commtag.merge.engine.options import MergeOptions
from commtag.merge.inputs.load import NoTraceFound, RankInput, TraceFile, discover, nothing_left
from commtag.merge.engine.exchange import all_done

if TYPE_CHECKING:
    from commtag.merge.engine.worlds import World

@dataclass(frozen=True)
class Node:
    """The machine a worker runs on: torchrun's node rank (GROUP_RANK) and host name."""

    rank: int
    host: str

    def __str__(self) -> str:
        return f"node {self.rank} ({self.host})"


def this_node() -> Node:
    return Node(int(os.environ.get("GROUP_RANK", "0")), socket.gethostname())


@dataclass
class Shares:
    """What :func:`share` decided: every rank (each from one node), this worker's, and notices."""

    ranks: list[RankInput]
    mine: list[RankInput]
    #: The ranks this worker's node found itself (the ones its outputs must not harm).
    local: list[RankInput]
    notices: list[str]


def share(world: World, inputs: Sequence[Path], options: MergeOptions, output: Optional[Path],
          skipped: Optional[list[MergeInputError]]) -> Shares:
    """Check that every node was given the same options (:func:`_check_given`), discover on every
    node, take each rank once, and give each worker its consecutive ranks. ``output``: as given (None:
    the default, each node's own first folder's)."""
    node = this_node()
    rank_pattern, rank = options.rank_pattern, options.rank
    local: list[RankInput] = []
    own: dict = {}

    def found() -> dict:
        nonlocal local, own
        node_skipped: Optional[list[MergeInputError]] = [] if skipped is not None else None
        node_notices: list[str] = []
        try:
            local = discover(list(inputs), rank_pattern, node_skipped, rank=rank, notices=node_notices)
        except NoTraceFound:
            local = []
        except MergeInputError as exc:
            raise MergeInputError(exc.path, f"{exc.problem} (on {node})") from None
        own = {"node": [node.rank, node.host], "inputs": [str(p) for p in inputs],
               "ranks": [_rank_to_wire(r) for r in local],
               "skipped": [[str(e.path), e.problem] for e in node_skipped or ()], "given": _given(options, output),
               "notices": node_notices}
        return own

    views = [(index, Node(*part["node"]), part)
             for index, part in enumerate(own if p is None else p for p in all_done(world, found))]
    _check_given(views)
    if skipped is not None:
        every = [tuple(pair) for _, _, part in views for pair in part["skipped"]]
        skipped[:] = [MergeInputError(path, problem) for path, problem in dict.fromkeys(every)]
    # Every worker of a node found the same files: one view per node (its first worker's).
    nodes: dict[Node, dict] = {}
    for _, where, part in views:
        nodes.setdefault(where, part)
    by_rank = sorted(nodes.items(), key=lambda item: item[0].rank)
    notices = [f"{where}: {notice}" for where, part in by_rank for notice in part["notices"]]
    notices += [f"{where}: no PyTorch profiler trace under {', '.join(part['inputs'])}; it merges no rank"
                for where, part in by_rank if not part["ranks"]]
    held: dict[int, dict[Node, _Copy]] = {}
    for where, part in by_rank:
        for wired in part["ranks"]:
            held.setdefault(wired["rank"], {})[where] = _Copy.from_wire(wired)
    if not held:
        everywhere = list(dict.fromkeys(p for _, part in by_rank for p in part["inputs"]))
        if skipped:
            raise nothing_left([Path(p) for p in everywhere], skipped)
        raise MergeInputError(", ".join(everywhere), "no PyTorch profiler trace (.json or .json.gz with "
                                                     "traceEvents) found on any node")
    _check_copies(world, node, held)
    copies = [{where: copy.rank for where, copy in held[r].items()} for r in sorted(held)]
    assigned = assign(copies, [(index, where) for index, where, _ in views])
    return Shares([next(iter(c.values())) for c in copies], assigned[world.index], local, notices)


def _given(options: MergeOptions, output: Optional[Path]) -> dict[str, object]:
    """What a node's command line asked beside its input folders (which are each node's own): the
    output as given and every option, the selection's parts each by name. The progress bar is left
    out: it is each node's own display, not part of the trace."""
    wired = options.to_wire()
    del wired["progress"]
    selection = wired.pop("selection") or {}
    return {"output": None if output is None else str(output), **wired,
            **{part: selection.get(part) for part in ("steps", "window", "detail")}}


def _check_given(views: Sequence[tuple[int, Node, dict]]) -> None:
    """Every node must merge as worker 0's asks: a node given other options would apply its own to
    its ranks (half a trace filtered) or name another output. An error naming both values, the same
    on every worker, otherwise."""
    _, lead, first = views[0]
    for _, where, part in views[1:]:
        for name, value in part["given"].items():
            if value != first["given"].get(name):
                raise MergeInputError(first["given"]["output"] or first["inputs"][0],
                                      f"{where} was given {name} {_shown(value)}, {lead} {name} "
                                      f"{_shown(first['given'].get(name))}: every node of a merge must be given "
                                      "the same options (all but its input folders)")


def _shown(value: object) -> str:
    return "(not given)" if value is None else orjson.dumps(value).decode()


@dataclass
class _Copy:
    """A rank's files as one node found them, with each file's size and modification time."""

    rank: RankInput
    #: (path, size, mtime ns) of each trace and sidecar.
    stamps: list[tuple[str, int, int]]

    @classmethod
    def from_wire(cls, data: dict) -> _Copy:
        rank = RankInput(data["rank"])
        stamps: list[tuple] = []
        for path, sidecar, size, base, *files in data["files"]:
            rank.files.append(TraceFile(Path(path), None if sidecar is None else Path(sidecar), size, base))
            stamps.extend(tuple(stamp) for stamp in files if stamp is not None)
        return cls(rank, stamps)


def _rank_to_wire(rank: RankInput) -> dict:
    return {"rank": rank.rank, "files": [[str(f.path), None if f.sidecar is None else str(f.sidecar), f.size,
                                          f.base_ns, _stamp(f.path), _stamp(f.sidecar)] for f in rank.files]}


def _stamp(path: Optional[Path]) -> Optional[list]:
    """A file's path, size and modification time (ns): equal on two nodes, one shared file (or a faithful copy)."""
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError as exc:
        raise MergeInputError(path, f"cannot read: {exc.strerror or exc}") from None
    return [str(path), st.st_size, st.st_mtime_ns]


def _check_copies(world: World, node: Node, held: dict[int, dict[Node, _Copy]]) -> None:
    """A rank found on several nodes must be the same files on each: an error naming both otherwise.
    Same paths, sizes and times: one shared file; else the sizes, then every copy's SHA-256."""
    to_hash: set[str] = set()
    pairs = []
    for r, copies in sorted(held.items()):
        (first_node, first), *others = copies.items()
        for where, other in others:
            _compare(r, first_node, first, where, other, [size for _, size, _ in first.stamps],
                     [size for _, size, _ in other.stamps], "size")
            if first.stamps != other.stamps:
                pairs.append((r, first_node, first, where, other))
                for holder, copy in ((first_node, first), (where, other)):
                    if holder == node:
                        to_hash.update(path for path, _, _ in copy.stamps)
    if not pairs:
        return
    # The workers of this node share its hashing.
    names = sorted(to_hash)[int(os.environ.get("LOCAL_RANK", "0"))::int(os.environ.get("LOCAL_WORLD_SIZE", "1"))]
    mine: dict = {}

    def digests() -> dict:
        nonlocal mine
        mine = {"node": node.rank, "sha256": {name: _sha256(Path(name)) for name in names}}
        return mine

    found: dict[tuple[int, str], str] = {}
    for part in all_done(world, digests):
        part = mine if part is None else part
        for name, digest in part["sha256"].items():
            found[(part["node"], name)] = digest
    for r, first_node, first, where, other in pairs:
        _compare(r, first_node, first, where, other, [found[(first_node.rank, path)] for path, _, _ in first.stamps],
                 [found[(where.rank, path)] for path, _, _ in other.stamps], "content")


def _compare(rank: int, one: Node, first: _Copy, other: Node, second: _Copy, ours: list, theirs: list,
             what: str) -> None:
    """Stop with an error naming both copies where the files of ``rank`` differ in ``what``
    (``ours``, ``theirs``: a value per file, in the same order on both nodes)."""
    if len(ours) != len(theirs):
        mine = ", ".join(path for path, _, _ in first.stamps)
        raise MergeInputError(", ".join(path for path, _, _ in second.stamps),
                              f"rank {rank} on {other} is other files than {mine} on {one}: "
                              "a rank found on several nodes must be the same files on each")
    for (a, _, _), (b, _, _), x, y in zip(first.stamps, second.stamps, ours, theirs):
        if x != y:
            raise MergeInputError(b, f"rank {rank} on {other} differs in {what} from {a} on {one}: "
                                     "a rank found on several nodes must be the same files on each")


def _sha256(path: Path) -> str:
    try:
        digest = hashlib.sha256()  # hashlib.file_digest is Python 3.11's
        with open(path, "rb") as stream:
            while block := stream.read(1 << 20):
                digest.update(block)
        return digest.hexdigest()
    except OSError as exc:
        raise MergeInputError(path, f"cannot read: {exc.strerror or exc}") from None


def assign(copies: Sequence[dict[Node, RankInput]], workers: Sequence[tuple[int, Node]]
           ) -> dict[int, list[RankInput]]:
    """Each worker's ranks, as its own node found them: consecutive in rank order, balanced by size.

    ``copies``: each rank (in rank order) as each node holding it found it.
    Ranks are cut into runs that one node holds whole; each run gets at least
    one worker of a node holding it (the runs with fewest choices first), the
    workers left over join the run with the most bytes per worker they can read,
    and each run is split between its workers like one host's ranks.
    """
    runs: list[tuple[list[dict[Node, RankInput]], set[Node]]] = []
    for held in copies:
        if runs and runs[-1][1] & held.keys():
            runs[-1] = (runs[-1][0] + [held], runs[-1][1] & held.keys())
        else:
            runs.append(([held], set(held)))
    free = [index for index, _ in workers]
    node_of = dict(workers)
    staff: list[list[int]] = [[] for _ in runs]
    for k in sorted(range(len(runs)), key=lambda k: (sum(node_of[w] in runs[k][1] for w in free), k)):
        run, holders = runs[k]
        able = [w for w in free if node_of[w] in holders]
        if not able:
            first, last = (next(iter(run[at].values())).rank for at in (0, -1))
            who = ", ".join(str(n) for n in sorted(holders, key=lambda n: n.rank))
            raise MergeInputError(f"ranks {first}-{last}",
                                  f"only {who} holds them, and each merge worker merges consecutive ranks: "
                                  "that node needs more workers (--nproc-per-node) or its ranks in one block")
        staff[k].append(able[0])
        free.remove(able[0])
    for w in list(free):
        able = [k for k in range(len(runs)) if node_of[w] in runs[k][1]]
        if able:
            k = max(able, key=lambda k: (sum(next(iter(c.values())).size for c in runs[k][0]) / len(staff[k]), -k))
            staff[k].append(w)
    out: dict[int, list[RankInput]] = {index: [] for index, _ in workers}
    for (run, _), members in zip(runs, staff):
        ranks = [next(iter(c.values())) for c in run]
        by_number = {next(iter(c.values())).rank: c for c in run}
        for w, chunk in zip(sorted(members), chunks(ranks, len(members))):
            out[w] = [by_number[r.rank][node_of[w]] for r in chunk]
    return out


def chunks(ranks: Sequence[RankInput], workers: int, block: int = 1) -> list[list[RankInput]]:
    """Contiguous chunks in rank order, balanced by input size (worker 0 never empty), of whole
    blocks of ``block`` consecutive rank numbers (:func:`commtag.merge.ids.sequence_block`: then the
    trace is the same bytes whatever the number of workers). A block goes to the worker its middle
    falls in: given to the worker it starts in, worker 0 (which also leads) took up to a block more
    than its part, and the others waited for it (66 ranks against 62 at 128 ranks in blocks of 2)."""
    total = sum(r.size for r in ranks) or 1
    out: list[list[RankInput]] = [[] for _ in range(workers)]
    done = 0
    for _, members in itertools.groupby(ranks, key=lambda r: r.rank // block):
        taken = list(members)
        size = sum(r.size for r in taken)
        out[0 if not done else min(workers - 1, int((done + size / 2) * workers / total))] += taken
        done += size
    return out

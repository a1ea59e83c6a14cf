"""Find PyTorch profiler (Kineto) Chrome-JSON traces and their sidecars; tell their ranks.

Discovery reads only each file's first bytes (a sidecar starts with its
``"kind": "commtag-sidecar"``, Kineto writes a trace's ``distributedInfo``
before its ``traceEvents``) and each sidecar's head (:func:`commtag.merge.inputs.sidecars.load_sidecar_head`).
Some writers put ``distributedInfo`` after the events: a trace whose first
bytes do not hold it has its last bytes read too (:func:`_tail`; a gzip file
is decompressed to its end for that, into a bounded window, nothing parsed).
So ranks are known (and split between merge workers) before any trace is parsed.
Directories are searched at any depth; a sidecar pairs with the trace its
``trace_file`` names in the sidecar's own folder (so ``r0/trace.json.gz`` and
``r1/trace.json.gz`` are two traces), and a trace given by path takes the
sidecar beside it.

The rank of a trace, first rule that applies:
1. ``distributedInfo.rank`` in the trace;
2. the ``rank`` of the sidecar that names the trace;
3. ``--rank N`` when a single trace is merged;
4. the file name, by ``--rank-pattern`` if given, else by the default rule
   :data:`DEFAULT_RANK_PATTERN`: ``rank`` or ``worker``, optionally followed
   by ``-`` or ``_``, then the number (``rank3``, ``rank-3``, ``rank_3``,
   ``worker3_step_12...``), case-insensitive, not preceded by a letter;
5. otherwise the merge stops with an error naming the file.

Several trace files may share a rank (one per profiled step): they become one
process. Timestamps become absolute CLOCK_REALTIME ns:
``ts * 1000 + baseTimeNanoseconds`` (old traces: ``ts`` is already epoch
microseconds and there is no ``baseTimeNanoseconds``).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional, Sequence

from commtag.constants import SIDECAR_SUFFIX, sidecar_name_for
from commtag.vocab import FOREIGN_JSON_KEYS
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.jsonstream import GZIP_ERRORS, GZIP_MAGIC, open_decompressed
from commtag.merge.inputs.clock import checked_base_ns
from commtag.merge.inputs.sidecars import MAX_RANKS, load_sidecar_head

if TYPE_CHECKING:
    from commtag.schema import SidecarHead

DEFAULT_RANK_PATTERN = r"(?<![a-z])(?:rank|worker)[-_]?(\d+)"
_HEAD_BYTES = 1 << 16
_DIST_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
#: Names a trace or sidecar file has: such a file that is neither is an error, other JSON is ignored.
_OWN_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz", ".commtag.json")
#: How far into a file another tool's top key is looked for.
_FOREIGN_HEAD = 4096
_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*([-+.\deE]+)')
_DIST_WORLD = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"world_size"\s*:\s*(\d+)')


class NoTraceFound(MergeInputError):
    """The inputs hold no trace at all (on many hosts a node may see none: :mod:`commtag.merge.engine.hosts`)."""


@dataclass(slots=True)
class TraceFile:
    """One trace file of a rank and the sidecar that annotates it, if any."""

    path: Path
    sidecar: Optional[Path] = None
    size: int = 0
    #: baseTimeNanoseconds when the file's first bytes hold it, else 0.
    base_ns: int = 0


@dataclass(slots=True)
class RankInput:
    """All the files of one rank (several when several steps were profiled)."""

    rank: int
    files: list[TraceFile] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


def _head(path: Path) -> bytes:
    """The first bytes of a file, decompressed if gzip."""
    try:
        with open(path, "rb") as stream:
            raw = stream.read(_HEAD_BYTES)
    except OSError as exc:
        raise MergeInputError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] != GZIP_MAGIC:
        return raw
    inflater = zlib.decompressobj(wbits=47)
    try:
        head = inflater.decompress(raw, _HEAD_BYTES)
    except zlib.error as exc:
        raise MergeInputError(path, f"not a valid gzip file ({exc})") from None
    if len(raw) < _HEAD_BYTES and len(head) < _HEAD_BYTES and not inflater.eof:
        raise MergeInputError(path, "truncated gzip file (it ends before its compressed stream does)")
    return head


def _tail(path: Path) -> bytes:
    """The last bytes of a file, decompressed if gzip (read through to the end: gzip cannot seek)."""
    try:
        with open_decompressed(path) as stream:
            if not isinstance(stream, gzip.GzipFile):
                stream.seek(0, 2)
                stream.seek(max(0, stream.tell() - _HEAD_BYTES))
                return stream.read()
            tail = b""
            while chunk := stream.read(1 << 20):
                tail = (tail + chunk)[-_HEAD_BYTES:]
            return tail
    except GZIP_ERRORS as exc:
        raise MergeInputError(path, f"truncated or corrupt gzip ({exc})") from None
    except OSError as exc:
        raise MergeInputError(path, f"cannot read: {exc.strerror or exc}") from None


def _ends(path: Path, head: bytes) -> bytes:
    """What discovery searches a trace for: its head, and its tail when ``distributedInfo`` is not in the head."""
    if b'"distributedInfo"' in head:
        return head
    return head + b"\n" + _tail(path)


class _Facts(NamedTuple):
    """What discovery reads in a trace's first (and maybe last) bytes: the text each of its
    patterns matched there (empty: none). Not the bytes themselves: 64 KB per trace, kept for
    every trace until the ranks are known, were 34 MB of a 512-rank merge's peak."""

    rank: bytes
    base: bytes
    world: bytes


def _facts(ends: bytes) -> _Facts:
    found = [pattern.search(ends) for pattern in (_DIST_RANK, _BASE_TIME, _DIST_WORLD)]
    return _Facts(*(bytes(match.group(0)) if match else b"" for match in found))


def _gzipped(path: Path) -> bool:
    """Whether the file starts as gzip does (its name may say otherwise)."""
    with open(path, "rb") as stream:
        return stream.read(2) == GZIP_MAGIC


def _is_sidecar(head: bytes) -> bool:
    return b'"commtag-sidecar"' in head[:512]


def _looks_like_trace(head: bytes) -> bool:
    return b'"traceEvents"' in head or b'"schemaVersion"' in head


def foreign_format(head: bytes) -> Optional[str]:
    """What another tool's JSON is, by the key it writes at its top (None: none known)."""
    return next((what for key, what in FOREIGN_JSON_KEYS.items() if key in head[:_FOREIGN_HEAD]), None)


def discoverable(name: str) -> bool:
    """Whether a file of this name under an input folder is read as a trace or sidecar candidate."""
    return name.endswith((".json", ".json.gz"))


def would_read(inputs: Sequence[Path], path: Path) -> bool:
    """Whether discovery of ``inputs`` reads a file at ``path``: the merge must
    not write one there, or its next run takes it for an input."""
    target = path.resolve()  # through links: a folder reached two ways is one folder
    for item in inputs:
        folder = item.resolve()
        if item.is_dir() and target.is_relative_to(folder):
            hidden = any(part.startswith(".") for part in target.parent.relative_to(folder).parts)
            if not hidden and discoverable(target.name):
                return True
        elif item.is_file() and target.parent == folder.parent and target.name.endswith(SIDECAR_SUFFIX):
            return True
    return False


def _candidates(inputs: Sequence[Path], notices: Optional[list[str]] = None) -> list[tuple[Path, bool]]:
    """The files to read, each once, with whether it is only a possible sidecar.

    Every ``.json``/``.json.gz`` under an input directory, at any depth (hidden
    folders left out), and each input file. Beside an input
    file, the sidecars that may annotate it (possible: kept only if they name it).
    With ``notices``, a symbolic link in a folder whose target does not exist is left
    out and said there (without, reading it is the error that names it).
    """
    found: dict[Path, tuple[Path, bool]] = {}

    def add(path: Path, possible: bool) -> None:
        key = _key(path)
        if key not in found or (found[key][1] and not possible):
            found[key] = (path, possible)

    for item in inputs:
        if item.is_dir():
            for root, dirs, names in os.walk(item):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in filter(discoverable, sorted(names)):
                    path = Path(root, name)
                    if notices is not None and path.is_symlink() and not path.exists():
                        notices.append(f"{path}: a symbolic link to {os.readlink(path)}, which does not exist; "
                                       "left out")
                        continue
                    add(path, False)
        elif item.is_file():
            add(item, False)
        else:
            raise MergeInputError(item, "no such file or directory")
    for item in inputs:
        if item.is_file() and not item.name.endswith(SIDECAR_SUFFIX):
            own = sidecar_name_for(item.name)  # commtag's name for its sidecar: it must be good
            for beside in sorted(item.parent.glob("*" + SIDECAR_SUFFIX)):
                add(beside, beside.name != own)
    return list(found.values())


def _key(path: Path) -> Path:
    """A file's identity among the inputs: its absolute path (symbolic links are files of their own)."""
    return Path(os.path.abspath(path))


def rank_regex(rank_pattern: Optional[str]) -> re.Pattern[str]:
    """``--rank-pattern`` compiled (the default rule without one); a bad pattern is an input error."""
    try:
        pattern = re.compile(rank_pattern or DEFAULT_RANK_PATTERN, re.IGNORECASE)
    except re.error as exc:
        raise MergeInputError("--rank-pattern", f"'{rank_pattern}' is not a valid regular expression ({exc})") from None
    if pattern.groups < 1:
        raise MergeInputError("--rank-pattern", f"'{rank_pattern}' has no capture group for the rank")
    return pattern


def discover(
    inputs: Sequence[Path], rank_pattern: Optional[str] = None, skipped: Optional[list[MergeInputError]] = None,
    *, rank: Optional[int] = None, notices: Optional[list[str]] = None,
) -> list[RankInput]:
    """Group the traces under ``inputs`` (dirs or files) by rank, in rank order.

    A sidecar pairs with the trace its ``trace_file`` names in its own
    folder. ``rank``: the rank of the one trace found, when the trace does
    not say it.
    A bad file stops discovery with an error naming it; with ``skipped``
    (``--skip-bad-ranks``) it is appended there instead and left out. ``notices``: where
    files left out that are no input (a dangling symbolic link) are said.
    """
    pattern = rank_regex(rank_pattern)
    if rank is not None and not 0 <= rank < MAX_RANKS:
        raise MergeInputError("--rank", f"{rank} is not a rank (0 to {MAX_RANKS - 1})")

    def fail(path: Path, problem: str) -> None:
        if skipped is None:
            raise MergeInputError(path, problem)
        skipped.append(MergeInputError(path, problem))

    traces: dict[Path, tuple[Path, _Facts]] = {}
    claims: dict[Path, list[tuple[Path, SidecarHead]]] = {}
    foreign: list[str] = []  # other tools' files: said, never read as traces
    for path, possible in _candidates(inputs, notices):
        try:
            head = _head(path)
            sidecar = load_sidecar_head(path) if _is_sidecar(head) else None
        except MergeInputError as exc:
            if not possible:
                fail(exc.path, exc.problem)
            continue
        target = _key(path.parent / sidecar.trace_file) if sidecar is not None else None
        if possible and target not in traces:
            continue  # beside an input trace, but not its sidecar
        if sidecar is not None and target is not None:  # (a sidecar always names a target)
            claims.setdefault(target, []).append((path, sidecar))
        elif not _looks_like_trace(head):
            if (what := foreign_format(head)) is not None:
                foreign.append(f"{path.name} is another tool's format: {what}")
            elif path.name.endswith(".gz") and not _gzipped(path):
                fail(path, "named .gz but is not gzip, and its text is neither a trace nor a sidecar "
                           "(no traceEvents, no commtag kind)")
            elif path.name.endswith(_OWN_SUFFIXES):
                fail(path, "named like a trace or sidecar but is neither (no traceEvents, no commtag kind)")
        else:
            try:
                traces[_key(path)] = (path, _facts(_ends(path, head)))
            except MergeInputError as exc:
                fail(exc.path, exc.problem)
    sidecars = _pair(traces, claims, fail)
    _one_run(traces, sidecars, fail)
    others = f"; {'; '.join(foreign[:3])}{f'; and {len(foreign) - 3} more' if len(foreign) > 3 else ''}" if foreign else ""
    if not traces:
        where = ", ".join(str(p) for p in inputs)
        raise NoTraceFound(where, f"no PyTorch profiler trace (.json or .json.gz with traceEvents) found{others}")
    if foreign and notices is not None:
        notices.append(f"{', '.join(str(p) for p in inputs)}: {len(foreign)} file(s) left out{others}")
    if rank is not None and len(traces) > 1:
        raise MergeInputError("--rank", f"gives the rank of a single trace, but {len(traces)} traces were found")
    for key, (path, side) in sidecars.items():
        if key not in traces:
            fail(path, f"its trace_file {side.trace_file!r} is not among the input traces")
    ranks: dict[int, RankInput] = {}
    for key, (path, facts) in sorted(traces.items()):
        sidecar_path, sidecar = sidecars.get(key, (None, None))
        try:
            number = _rank_of(path, facts.rank, sidecar, pattern, rank_pattern, rank)
            if number >= MAX_RANKS:
                raise MergeInputError(path, f"rank {number} is beyond the {MAX_RANKS} ranks a merge can lay out")
            found = _BASE_TIME.search(facts.base)
            text = found.group(1) if found else b"0"
            base = checked_base_ns(path, int(text) if text.isdigit() else text.decode())
        except MergeInputError as exc:
            fail(exc.path, exc.problem)
            if sidecar is not None and sidecar_path is not None:  # (both or neither)
                fail(sidecar_path, f"its trace {sidecar.trace_file!r} was skipped")
            continue
        entry = ranks.setdefault(number, RankInput(number))
        entry.files.append(TraceFile(path, sidecar_path, path.stat().st_size, base))
    if not ranks:
        raise nothing_left(inputs, skipped or [])
    return [ranks[r] for r in sorted(ranks)]


def nothing_left(inputs: Sequence[Path], skipped: Sequence[MergeInputError]) -> MergeInputError:
    """The error when --skip-bad-ranks left no rank: it still says what was skipped and why."""
    why = "; ".join(str(e) for e in skipped)
    return MergeInputError(", ".join(str(p) for p in inputs), "no rank left to merge" + (f" (skipped {why})" if why else ""))


def _pair(traces: dict[Path, tuple[Path, _Facts]], claims: dict[Path, list[tuple[Path, SidecarHead]]],
          fail: Callable[[Path, str], None]) -> dict[Path, tuple[Path, SidecarHead]]:
    """Each trace's sidecar among those that name it. A sidecar of another rank than the
    trace's ``distributedInfo.rank``, or a second one, is the file at fault: the trace keeps
    the sidecar of its own rank (else the one with commtag's name for it) and is merged."""
    sidecars: dict[Path, tuple[Path, SidecarHead]] = {}
    for target, named in claims.items():
        trace = traces.get(target)
        match = _DIST_RANK.search(trace[1].rank) if trace else None
        said = int(match.group(1)) if match else None
        own = sidecar_name_for(target.name)
        ranked = sorted(named, key=lambda c: (said is not None and c[1].rank != said, c[0].name != own))
        for path, side in ranked:
            if said is not None and side.rank != said:
                fail(path, f"sidecar is for rank {side.rank} but its trace is rank {said}")
            elif target in sidecars:
                fail(path, f"annotates the same trace {side.trace_file!r} as {sidecars[target][0]}")
            else:
                sidecars[target] = (path, side)
    return sidecars


def _one_run(traces: dict, sidecars: dict, fail: Callable[[Path, str], None]) -> None:
    """Refuse files of another run: a run id or world size that differs from most files'."""
    ids = Counter(side.run_id for _, side in sidecars.values())
    common_id = ids.most_common(1)[0][0] if ids else None
    sizes: dict[Path, tuple[Path, int]] = {}
    for key, (path, facts) in traces.items():
        match = _DIST_WORLD.search(facts.world)
        if match:
            sizes[key] = (path, int(match.group(1)))
    for key, (path, side) in sidecars.items():
        sizes.setdefault(key, (path, side.world_size))
    common_size = Counter(size for _, size in sizes.values()).most_common(1)[0][0] if sizes else None
    for key, (path, side) in list(sidecars.items()):
        if side.run_id != common_id:
            fail(path, f"run id {side.run_id!r} differs from {common_id!r} of the other sidecars: "
                       "ranks from different runs")
            del sidecars[key]
            traces.pop(key, None)
    for key, (path, size) in sizes.items():
        if size != common_size and key in traces:
            fail(path, f"world size {size} differs from {common_size} of the other files: ranks from different runs")
            traces.pop(key)
            sidecars.pop(key, None)
    for key, (path, side) in list(sidecars.items()):  # beside a trace that says its own world size
        if side.world_size != common_size:
            fail(path, f"world size {side.world_size} differs from {common_size} of the other files: "
                       "a sidecar of another run")
            del sidecars[key]


def _rank_of(path: Path, rank_text: bytes, sidecar: Optional[SidecarHead], pattern: re.Pattern[str],
             rank_pattern: Optional[str], given: Optional[int]) -> int:
    """The trace's rank by the rules in this module's docstring; ``given``: ``--rank``."""
    match = _DIST_RANK.search(rank_text)
    said = int(match.group(1)) if match else sidecar.rank if sidecar is not None else None
    if given is not None:
        if said is not None and said != given:
            raise MergeInputError(path, f"--rank {given} contradicts rank {said} that the "
                                        f"{'trace' if match else 'sidecar'} names")
        return given
    if said is not None:
        return said
    named = pattern.search(path.name)
    if named:
        text = named.group(1) or ""
        if not (text.isascii() and text.isdigit()):
            raise MergeInputError(path, f"--rank-pattern '{pattern.pattern}' takes {text!r} from the file name, "
                                        "which is not a rank number")
        return int(text)
    rule = (f"--rank-pattern '{rank_pattern}'" if rank_pattern else
            "rank<N>/rank-<N>/rank_<N>/worker<N> (pass --rank-pattern REGEX with one group)")
    raise MergeInputError(
        path,
        f"cannot tell the rank: no distributedInfo.rank in the trace, no sidecar, and the file name "
        f"does not match {rule}; a single trace takes --rank N",
    )

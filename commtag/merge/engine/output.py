"""What the merge writes, and how: nothing it writes may destroy what it reads.

* :func:`check_outputs` refuses, before any work, an output that is one of
  the merge's inputs, is there but not a regular file (a directory, device
  or pipe, which renaming a file over would destroy), or lies where a later
  merge of the same inputs would read it (:func:`commtag.merge.inputs.load.would_read`:
  a ``.json``/``.json.gz`` under an input folder, a sidecar beside an input
  trace); the same for ``--json``'s folder and files.
* :class:`MergeOutput` owns what one merge worker writes: its part (worker 0's
  becomes the output, the others' are shards worker 0 appends), the staged
  ``--json`` files (they appear only once the whole merge has succeeded),
  their removal when it fails, and OSError as the error naming the file.
* :func:`remove_stale` removes what a merge killed with SIGKILL (no cleanup)
  left: temporaries are named by :func:`commtag.atomic.temporary` after their
  writer's host and pid, so one a live merge is still writing stays. The
  exchange folder of merge workers is named so too, after their launcher's pid.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, Optional, Sequence, cast

import orjson

from commtag.atomic import commit, temporary, temporary_owner
from commtag.merge.errors import MergeInputError
from commtag.merge.inputs.load import RankInput, would_read

def _alive(pid: int) -> bool:
    """Whether process ``pid`` is running: a zombie (exited, not yet reaped by its parent) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    try:  # Linux: the state follows the parenthesized command name
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def remove_stale(directories: Iterable[Path]) -> list[Path]:
    """Remove the temporaries in ``directories`` whose writer, a process of this host, is gone.

    A temporary of a live process (a merge running beside this one) stays;
    so does one written on another host (its pid means nothing here).
    Returns what was removed.
    """
    removed = []
    for directory in dict.fromkeys(directories):
        try:
            names = [p.name for p in directory.iterdir()]
        except OSError:
            continue  # not there yet: nothing stale in it
        for name in names:
            pid = temporary_owner(name)
            if pid is not None and pid != os.getpid() and not _alive(pid):
                stale = directory / name
                with contextlib.suppress(OSError):  # another merge may be removing it too
                    if stale.is_dir() and not stale.is_symlink():  # a killed torchrun launch's exchange
                        shutil.rmtree(stale)
                    else:
                        stale.unlink()
                    removed.append(stale)
    return removed


def _identity(path: Path) -> Optional[tuple[int, int]]:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def not_regular(path: Path) -> Optional[str]:
    """Why ``path`` cannot be replaced by a file: what it is when it exists and is no regular file."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), None)


def check_outputs(output: Path, json_dir: Optional[Path], inputs: Sequence[Path], ranks: Sequence[RankInput],
                  skipped: Sequence[MergeInputError] = ()) -> None:
    """Raise :class:`MergeInputError` naming the path when the merge's outputs would harm its inputs.

    ``inputs``: the paths the user gave; ``ranks``: what discovery found in
    them (traces and their sidecars); ``skipped``: files left out, still the user's.
    """
    files = [*(p for p in inputs if not p.is_dir()), *(e.path for e in skipped),
             *(f.path for r in ranks for f in r.files), *(f.sidecar for r in ranks for f in r.files if f.sidecar)]
    taken = {_identity(p) for p in files} - {None}

    def check(path: Path, what: str) -> None:
        kind = not_regular(path)
        if kind is not None:
            raise MergeInputError(path, f"{what} is {kind}, not a regular file: the merge would replace it")
        if _identity(path) in taken:
            raise MergeInputError(path, f"{what} is an input of this merge: the merge would overwrite it")
        if would_read(inputs, path):
            raise MergeInputError(path, f"{what} lies where the merge reads its inputs (a .json or .json.gz "
                                        "under an input folder, a sidecar beside an input trace): the next "
                                        "merge would read it as one")

    check(output, "the output")
    if json_dir is None:
        return
    if json_dir.exists() and not json_dir.is_dir():
        raise MergeInputError(json_dir, "--json needs a folder, and this is not one")
    targets = [json_dir / f.path.name for r in ranks for f in r.files]
    if any(would_read(inputs, target) for target in targets):
        raise MergeInputError(json_dir, "--json's folder lies where the merge reads its inputs (an input folder "
                                        "or one under it): the next merge would read the annotated copies as traces")
    for target in targets:
        if target.resolve() == output.resolve():
            raise MergeInputError(target, "--json would write over the merge's own output")
        check(target, "--json's file")


@contextlib.contextmanager
def output_errors(path: Path, what: str = "") -> Iterator[None]:
    """An OSError while writing becomes the merge's error naming ``path`` (and ``what`` it is)."""
    try:
        yield
    except OSError as exc:
        raise MergeInputError(path, f"cannot write{what}: {exc.strerror or exc}") from None


def append_file(source: BinaryIO, sink: BinaryIO) -> None:
    """Write all of ``source`` (just opened) at ``sink``'s position. Why not read and write:
    worker 0 appends the other workers' parts (80 MB in a -j 2 merge of 3 M events) after
    everyone has finished, so no other worker shortens that time; Linux's ``copy_file_range``
    copies file to file without bringing the bytes into this process."""
    if isinstance(sink, (io.BufferedWriter, io.BufferedRandom)) and hasattr(os, "copy_file_range"):
        sink.flush()
        into = sink.fileno()
        copied = 0
        try:
            while n := os.copy_file_range(source.fileno(), into, 1 << 30):
                copied += n
        except OSError:
            if copied:
                raise
            # not between these two files (another filesystem on an old kernel): by hand, below
        else:
            sink.seek(os.lseek(into, 0, os.SEEK_CUR))  # the buffered file learns where the copy ended
            return
    while block := source.read(16 << 20):
        sink.write(block)


class _Nowhere:
    """Where the pieces of an output that failed go: they are received, never written."""

    def write(self, data: bytes) -> int:
        return len(data)


def _nowhere() -> BinaryIO:
    """A :class:`_Nowhere`, where the pieces' writers take a binary stream (they only write)."""
    return cast(BinaryIO, _Nowhere())


class MergeOutput:
    """The files one merge worker writes, from its first byte to their publication or removal.

    ``part`` is the temporary this worker writes its ranks into, ``lanes`` the
    one it writes their lanes into: worker 0's part becomes the output once
    the other workers' parts (shards), then every worker's lanes, are appended
    to it (the trace one process writes: every rank's block, then every rank's
    lanes); ``--json`` copies are staged under temporary names and renamed with
    it. Used as a context manager: on the way out whatever is still a
    temporary is removed, so a failed merge leaves only what was there.
    """

    def __init__(self, path: Path, json_dir: Optional[Path], lead: bool, apart: bool = False) -> None:
        self.path = path
        self.json_dir = json_dir
        self.lead = lead
        #: Workers on hosts of their own (:meth:`assemble`): a part is this host's, the output's folder
        #: may exist only on worker 0's, and worker 0 writes the header itself.
        self.apart = apart
        if not apart:
            self.part = temporary(path)
        elif lead:
            self.part = temporary(path.with_name(path.name + ".ranks"))
        else:
            self.part = temporary(Path(tempfile.gettempdir()) / path.name)
        self.lanes = temporary(self.part.with_name(path.name + ".lanes"))
        self._shards: list[Path] = []
        self._staged: list[tuple[Path, Path]] = []
        self._own_part = True
        #: Whether what is written here is kept (:class:`NoOutput`: no).
        self.writes = True

    def check(self, inputs: Sequence[Path], ranks: Sequence[RankInput],
              skipped: Sequence[MergeInputError] = ()) -> None:
        """Refuse outputs that would harm the inputs (:func:`check_outputs`), then remove the
        temporaries of killed merges from the folders this merge writes into."""
        check_outputs(self.path, self.json_dir, inputs, ranks, skipped)
        remove_stale([self.path.parent, *([self.json_dir] if self.json_dir is not None else [])])

    def open_part(self, mode: str = "wb") -> contextlib.AbstractContextManager[BinaryIO]:
        """This worker's part, open for writing (``"r+b"``: to append); OSError names the output."""
        return self._open(self.part, mode)

    @contextlib.contextmanager
    def _open(self, path: Path, mode: str = "wb") -> Iterator[BinaryIO]:
        with self.errors(), open(path, mode) as stream:
            yield cast(BinaryIO, stream)  # binary: every mode this opens is "b"

    def open_lanes(self) -> contextlib.AbstractContextManager[BinaryIO]:
        """This worker's lanes file, open for writing; OSError names the output."""
        return self._open(self.lanes)

    def errors(self) -> contextlib.AbstractContextManager[None]:
        """An OSError while writing becomes the merge's error naming the output."""
        return output_errors(self.path, " the output")

    def stage_json(self, name: str, trace: dict) -> None:
        """Write an annotated Chrome JSON trace as ``json_dir/name`` (gzip if the name ends
        in .gz) under a temporary name, renamed by :meth:`publish`."""
        assert self.json_dir is not None
        target = self.json_dir / name
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MergeInputError(target.parent, f"cannot create: {exc.strerror or exc}") from None
        # Indented like Kineto's own output: HTA finds a file's rank with the regex
        # '"rank":\s+(\d+)', which compact JSON ('"rank":1') never matches.
        data = orjson.dumps(trace, option=orjson.OPT_INDENT_2)
        if target.name.endswith(".gz"):
            data = gzip.compress(data, compresslevel=3)
        tmp = temporary(target)
        self._staged.append((tmp, target))
        with output_errors(target):
            tmp.write_bytes(data)

    def publish(self, parts: Sequence[Optional[dict]]) -> None:
        """The merge succeeded: worker 0 appends the other workers' parts, then every worker's
        lanes (each then removed), to its part and renames it over the output; every worker
        renames its staged --json files into place. Another worker's part is worker 0's to remove
        now. ``parts``: each worker's paths (``"shard"``: its part, ``"lanes"``), None in this one's place."""
        if self.lead:
            mine = {"shard": self.part, "lanes": self.lanes}
            self._shards = [Path((part or mine)[key]) for key in ("shard", "lanes") for part in parts]
            self._shards.remove(self.part)
            with self.open_part("r+b") as stream:
                stream.seek(0, os.SEEK_END)
                for shard in self._shards:
                    with open(shard, "rb") as part:
                        append_file(part, stream)
            with self.errors():
                commit(self.part, self.path)
        else:  # worker 0 removes the shard it appended; a part sent from another host is this one's to remove
            self._own_part = self.apart
        while self._staged:
            tmp, target = self._staged.pop(0)
            with output_errors(target):
                commit(tmp, target)

    def assemble(self, header: bytes, pieces: Sequence[Callable[[BinaryIO], None]]) -> None:
        """Many hosts, worker 0: write the output from the ``header`` and the ``pieces`` in rank
        order (each writes a worker's part into the stream it is given: this worker's own part, or
        another's as it arrives), then rename it into place. Every piece is taken even after a
        failure, into nothing, so that no worker is left waiting to send."""
        whole = temporary(self.path)
        self._shards.append(whole)  # removed unless published
        failure: Optional[BaseException] = None
        with contextlib.ExitStack() as stack:
            sink = _nowhere()
            try:
                sink = stack.enter_context(open(whole, "wb"))
                sink.write(header)
            except OSError as exc:
                failure, sink = exc, _nowhere()
            for piece in pieces:
                try:
                    piece(sink)
                except (OSError, MergeInputError) as exc:
                    failure, sink = failure or exc, _nowhere()
        if isinstance(failure, MergeInputError):
            raise failure
        with self.errors():
            if failure is not None:
                raise failure
            commit(whole, self.path)
        self._shards.remove(whole)
        while self._staged:
            tmp, target = self._staged.pop(0)
            with output_errors(target):
                commit(tmp, target)

    def copy_part(self, sink: BinaryIO) -> None:
        """This worker's own part, into ``sink``."""
        with open(self.part, "rb") as part:
            append_file(part, sink)

    def copy_lanes(self, sink: BinaryIO) -> None:
        """This worker's own lanes, into ``sink``."""
        with open(self.lanes, "rb") as lanes:
            append_file(lanes, sink)

    def __enter__(self) -> MergeOutput:
        return self

    def __exit__(self, *exc_info: object) -> None:
        leftovers = [*([self.part, self.lanes] if self._own_part else []), *self._shards,
                     *(tmp for tmp, _ in self._staged)]
        for leftover in leftovers:
            with contextlib.suppress(OSError):  # e.g. ENOTDIR: the output's directory is a file
                leftover.unlink(missing_ok=True)


class NoOutput(MergeOutput):
    """Where a merge plan that writes nothing writes (``commtag summary`` on a directory runs the
    merge's stages up to its ranks): every stream takes the bytes and keeps none, no file is made."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, None, lead=True)
        self._own_part = False
        self.writes = False

    def check(self, inputs: Sequence[Path], ranks: Sequence[RankInput],
              skipped: Sequence[MergeInputError] = ()) -> None:
        """Nothing to refuse: nothing is written."""

    @contextlib.contextmanager
    def _open(self, path: Path, mode: str = "wb") -> Iterator[BinaryIO]:
        yield _nowhere()

    def publish(self, parts: Sequence[Optional[dict]]) -> None:
        """Nothing to publish."""

"""What the merge writes, and how: nothing it writes may destroy what it reads.

* :func:`check_outputs` refuses, before any work, an output that is one of
  the merge's inputs, is there but not a regular file (a directory, device
  or pipe, which renaming a file over would destroy), or lies where a later
  merge of the same inputs would read it (:func:`commtag.merge.load.would_read`:
  a ``.json``/``.json.gz`` under an input folder, a sidecar beside an input
  trace); the same for ``--json``'s folder and files.
* :func:`temporary` names the hidden file a process writes before its atomic
  rename, ``.NAME.tmp-HOST-PID``: :func:`remove_stale` can then tell a
  temporary left by a dead process on this host (a merge killed with SIGKILL
  runs no cleanup) from one a merge is still writing. The exchange folder of
  torchrun's merge workers is named so too, after their agent's pid.
* :func:`stage_json` and :func:`publish`: ``--json`` files appear only once
  the whole merge has succeeded.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import socket
import stat
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import orjson

from commtag.merge.load import MergeInputError, RankInput, would_read

_TMP = ".tmp-"
#: This host, as it appears in temporaries' names (no "/": it is part of a file name).
_HOST = socket.gethostname().replace("/", "_") or "localhost"


def temporary(path: Path, pid: Optional[int] = None) -> Path:
    """The hidden name beside ``path`` that process ``pid`` (default: this one) writes before
    renaming it into place, or removes when done."""
    return path.with_name(f".{path.name}{_TMP}{_HOST}-{os.getpid() if pid is None else pid}")


def _owner(name: str) -> Optional[int]:
    """The pid in a temporary's name when a process of this host wrote it, else None."""
    head, _, pid = name.rpartition("-")
    if not (name.startswith(".") and pid.isdigit() and head.endswith(f"{_TMP}{_HOST}")):
        return None
    return int(pid)


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
            pid = _owner(name)
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
def output_errors(out_path: Path) -> Iterator[None]:
    """An OSError while writing becomes the merge's error naming the output."""
    try:
        yield
    except OSError as exc:
        raise MergeInputError(out_path, f"cannot write the output: {exc.strerror or exc}") from None


def publish(staged: list[tuple[Path, Path]]) -> None:
    """Rename the staged --json files into place (the merge succeeded)."""
    while staged:
        tmp, path = staged.pop(0)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise MergeInputError(path, f"cannot write: {exc.strerror or exc}") from None


def stage_json(path: Path, trace: dict) -> Path:
    """Write an annotated Chrome JSON trace (gzip if the name ends in .gz) under a temporary
    name beside ``path``; return that name. The caller renames it once the merge succeeded."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MergeInputError(path.parent, f"cannot create: {exc.strerror or exc}") from None
    # Indented like Kineto's own output: HTA finds a file's rank with the regex
    # '"rank":\s+(\d+)', which compact JSON ('"rank":1') never matches.
    data = orjson.dumps(trace, option=orjson.OPT_INDENT_2)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=3)
    tmp = temporary(path)
    try:
        tmp.write_bytes(data)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise MergeInputError(path, f"cannot write: {exc.strerror or exc}") from None
    return tmp

"""Files that appear whole or not at all: one temporary name and one write-then-rename rule.

Both wings write this way (the runtime its traces and sidecars, the merge its
output, shards, ``--json`` copies and exchange rounds, the summary its plot),
so the rule lives here, below both, with the standard library only.

* :func:`temporary` names the hidden file a process writes before renaming it
  into place: ``.NAME.tmp-HOST-PID`` (``.gz`` kept at the end when NAME has it,
  for writers that pick compression by suffix). From the name alone
  :func:`temporary_owner` tells the process of this host that wrote it, so a
  later merge can remove what a killed process left
  (:func:`commtag.merge.engine.output.remove_stale`) and never what a live one is
  writing. One process writes one target at a time.
* fsync policy, decided once: :func:`commit` and :func:`claim` fsync the temporary before the
  rename, always. Without it a crash soon after can leave the final name on an
  empty or partial file (delayed allocation on ext4/xfs), which is the very
  "never overwrite a good file" this module exists for. The directory is not
  fsynced: a rename lost in a crash leaves the previous file, which is allowed.
  The one exception, :func:`write_atomic`'s ``durable=False``: a file only live processes of
  this host read and that a crash makes worthless anyway (the merge workers' exchange rounds,
  removed with their folder), where an fsync per round made every worker wait on the disk.
* A new file gets the mode any new file gets (0666 less the umask), never
  mkstemp's 0600: the merge often runs as another user than training.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Optional, Union

_TMP = ".tmp-"
#: This host, as it appears in temporaries' names (no "/": it is part of a file name).
HOST = socket.gethostname().replace("/", "_") or "localhost"
_OWNED = re.compile(rf"\..+{re.escape(_TMP + HOST)}-(\d+)(?:\.gz)?")


def temporary(path: Path, pid: Optional[int] = None) -> Path:
    """The hidden name beside ``path`` that process ``pid`` (default: this one) writes before
    renaming it into place, or removes when done."""
    pid = os.getpid() if pid is None else pid
    name = path.name
    ext = ".gz" if name.endswith(".gz") else ""
    return path.with_name(f".{name}{_TMP}{HOST}-{pid}{ext}")


def temporary_owner(name: str) -> Optional[int]:
    """The pid in a temporary's name when a process of this host wrote it, else None."""
    found = _OWNED.fullmatch(name)
    return int(found.group(1)) if found else None


def commit(tmp: Path, path: Path) -> None:
    """Make the written temporary ``tmp`` the file ``path``: fsync it, then rename it over ``path``."""
    _sync(tmp)
    os.replace(tmp, path)


def _sync(path: Path) -> None:
    """The module's fsync policy (see its docstring), in one place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Union[str, Path], data: bytes, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` through :func:`temporary` and :func:`commit`: a reader sees
    the old file or the new one, never a part; on any failure the temporary is removed.
    ``durable=False``: renamed without the fsync (the module docstring says where)."""
    path = Path(path)
    tmp = temporary(path)
    try:
        with open(tmp, "wb") as out:
            out.write(data)
        if durable:
            commit(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def claim(tmp: Path, path: Path) -> bool:
    """Make the written temporary ``tmp`` the file ``path`` only if no file has that name:
    True when it did. A hard link takes the name atomically (it fails on a name taken
    meanwhile); where the file system has none, a rename after the check."""
    _sync(tmp)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError:
        if path.exists():
            return False
        os.replace(tmp, path)
        return True
    os.unlink(tmp)
    return True

"""torch's own Flight Recorder dumps, saved beside commtag's: every torch recorder that holds this
rank's calls, each in its own file.

torch keeps one recorder per kind of backend (see :mod:`commtag.vocab.flight_recorder`, ``FR_DUMP``):
the default one (gloo's), from torch 2.15 one per backend its c10d hook records (nccl2, custom
backends), and, in CUDA builds, the legacy ProcessGroupNCCL's. Each numbers its own entries, so each is
saved alone, named ``<prefix><rank>`` as torch names its dumps: torch's analyzer reads one recorder's
files with ``-p PREFIX``, and commtag's reader finds each by its rank.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional

from commtag.atomic import write_atomic
from commtag.runtime.describe.groups import backend_impls
from commtag.runtime.failopen import log_once
from commtag.vocab import flight_recorder as fr
from commtag.vocab.nccl2 import BACKEND_NCCL

#: torch's default recorder of rank R is saved as ``torch_fr_<R>``, legacy NCCL's as
#: ``torch_fr_nccl_<R>``, the recorder of a backend torch's hook records as ``torch_fr_<backend>_<R>``.
TORCH_PREFIX = "torch_fr_"
#: What a backend's name may keep in a file name (the rest becomes "_").
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def recorder_prefix(backend: Optional[str] = None) -> str:
    """The file prefix of a backend's recorder (None: torch's default recorder)."""
    return TORCH_PREFIX if backend is None else f"{TORCH_PREFIX}{_UNSAFE.sub('_', backend)}_"


class Recorders(NamedTuple):
    """Which of torch's recorders besides the default one hold this process's calls."""

    #: A group runs on the legacy ProcessGroupNCCL, which records into its own recorder.
    legacy_nccl: bool = False
    #: The backends torch's c10d hook records, each into its own recorder (torch 2.15 on).
    hooked: tuple[str, ...] = ()


def recorders_in_use(dist_c10d: Any = None) -> Recorders:
    """The recorders this process's groups feed, read from ``torch.distributed.distributed_c10d``: each
    group's backends by the names they give themselves, and, where torch hooks groups, the hooked groups'
    backends that do not record natively (torch's own ``_FR_SELF_RECORDING_BACKENDS`` and commtag's
    :data:`fr.FR_NATIVE_BACKENDS`)."""
    if dist_c10d is None:
        from torch.distributed import distributed_c10d as dist_c10d
    world = dist_c10d._world
    hooks = getattr(world, fr.FR_HOOKS_ATTR, None)
    self_recording = getattr(dist_c10d, fr.FR_SELF_RECORDING_ATTR, None)
    legacy = False
    hooked: set[str] = set()
    for pg in list(world.pg_map):
        names = set(backend_impls(pg).values())
        legacy = legacy or BACKEND_NCCL in names
        if hooks is not None and self_recording is not None and pg in hooks:
            hooked |= names - set(self_recording) - fr.FR_NATIVE_BACKENDS
    return Recorders(legacy, tuple(sorted(hooked)))


def parameter_names(function: Any) -> tuple[str, ...]:
    """A function's parameter names: from its signature, or, for a pybind11 function (which has none),
    from the first line of its docstring, where pybind11 writes the signature as Python would;
    () where neither says them."""
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        pass
    line = str(getattr(function, "__doc__", None) or "").split("\n", 1)[0].strip()
    try:
        tree = ast.parse(f"def {line}:\n    pass\n")
    except SyntaxError:
        return ()
    definition = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(definition, ast.FunctionDef):
        return ()
    args = definition.args
    return tuple(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def save_torch_dumps(folder: Path, rank: int, c10d: Any, recorders: Recorders) -> list[Path]:
    """Each recorder's dump (collectives and stack traces, every entry) written as its own file in
    ``folder``; a hooked backend's only where this torch's dump takes ``backend=``. One that cannot be
    dumped is logged once and the others are still saved."""
    dumps: list[tuple[str, str, dict[str, str]]] = [(recorder_prefix(), fr.FR_DUMP, {})]
    if recorders.legacy_nccl:
        dumps.append((recorder_prefix(BACKEND_NCCL), fr.FR_NCCL_DUMP, {}))
    if recorders.hooked:
        if fr.FR_BACKEND_KEYWORD in parameter_names(getattr(c10d, fr.FR_DUMP, None)):
            dumps.extend((recorder_prefix(name), fr.FR_DUMP, {fr.FR_BACKEND_KEYWORD: name})
                         for name in recorders.hooked)
        else:
            log_once(f"saving torch's recorders of {', '.join(recorders.hooked)}",
                     TypeError(f"this torch's {fr.FR_DUMP} takes no {fr.FR_BACKEND_KEYWORD}="))
    saved = []
    for prefix, name, keywords in dumps:
        path = folder / f"{prefix}{rank}"
        try:
            dump: Callable[..., bytes] = getattr(c10d, name)
            write_atomic(path, dump(True, True, False, **keywords))
        except Exception as exc:  # noqa: BLE001 - fail open: commtag's dump and the other recorders' stand
            log_once(f"saving torch's flight-recorder dump {prefix}<rank> beside commtag's", exc)
            continue
        saved.append(path)
    return saved


def save_beside(folder: Path, rank: int) -> list[Path]:
    """torch's dumps of this rank, where its recorders are on (they are unless their size is set to 0)."""
    if fr.torch_ring_size(os.environ) <= 0:
        return []
    import torch._C._distributed_c10d as c10d

    try:
        recorders = recorders_in_use()
    except Exception as exc:  # noqa: BLE001 - fail open: the default recorder is still saved
        log_once("finding torch's flight recorders", exc)
        recorders = Recorders()
    return save_torch_dumps(folder, rank, c10d, recorders)

"""A rank's sidecar on disk: validated JSON, written atomically, read strictly.

Naming scheme (one profiled window of one rank, in the trace directory)::

    rank{R}.step{S}[.{K}].pt.trace.json.gz    the Kineto trace
    rank{R}.step{S}[.{K}].commtag.json        its sidecar

where R is the global rank and S the profiler steps the trace holds (see
:func:`commtag.runtime.record.recorder.profiled_steps`): ``2-3`` for
ProfilerStep#2 and #3, ``5`` for #5 alone; a profile without a schedule
has no step markers and S is its ``step_num``, the number of
``prof.step()`` calls (0 without any). A name is never reused: when a
profile finds the name taken in the directory (an earlier profile of the
same steps, such as one ``with profile()`` per epoch) it takes ``.2``,
``.3``, ... as K. The sidecar names its trace in ``trace_file`` so a renamed
pair still matches.

Writing validates the exact JSON that goes to disk against the schema and
writes it with :func:`commtag.atomic.write_atomic`, so a reader never sees half
a file. Reading refuses anything that is not a
complete sidecar of a version this commtag understands, with an error that
names the file and the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import orjson
from pydantic import ValidationError

from commtag.atomic import claim, write_atomic
from commtag.constants import TRACE_SUFFIX, newer_version, sidecar_name_for
from commtag.errors import CommtagError
from commtag.schema import SIDECAR_KIND, Sidecar


class SidecarError(CommtagError, ValueError):
    """A sidecar file that cannot be used; the message names the file."""


def trace_name(rank: int, steps: Union[int, str], copy: int = 1) -> str:
    """The trace's name (module docstring); ``copy`` > 1 is the K of a name already taken."""
    return f"rank{rank}.step{steps}{f'.{copy}' if copy > 1 else ''}{TRACE_SUFFIX}"


def sidecar_name(rank: int, steps: Union[int, str], copy: int = 1) -> str:
    return sidecar_name_for(trace_name(rank, steps, copy))


def publish_trace(tmp: Path, rank: int, steps: Union[int, str]) -> str:
    """Move the finished trace ``tmp`` to the first free trace name in its directory; return that name.

    Free means neither the trace nor its sidecar exists; :func:`commtag.atomic.claim`
    takes a name only if it is still free.
    """
    copy = 0
    while True:
        copy += 1
        name = trace_name(rank, steps, copy)
        if tmp.with_name(sidecar_name_for(name)).exists():
            continue
        if claim(tmp, tmp.with_name(name)):
            return name


def dumps(sidecar: Sidecar) -> bytes:
    """The sidecar's JSON, validated again from the bytes themselves (what is written is what is checked)."""
    data = orjson.dumps(sidecar.model_dump(mode="json", by_alias=True, exclude_none=True))
    Sidecar.model_validate(orjson.loads(data))
    return data


def write_sidecar(path: Union[str, Path], sidecar: Sidecar) -> Path:
    """Validate and atomically write one sidecar."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, dumps(sidecar))


def read_sidecar(path: Union[str, Path]) -> Sidecar:
    """Load and validate a sidecar; raise :class:`SidecarError` naming the file and the problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SidecarError(f"{path}: cannot read sidecar: {exc.strerror or exc}") from exc
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SidecarError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != SIDECAR_KIND:
        found = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise SidecarError(f"{path}: not a commtag sidecar (kind is {found!r}, expected {SIDECAR_KIND!r})")
    problem = newer_version(data.get("schema_version"))
    if problem:  # before the fields: a newer format may name them otherwise
        raise SidecarError(f"{path}: {problem}")
    try:
        return Sidecar.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise SidecarError(f"{path}: invalid sidecar: {problems}") from exc

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

Writing validates the exact JSON that goes to disk with the reader every
sidecar is read with (:mod:`commtag.sidecarfile`, shared with the merge) and
writes it with :func:`commtag.atomic.write_atomic`, so a reader never sees half
a file, nor one it refuses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import orjson

from commtag.atomic import claim, write_atomic
from commtag.constants import TRACE_SUFFIX, sidecar_name_for
from commtag.schema import Sidecar
from commtag.sidecarfile import check_sidecar_bytes


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


def dumps(sidecar: Sidecar, path: Union[str, Path, None] = None) -> bytes:
    """The sidecar's JSON, read back as every reader will (what is written is what is checked);
    ``path``: where it goes (by default the name beside its trace), named by a refusal."""
    data = orjson.dumps(sidecar.model_dump(mode="json", by_alias=True, exclude_none=True))
    check_sidecar_bytes(data, sidecar_name_for(sidecar.trace_file) if path is None else path)
    return data


def write_sidecar(path: Union[str, Path], sidecar: Sidecar) -> Path:
    """Validate and atomically write one sidecar."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, dumps(sidecar, path))

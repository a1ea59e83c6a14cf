"""Plain values without pydantic: the sidecar format's names, sizes and limits.

Split from :mod:`commtag.schema` so the merge can read a trace that has no
sidecar without importing pydantic (a tenth of a second of start-up). What
Kineto, NCCL and CUDA call things is in :mod:`commtag.vocab`.
"""

from __future__ import annotations

import re
from typing import Final, Literal, Optional, get_args

#: The sidecar format's version. 2 added each group's ``backend_impls`` and ``record_format`` and the
#: ``commtag send peers`` / ``commtag recv peers`` args: a reader of 1 would refuse them as unknown
#: fields, so it is told to upgrade instead. 3 added ``unwatched``, the spans in which commtag was
#: not installed. Every version up to this one is read.
SCHEMA_VERSION = 3
#: A sidecar's "kind": the Literal type commtag.schema validates against, and its one value.
SidecarKind = Literal["commtag-sidecar"]
SIDECAR_KIND: Final[SidecarKind] = get_args(SidecarKind)[0]
#: Names commtag.trace_handler gives a rank's trace and its sidecar: ``<stem>`` + suffix.
TRACE_SUFFIX = ".pt.trace.json.gz"
SIDECAR_SUFFIX = ".commtag.json"
#: Endings of profiler trace names, longest first: what a sidecar's name replaces.
TRACE_NAME_ENDINGS = (TRACE_SUFFIX, ".pt.trace.json", ".json.gz", ".json")
#: The first bytes of every gzip stream: traces, sidecars and .pftrace files come both ways.
GZIP_MAGIC = b"\x1f\x8b"

#: Every *_ns time is below this: Perfetto and Kineto keep nanoseconds in an int64.
TIME_NS_LIMIT = 1 << 63
#: Longest duration an event or a recorded call may claim (a day): beyond it the file is corrupt, not slow.
MAX_DUR_US = 86_400 * 10**6
#: How far past the merging machine's clock a file's times may reach (a day): beyond it its
#: clock is absurd (a base time shifted by years), not a real run's.
MAX_AHEAD_NS = 86_400 * 10**9

#: Most elements one message may count: its tensor lives in one process's memory, which 57-bit
#: virtual addresses (5-level paging, the widest CPUs) bound to 2**57 bytes, at a byte or more each.
MAX_NELEMS = 1 << 57

#: Most spans a sidecar's ``unwatched`` lists: the runtime joins its oldest beyond it (more time
#: counted as unwatched, never less), and the merge's cost of cutting windows by them stays small.
MAX_UNWATCHED_SPANS = 256

#: Lowest virtual lane id; PyTorch's own per-group lanes start here too.
MIN_LANE_ID = 60


def newer_version(version: object) -> Optional[str]:
    """Why a sidecar of schema ``version`` cannot be read (a format newer than this commtag's), or None."""
    if isinstance(version, int) and version > SCHEMA_VERSION:
        return (f"sidecar schema version {version} is newer than this commtag supports ({SCHEMA_VERSION}); "
                "upgrade commtag")
    return None


#: A list string as the profiler writes ranks and split sizes: ``"[0, 2, 4]"``, ``"[]"``, or a long
#: list cut short, ``"[0, 1, 2, ..., 127]"``; non-negative integers only.
RANK_LIST = re.compile(r"^\[(\d+(, \d+)*(, \.\.\., \d+)?)?\]$")


def parse_rank_list(text: str) -> Optional[list[int]]:
    """Return the ranks of a ``"[0, 2, 4]"`` string, or None when truncated or empty."""
    if text in ("", "[]") or "..." in text:
        return None
    return [int(part) for part in text[1:-1].split(", ")]


def sidecar_name_for(trace_name: str) -> str:
    """The name of the sidecar written beside a trace of this name (``rank2.step5.commtag.json``)."""
    for ending in TRACE_NAME_ENDINGS:
        if trace_name.endswith(ending):
            return trace_name[: -len(ending)] + SIDECAR_SUFFIX
    return trace_name + SIDECAR_SUFFIX

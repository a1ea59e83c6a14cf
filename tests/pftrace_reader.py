"""The merge tests' name for commtag's own strict .pftrace reader.

trace_processor is not available offline; :func:`commtag.merge.pftrace.readback.read_trace`
resolves interned names, nested slices, debug annotations and flows the way it
would, and raises on dangling ids or unpaired ENDs, so a writer bug fails a test.
"""

from commtag.merge.pftrace.readback import ParsedTrace as Parsed
from commtag.merge.pftrace.readback import Slice
from commtag.merge.pftrace.readback import read_trace as read

__all__ = ["Parsed", "Slice", "lane_of", "read"]


def lane_of(parsed: Parsed, slice_: Slice) -> "tuple[int, str] | None":
    """(rank, lane name) of a slice on a member row of the process-group view, None for any other.

    The view: a top-level track group per process group, named as its lane, with a row
    ``rank R`` per member rank (commtag.merge.pftrace.views).
    """
    path = parsed.name_path(slice_.track)
    if len(path) == 2 and parsed.process_of(slice_.track) is None and path[1].startswith("rank "):
        return int(path[1].split(" ")[1]), path[0]
    return None

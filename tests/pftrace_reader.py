"""The merge tests' name for commtag's own strict .pftrace reader.

trace_processor is not available offline; :func:`commtag.merge.readback.read_trace`
resolves interned names, nested slices, debug annotations and flows the way it
would, and raises on dangling ids or unpaired ENDs, so a writer bug fails a test.
"""

from commtag.merge.readback import ParsedTrace as Parsed
from commtag.merge.readback import Slice
from commtag.merge.readback import read_trace as read

__all__ = ["Parsed", "Slice", "read"]

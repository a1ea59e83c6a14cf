"""A hung job from its Flight Recorder dumps: read (torch's and commtag's), diagnosed, reported."""

from commtag.merge.hangs.diagnose import Diagnosis, Hang, diagnose
from commtag.merge.hangs.dumps import DumpError, FrDump, find_dumps, read_dumps

__all__ = ["Diagnosis", "DumpError", "FrDump", "Hang", "diagnose", "find_dumps", "read_dumps"]

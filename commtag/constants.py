"""Plain values without pydantic: the sidecar format's names, sizes and limits, and Kineto's own names.

Split from :mod:`commtag.schema` so the merge can read a trace that has no
sidecar without importing pydantic (a tenth of a second of start-up);
:mod:`commtag.schema` re-exports every name here.
"""

from __future__ import annotations

from typing import Optional

SCHEMA_VERSION = 1
SIDECAR_KIND = "commtag-sidecar"
#: Names commtag.trace_handler gives a rank's trace and its sidecar: ``<stem>`` + suffix.
TRACE_SUFFIX = ".pt.trace.json.gz"
SIDECAR_SUFFIX = ".commtag.json"
#: Endings of profiler trace names, longest first: what a sidecar's name replaces.
TRACE_NAME_ENDINGS = (TRACE_SUFFIX, ".pt.trace.json", ".json.gz", ".json")

#: c10d CPU ops (as Kineto names them) whose gloo work runs on the calling thread, as
#: ``gloo:send``/``gloo:recv`` events, instead of as one ``gloo:<collective>`` event on a worker:
#: monitored_barrier sends to and receives from group rank 0 inside ProcessGroupGloo.
C10D_OPS_WITHOUT_GLOO_WORK = frozenset({"c10d::monitored_barrier_"})

#: The CPU op in which ProcessGroupNCCL records each call's eager keys; Kineto copies
#: part of them onto the call's NCCL kernel, if the kernel was profiled at all.
COMMS_OP = "record_param_comms"
#: "Collective name" values of COMMS_OP that are no collective: a Work's wait, a
#: communicator's creation.
NON_COLLECTIVE_NAMES = frozenset({"wait", "init"})
#: Older torch wrote the group as this integer key instead of "Process Group Name":
#: the group's "uid" in distributedInfo's pg_config, whose "pg_name" is the name.
PG_ID_KEY = "Process Group ID"
#: gloo (torch 2.13) runs a collective as ``gloo:<op>`` events of another family here: both
#: reduce_scatters run as all_reduce works (families as commtag.merge.attach.family names them).
GLOO_WORK_FAMILY = {"reducescatter": "allreduce"}
#: Collective names gloo runs as one work per group member (the list reduce_scatter), each
#: on a worker thread of the group; every other collective is one work.
GLOO_WORK_PER_MEMBER = frozenset({"reduce_scatter"})
#: Families whose gloo work runs on the calling thread, starting inside its c10d op (p2p);
#: the rest run on the group's own worker threads (``pt_gloo_runloop``), in queue order.
GLOO_CALLER_FAMILIES = frozenset({"send", "recv"})

#: Key commtag adds to the annotation it hands torch's ``mark_kernels`` for a captured
#: collective (where the user turned torch's graph annotations on): ``"<capture id>.<n>"``, the
#: n-th collective commtag saw in that capture. torch's exporter bakes it into the replayed
#: events' args; the sidecar's captured collective carries the same value (``torch_mark``).
TORCH_MARK_KEY = "commtag graph mark"
#: Arg of a graphed event the merge put back on the stream it ran on: the lane torch had moved
#: it to (a process group's lane, which commtag's own lane of that group replaces).
TORCH_LANE_ARG = "commtag torch lane"

#: Every *_ns time is below this: Perfetto and Kineto keep nanoseconds in an int64.
TIME_NS_LIMIT = 1 << 63

#: Lowest virtual lane id; PyTorch's own per-group lanes start here too.
MIN_LANE_ID = 60


#: Categories of Kineto's Chrome JSON before torch 1.11 (libkineto's output_json.cpp until
#: the end of 2021) -> today's name for the same activity. ``gpu_user_Annotation`` is the
#: capital-A spelling libkineto's ActivityType table had in 2021.
KINETO_LEGACY_CATEGORIES: dict[str, str] = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "User": "gpu_user_annotation",
    "gpu_user_Annotation": "gpu_user_annotation",
}
#: How old Kineto named a GPU row in ``tid``: ``"stream 7"`` (today: ``tid`` 7 on the device's pid).
KINETO_STREAM_TID_PREFIX = "stream "
#: The name of the slice torch's profiler writes around each ``prof.step()``: ``ProfilerStep#<N>``.
PROFILER_STEP_PREFIX = "ProfilerStep#"
#: Categories of Kineto's flow events ("s"/"f") from a runtime launch to its device work: today
#: ``ac2g``, ``async`` (2020-21, named "launch") and ``async_gpu`` (late 2021). They join events
#: by the ``correlation`` both ends carry.
KINETO_LAUNCH_FLOW_CATEGORIES = frozenset({"ac2g", "async", "async_gpu"})


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

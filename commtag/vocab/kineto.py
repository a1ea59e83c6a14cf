"""What Kineto calls things in a trace: categories, args, flows."""

from __future__ import annotations


#: The CPU op in which ProcessGroupNCCL records each call's eager keys; Kineto copies
#: part of them (:data:`KERNEL_EAGER_KEYS`) onto the call's NCCL kernel, if it was profiled.
COMMS_OP = "record_param_comms"
#: The CPU op of a c10d collective ("c10d::allreduce_"), as Kineto names it.
C10D_OP_PREFIX = "c10d::"
#: "Collective name" values of COMMS_OP that are no collective: a Work's wait, a
#: communicator's creation.
NON_COLLECTIVE_NAMES = frozenset({"wait", "init"})
#: Older torch wrote the group as this integer key instead of "Process Group Name":
#: the group's "uid" in distributedInfo's pg_config, whose "pg_name" is the name.
PG_ID_KEY = "Process Group ID"
#: Kineto's category of a GPU kernel.
KERNEL_CATEGORY = "kernel"
#: The graph node type the runtime records for a kernel node (``GraphNodeRecord.node_type``).
KERNEL_NODE_TYPE = "kernel"
#: Kineto categories of device-side events (their pid is the device).
GPU_CATEGORIES = frozenset({KERNEL_CATEGORY, "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "gpu_memory"})
#: Kineto's MTIA activities (libkineto/include/ActivityType.h, MTIA_RUNTIME "host side MTIA runtime
#: events" and MTIA_CCP_EVENTS "MTIA ondevice CCP events"; their names in ActivityType.cpp's table):
#: the runtime call and the device work it launched carry the same "correlation", as CUDA's do.
MTIA_RUNTIME_CATEGORY = "mtia_runtime"
MTIA_DEVICE_CATEGORY = "mtia_ccp_events"
#: The category of device work -> the kind of device whose row it is on. A device event's pid is the
#: device's index and may equal the host process's own pid (pid 1 in a container): only its
#: category tells a device row from a thread. ``cuda_profiler_range`` (CUDA_PROFILER_RANGE, "CUPTI
#: Profiler range for performance metrics") is written on the device's rows too.
DEVICE_KINDS: dict[str, str] = {**{cat: "GPU" for cat in sorted(GPU_CATEGORIES)}, "cuda_profiler_range": "GPU",
                                MTIA_DEVICE_CATEGORY: "MTIA"}
#: Host-side events that launch device work (same "correlation" as the work); HIP's
#: runtime calls are filed under the same names.
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", MTIA_RUNTIME_CATEGORY})
#: The "process_labels" Kineto gives the host process ("CPU"), and how it begins a GPU's ("GPU 0").
KINETO_HOST_LABEL = "CPU"
KINETO_GPU_LABEL_PREFIX = "GPU"
#: How Kineto's "thread_name" of a host thread begins ("thread 2910249 (pt_main_thread)"); a
#: device's rows are named by their resource ("stream 7 ").
KINETO_HOST_THREAD_PREFIX = "thread "
#: Categories of device work a graph node can be, and the node type the runtime records
#: for it (``GraphNodeRecord.node_type``).
MEMCPY_NODE_TYPE = "memcpy"
MEMSET_NODE_TYPE = "memset"
DEVICE_WORK_NODE_TYPES: dict[str, str] = {KERNEL_CATEGORY: KERNEL_NODE_TYPE, "gpu_memcpy": MEMCPY_NODE_TYPE,
                                          "gpu_memset": MEMSET_NODE_TYPE}
#: Device work categories torch's CUDA-graph annotation pass (2.14+) reads and moves: those a
#: graph node can be (not gpu_user_annotation).
TORCH_ANNOTATED_CATEGORIES = frozenset(DEVICE_WORK_NODE_TYPES)
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
#: Other tools' JSON that a folder of traces may hold: a key each writes at its top -> what it is.
#: rocprofiler-sdk's rocprofv3 ``--output-format json`` writes ``<pid>_results.json``, one object
#: under ``"rocprofiler-sdk-tool"`` per process (source/lib/output/generateJSON.cpp: open_json,
#: write_json), its own records (metadata, agents, buffer_records), not a Chrome trace's traceEvents.
FOREIGN_JSON_KEYS: dict[bytes, str] = {
    b'"rocprofiler-sdk-tool"': "rocprofiler-sdk's JSON (rocprofv3 --output-format json)",
}
#: HTA's critical-path overlay (hta/analyzers/critical_path_analysis.py, overlay_critical_path_analysis,
#: and hta/common/trace.py, Trace.flow_event) adds to one rank's trace a flow ("s" then "f", "bp": "e",
#: name "critical_path") per edge of its path, its category that edge's CPEdgeType value
#: ("critical_path_dependency", "critical_path_kernel_launch_delay", ...; "critical_path" alone in
#: older overlays), and marks each event on the path with this arg set to 1.
HTA_CRITICAL_PATH_CATEGORY_PREFIX = "critical_path"
HTA_CRITICAL_ARG = "critical"
#: The scope (``"s"``) of an instant that belongs to the whole trace, not to a thread (Chrome trace format).
GLOBAL_INSTANT_SCOPE = "g"
#: Kineto's trace-wide instants (libkineto/src/output_json.cpp, ChromeTraceLogger): handleTraceSpan
#: writes ``"Iteration Start: <span>"`` with pid ``"Traces"`` and tid ``"Trace <span>"``, and
#: finalizeTrace ends the file with ``"Record Window End"`` with pid ``""`` and tid ``""``; both
#: global-scope. torch's span is named ``"PyTorch Profiler"``: the row of its window's start.
KINETO_TRACE_ROW = ("Traces", "Trace PyTorch Profiler")
#: The name of the slice torch's profiler writes around each ``prof.step()``: ``ProfilerStep#<N>``.
PROFILER_STEP_PREFIX = "ProfilerStep#"
#: Kineto's category of a host-side record_function range (a ProfilerStep among them); its copy on a
#: GPU stream is ``gpu_user_annotation``.
USER_ANNOTATION_CATEGORY = "user_annotation"
#: Categories of Kineto's flow events ("s"/"f") from a runtime launch to its device work: today
#: ``ac2g``, ``async`` (2020-21, named "launch") and ``async_gpu`` (late 2021). They join events
#: by the ``correlation`` both ends carry.
KINETO_LAUNCH_FLOW_CATEGORIES = frozenset({"ac2g", "async", "async_gpu"})
#: Arg joining a CPU op to the launches it made (and, for NCCL, an op to its kernel).
EXTERNAL_ID_KEY = "External id"
#: Arg joining a runtime launch to the device work it launched: both ends carry it.
CORRELATION_KEY = "correlation"
#: The shapes of an op's inputs, one list per tensor (written with ``record_shapes``).
INPUT_DIMS_KEY = "Input Dims"
#: Arg numbering a CPU op within its trace.
EV_IDX_KEY = "Ev Idx"
#: Arg giving a runtime launch's CUPTI callback id.
CBID_KEY = "cbid"
#: CUPTI's runtime callback id of cudaGraphLaunch (CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000),
#: the "cbid" Kineto writes on a graph launch.
CUDA_GRAPH_LAUNCH_CBID = 311
#: Arg giving a CPU op its record function's id.
RECORD_FUNCTION_ID_KEY = "Record function id"
#: Args that number events within one trace: the op/launch links and the Python tracer's ids
#: (a copy of a trace's events, as the scale-set generator tiles them, offsets these).
KINETO_ID_ARGS: tuple[str, ...] = (EXTERNAL_ID_KEY, CORRELATION_KEY, "Python id", "Python parent id", EV_IDX_KEY)
#: Args that only link or number events: once the merge has drawn its flows from them they say
#: nothing to a reader, so the merged slices leave them out.
LINK_ARGS = frozenset({EXTERNAL_ID_KEY, CORRELATION_KEY, CBID_KEY, EV_IDX_KEY, RECORD_FUNCTION_ID_KEY})
#: A time torch's profiler never set: an event still running, or not begun, as the profile ended can
#: carry the largest int64 in nanoseconds (seen on a gloo work's ``gloo:all_reduce`` running at a
#: window's end, torch 2.13: its ``ts`` plus the trace's ``baseTimeNanoseconds`` reads INT64_MAX ns;
#: torch's own handling of such events: pytorch/pytorch#124080, #150131, #178168). A start within
#: TORCH_UNSET_SLACK_NS of it (the JSON's float microseconds round it) is this placeholder, not a time.
TORCH_UNSET_TIME_NS = (1 << 63) - 1
TORCH_UNSET_SLACK_NS = 1000

"""NCCL Inspector's JSON dumps: what its profiler plugin writes, and what each field means.

Read from NCCL's source (github.com/NVIDIA/nccl at 5067397c, plugins/profiler/inspector/;
ext-profiler/inspector/ before 2.29.7). inspector.cc opens one file per process,
``<hostname>-pid<pid>.log``; inspector_json.cc (inspectorCommInfoDumpColl) writes one JSON object a
line per completed collective: ``header`` (the communicator), ``metadata`` (the process and the
dump) and ``coll_perf`` (the collective), all three on every line; point-to-point operations get
lines of their own with ``p2p_perf`` instead. Every writer in NCCL's history (2.28.1 to 5067397c)
stamps format ``v4.0``; there is no other layout to read. A communicator's lines come in the order
its operations completed: each dump drains its ring of completed operations first to last.
"""

from __future__ import annotations

import re

#: An Inspector dump file's name: ``<hostname>-pid<pid>.log`` (inspector.cc, the output file's snprintf).
INSPECTOR_FILE = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log$")
#: The format versions read (``metadata.inspector_output_format_version``): the only one NCCL writes
#: (inspector_json.cc, inspectorCommInfoMetaHeader).
INSPECTOR_VERSIONS = frozenset({"v4.0"})
#: A line's three objects (inspector_json.cc, inspectorCommInfoDumpColl), and the one a p2p line has
#: instead of ``coll_perf`` (inspectorCommInfoDumpP2p).
INSPECTOR_HEADER = "header"
INSPECTOR_METADATA = "metadata"
INSPECTOR_COLL_PERF = "coll_perf"
INSPECTOR_P2P_PERF = "p2p_perf"
#: ``header`` (inspector_json.cc, inspectorCommInfoHeader): the communicator's hash, its name, this
#: process's rank in it, its size, its nodes. ``comm_name`` is what the application named it
#: (``unknown`` where unset): torch names a process group's communicator ``"<group_desc>:<group_name>"``
#: (ProcessGroupNCCL's commName).
HEADER_ID, HEADER_COMM_NAME, HEADER_RANK, HEADER_N_RANKS, HEADER_NNODES = "id", "comm_name", "rank", "n_ranks", "nnodes"
#: ``metadata`` (inspector_json.cc, inspectorCommInfoMetaHeader, written again on every line): the
#: format version, the host and process that wrote it, when the line was dumped (us since the epoch).
META_VERSION, META_HOSTNAME, META_PID, META_DUMP_US = (
    "inspector_output_format_version", "hostname", "pid", "dump_timestamp_us")
#: ``coll_perf`` (inspector_json.cc, inspectorCompletedColl): NCCL's collective name (ncclFuncToString:
#: ``AllReduce``), its sequence number, the message size (bytes), the execution time (whole us), where the
#: time came from, and the bandwidths NCCL computed (GB/s; inspector.cc, inspectorComputeOpBw).
#: ``coll_sn`` is the communicator's count of earlier collectives of the same function, from 0
#: (src/plugin/profiler.cc passes ``comm->seqNumber[func]``, one counter per NCCL function): an
#: AllReduce and an AllGather of one communicator number apart, so records are ordered by the file,
#: never by ``coll_sn`` across functions. It counts NCCL operations, not torch calls (one c10d call
#: may issue several; a CUDA-graph replay counts, as the plugin asks for kernel channel events).
#: From NCCL 2.29.2 a Broadcast runs as a batched AllGatherV by default (src/enqueue.cc,
#: NCCL_ALLGATHERV_ENABLE, outside a confidential-compute communicator), a task the profiler is never
#: told of (src/plugin/profiler.cc starts events for the plan's collective tasks only): it has no record.
COLL_NAME, COLL_SN, COLL_BYTES, COLL_EXEC_US, COLL_SOURCE, COLL_ALGBW, COLL_BUSBW = (
    "coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us", "coll_timing_source", "coll_algobw_gbs",
    "coll_busbw_gbs")
#: ``coll_timing_source``: GPU kernel timing, or the CPU fallbacks (inspector.cc, inspectorTimingSourceToString).
TIMING_SOURCES = frozenset({"kernel_gpu", "kernel_cpu", "collective_cpu"})
#: NCCL collectives whose Inspector message size is one rank's share: the size is the type size times
#: the operation's count (inspector_plugin.cc, inspectorPluginCollInfoInit), and that count is per rank
#: for them (src/collectives.cc: AllGather's sendcount, ReduceScatter's recvcount; inspectorComputeOpBw
#: multiplies these two by the ranks for algbw). Times the ranks, the collective's bytes.
PER_RANK_SIZE = frozenset({"AllGather", "ReduceScatter"})

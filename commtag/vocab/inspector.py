"""NCCL Inspector's JSON dumps: what its profiler plugin writes, and what each field means.

The plugin (NCCL's plugins/profiler/inspector, formerly ext-profiler/inspector: inspector.cc
collects, its JSON writer writes) dumps one file per process, ``<hostname>-pid<pid>.log``, one
JSON object a line. Up to format v4.2 every line holds ``header`` (the communicator), ``metadata``
(the process and the dump) and ``coll_perf`` (one completed collective); v4.3 writes ``header``
and ``metadata`` once per communicator, in a ``dump_stats`` record, and the ``coll_perf`` lines
after it are that communicator's.
"""

from __future__ import annotations

import re

#: An Inspector dump file's name: ``<hostname>-pid<pid>.log`` (the plugin's output file name).
INSPECTOR_FILE = re.compile(r"^(?P<host>.+)-pid(?P<pid>\d+)\.log$")
#: The format versions read (``metadata.inspector_output_format_version``).
INSPECTOR_VERSIONS = frozenset({"v4.0", "v4.1", "v4.2", "v4.3"})
#: The v4.3 record holding a communicator's ``header`` and ``metadata`` once.
INSPECTOR_DUMP_STATS = "dump_stats"
INSPECTOR_HEADER = "header"
INSPECTOR_METADATA = "metadata"
INSPECTOR_COLL_PERF = "coll_perf"
#: ``header``: the communicator's hash, its name, this process's rank in it, its size, its nodes.
#: ``comm_name`` is what the application named it: torch names a process group's communicator
#: ``"<group_desc>:<group_name>"`` (ProcessGroupNCCL's commName), ``unknown`` where unset.
HEADER_ID, HEADER_COMM_NAME, HEADER_RANK, HEADER_N_RANKS, HEADER_NNODES = "id", "comm_name", "rank", "n_ranks", "nnodes"
#: ``metadata``: the format version, the host and process that wrote it, when it was dumped (us since the epoch).
META_VERSION, META_HOSTNAME, META_PID, META_DUMP_US = (
    "inspector_output_format_version", "hostname", "pid", "dump_timestamp_us")
#: ``coll_perf``: NCCL's collective name (``AllReduce``), its sequence number on the communicator
#: (it counts NCCL operations, not torch calls: one c10d call may issue several, a CUDA-graph
#: replay issues its own), the message size (bytes), the execution time (us), where the time
#: came from, and the bandwidths NCCL computed (GB/s).
COLL_NAME, COLL_SN, COLL_BYTES, COLL_EXEC_US, COLL_SOURCE, COLL_ALGBW, COLL_BUSBW = (
    "coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us", "coll_timing_source", "coll_algobw_gbs",
    "coll_busbw_gbs")
#: ``coll_timing_source``: GPU kernel timing, or the CPU fallbacks.
TIMING_SOURCES = frozenset({"kernel_gpu", "kernel_cpu", "collective_cpu"})
#: NCCL collectives whose Inspector message size is one rank's share (NCCL's API count for them is
#: per rank: sendcount of AllGather, recvcount of ReduceScatter): times the ranks, the collective's bytes.
PER_RANK_SIZE = frozenset({"AllGather", "ReduceScatter"})

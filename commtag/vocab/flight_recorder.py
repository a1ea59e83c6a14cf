"""torch's Flight Recorder (FR) dumps: their files, keys, states and what torch's analyzer checks.

Sources: torch/csrc/distributed/c10d/FlightRecorder.hpp and FlightRecorderDetail.hpp (the ring,
its entries and the pickle/JSON writers ``_dump_fr_trace`` and ``_dump_fr_trace_json``), and
torch/distributed/flight_recorder/components/{loader,types,utils}.py (the analyzer ``fr_trace``).
Measured with torch 2.13 on gloo: version "2.10", ``state`` always "scheduled", send/recv not
recorded, ``pg_config`` one entry keyed "" whose ``ranks`` is "[]" (the analyzer then fails),
``comm_lib_version`` "", ``thread_name`` "python" and ``thread_id`` the thread's id in decimal.

Each release's writer was read from its wheel (:data:`FR_WRITERS`): the headers
torch/include/torch/csrc/distributed/c10d/FlightRecorder.hpp and FlightRecorderDetail.hpp, and, for
torch 2.15, hooks/FlightRecorderHook.hpp, torch/distributed/distributed_c10d.py and the analyzer's
components/types.py. torch 2.11.0 to 2.15.0 write the same version and keys.
"""

from __future__ import annotations

from typing import Mapping, Optional

from commtag.vocab.nccl2 import BACKEND_GLOO, BACKEND_NCCL

#: The environment variable naming the dump files' prefix; each rank writes ``<prefix><rank>``
#: (FlightRecorder.cpp ``DebugInfoWriter::getWriter`` reads TORCH_FR_DUMP_TEMP_FILE, then the older
#: TORCH_NCCL_DEBUG_INFO_TEMP_FILE).
FR_DUMP_PREFIX_ENV = "TORCH_FR_DUMP_TEMP_FILE"
#: torch's file name prefix when the variable is unset, in its cache folder: ``$XDG_CACHE_HOME/torch``,
#: else ``$HOME/.cache/torch`` (FlightRecorder.cpp ``DebugInfoWriter::getWriter``; the strings
#: "TORCH_FR_DUMP_TEMP_FILE", "XDG_CACHE_HOME", "HOME", "/tmp", "/.cache", "/torch" and "comm_lib_trace_r..."
#: in the torch 2.13.0 and 2.15.0 wheels' libtorch_cpu.so).
FR_DEFAULT_DUMP_NAME = "comm_lib_trace_rank_"
#: How many entries each rank's ring keeps, then the older TORCH_NCCL_TRACE_BUFFER_SIZE; 0 turns the
#: recorder off. Neither set: 2,000 (FlightRecorder.hpp ``FlightRecorder()``, torch 2.11.0-2.15.0), so
#: gloo's groups record by default (measured with torch 2.13, neither variable set).
FR_BUFFER_SIZE_ENV = "TORCH_FR_BUFFER_SIZE"
FR_OLD_BUFFER_SIZE_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
FR_DEFAULT_ENTRIES = 2000


def torch_ring_size(environ: Mapping[str, str]) -> int:
    """How many entries torch's recorder keeps in a process with ``environ`` (0: off), as torch reads it."""
    for name in (FR_BUFFER_SIZE_ENV, FR_OLD_BUFFER_SIZE_ENV):
        if environ.get(name, "").strip():
            try:
                return int(environ[name])
            except ValueError:
                return FR_DEFAULT_ENTRIES  # not a number: taken as on (a dump of an empty ring says so)
    return FR_DEFAULT_ENTRIES


#: The dump's top-level keys (FlightRecorderDetail.hpp, ``dump_pickle``/``dump_json``).
FR_VERSION = "version"
FR_ENTRIES = "entries"
FR_PG_CONFIG = "pg_config"
FR_PG_STATUS = "pg_status"
FR_COMM_LIB_VERSION = "comm_lib_version"  # NCCL's version (NCCLUtils.hpp getNcclVersion); "" on gloo
#: Written only where the backend hands the dump its communicators' state (ProcessGroupNCCL).
FR_NCCL_COMM_STATE = "nccl_comm_state"
#: pg_status per pg_id (a string): the last Seq each stage reached, -1 for none.
FR_LAST_ENQUEUED = "last_enqueued_collective"
FR_LAST_STARTED = "last_started_collective"
FR_LAST_COMPLETED = "last_completed_collective"

#: An entry's keys (FlightRecorderDetail.hpp ``Entry``, written by ``dump_pickle``/``dump_json``).
E_RECORD_ID = "record_id"
E_PG_ID = "pg_id"
E_PROCESS_GROUP = "process_group"  # (pg name, pg desc); a list in the JSON form
E_SEQ = "collective_seq_id"
E_P2P_SEQ = "p2p_seq_id"
E_OP_ID = "op_id"
E_PROFILING_NAME = "profiling_name"  # "<backend>:<op>[ <meta>]"
E_CREATED_NS = "time_created_ns"
E_STARTED_NS = "time_discovered_started_ns"  # None in the pickle (0 in the JSON) when unknown
E_COMPLETED_NS = "time_discovered_completed_ns"
E_INPUT_SIZES = "input_sizes"
E_INPUT_DTYPES = "input_dtypes"
E_OUTPUT_SIZES = "output_sizes"
E_OUTPUT_DTYPES = "output_dtypes"
E_STATE = "state"
E_RETIRED = "retired"
E_TIMEOUT_MS = "timeout_ms"
E_IS_P2P = "is_p2p"
E_FRAMES = "frames"  # only in a dump with stack traces: [{"name", "filename", "line"}]
E_DURATION_MS = "duration_ms"  # only where the backend timed the call (NCCL with timing on; 2.15's hook: the backend's)
E_THREAD_ID = "thread_id"  # std::this_thread::get_id() of the recording thread, as text
E_THREAD_NAME = "thread_name"  # c10::getThreadName() of that thread
#: The keys an entry must have for commtag to place it; every other key may be absent.
E_REQUIRED = (E_PROCESS_GROUP, E_SEQ, E_PROFILING_NAME)

#: Entry states (FlightRecorderDetail.hpp): gloo writes only the first.
STATE_SCHEDULED = "scheduled"
STATE_STARTED = "started"
STATE_COMPLETED = "completed"
#: How commtag marks a call a dump holds neither completed nor ended: drawn up to its dump's time
#: where only dumps are drawn, and said on its profiled slice where a profile has it.
FR_IN_FLIGHT = "in flight"

def version_number(version: str) -> tuple[int, ...]:
    """A dump version as numbers to compare ("2.10" after "2.9"); () where it is not "<major>.<minor>"."""
    parts = version.split(".")
    return tuple(map(int, parts)) if len(parts) == 2 and all(p.isdigit() for p in parts) else ()


#: torch release -> (the dump version it writes, FlightRecorder.hpp ``version_val``; the git commit its
#: wheel was built from, ``torch.version.git_version``): each read from that release's wheel.
FR_WRITERS = {
    "2.11.0": ("2.10", "70d99e998b4955e0049d13a98d77ae1b14db1f45"),
    "2.12.0": ("2.10", "7661cd9c6b841b62b7f411aa52ec51f05457263b"),
    "2.12.1": ("2.10", "7269437d655783a26cba32aa88195b741ff496aa"),
    "2.13.0": ("2.10", "cf30153c4c131c8164ee7798e5022d810682e2cb"),
    "2.14.0": ("2.10", "08187d9e0fba026dc8217405802ab5381dc88d90"),
    "2.14.1": ("2.10", "5c4886908584029761b579af026dcfb627c84070"),
    "2.15.0": ("2.10", "d0f2af8b66b20da4baa50644c0cd3f887a2eae2e"),
}
#: The versions known. Another is read by the keys above (those it lacks left out, those it adds
#: ignored) and said, a newer one as newer.
FR_KNOWN_VERSIONS = tuple(sorted({version for version, _ in FR_WRITERS.values()}, key=version_number))
#: Per version, the keys of an entry in the order the writer puts them (FlightRecorderDetail.hpp
#: ``getCollectiveTrace``, the pickle; ``dump_json`` writes the same keys).
FR_ENTRY_KEYS = {
    "2.10": (E_FRAMES, E_RECORD_ID, E_PG_ID, E_PROCESS_GROUP, E_THREAD_NAME, E_THREAD_ID, E_SEQ, E_P2P_SEQ,
             E_OP_ID, E_PROFILING_NAME, E_CREATED_NS, E_DURATION_MS, E_INPUT_SIZES, E_INPUT_DTYPES,
             E_OUTPUT_SIZES, E_OUTPUT_DTYPES, E_STATE, E_STARTED_NS, E_COMPLETED_NS, E_RETIRED, E_TIMEOUT_MS,
             E_IS_P2P),
}
#: Keys of FR_ENTRY_KEYS an entry has only sometimes (see each).
FR_SOMETIMES_KEYS = frozenset({E_FRAMES, E_DURATION_MS})

#: torch 2.15 records the groups of a backend that keeps no recorder of its own (nccl2, which "nccl"
#: builds there unless TORCH_DIST_USE_NCCL2 is "0", nccl-lazy, mpi, ucc, out-of-tree ones) through
#: c10d's FlightRecorderHook (distributed_c10d.py ``_maybe_attach_flight_recorder``; on unless
#: TORCH_FR_BUFFER_SIZE is 0, 2000 entries by default), into a recorder per backend, dumped by
#: ``_dump_fr_trace(..., backend=NAME)``. The entry's keys are the native ones; what differs:
FR_HOOK_RELEASE = "2.15.0"
#: - ``profiling_name``'s backend field is the serving backend's name (``"nccl2:all_reduce"``, the
#:   analyzer's example), or this where the hook cannot identify it (types.py);
FR_HOOK_UNKNOWN_BACKEND = "c10d"
#: - a call whose completion the backend reports reads "completed" (started and completed stamped then,
#:   ``retired``); one that never completed is never retired and reads "scheduled" (FlightRecorderHook.hpp).
#:   nccl2 reports it (``c10d::nccl2::ProcessGroupNCCL::registerCompletionHook`` is a symbol of the 2.15.0
#:   wheel's libtorch_cuda.so); a backend that does not is retired at issue, "scheduled" whether done or not;
#: - a gathered buffer is the caller's list, one shard-shaped buffer per rank, not one flat tensor
#:   (types.py ``_gathered_numel_matches``), and alltoall_base is named all_to_all_single (types.py);
#: - a recv from any source names no peer: its meta is "<dst><-?" (types.py);
#: - calls issued under CUDA-graph capture are not recorded (FlightRecorderHook.hpp).
#: A process may hold three kinds of torch recorder, each dumped by its own call:
#: - the default c10::Event recorder, gloo's (FlightRecorder.hpp ``kDefaultFRBackend`` "gloo"), dumped by
#:   ``_dump_fr_trace(includeCollectives, includeStackTraces, onlyActive)`` (every release, CPU builds too);
FR_DUMP = "_dump_fr_trace"
#: - from torch 2.15, one per backend FlightRecorderHook records, keyed by the name the backend gives
#:   itself (FlightRecorder.hpp ``getFlightRecorder(backend)``; the hook's ``BackendTarget`` resolves the
#:   recorder and the name its entries' profiling_name carries together), dumped by
#:   ``_dump_fr_trace(..., backend=NAME)`` (torch 2.15.0's ``_distributed_c10d.pyi``; 2.11-2.14 have no such
#:   keyword). torch parks each group's hook in ``_world.pg_flight_recorder_hooks`` and hooks no group whose
#:   every backend is in ``_FR_SELF_RECORDING_BACKENDS`` (distributed_c10d.py ``_maybe_attach_flight_recorder``);
#:   the hook skips the ops of a backend that records natively (gloo's, legacy NCCL's);
FR_BACKEND_KEYWORD = "backend"
FR_HOOKS_ATTR = "pg_flight_recorder_hooks"
FR_SELF_RECORDING_ATTR = "_FR_SELF_RECORDING_BACKENDS"
#: - the legacy ProcessGroupNCCL's own CUDAEvent recorder (its backend's name "nccl", ProcessGroupNCCL.hpp
#:   ``NCCL_BACKEND_NAME``), dumped by ``_dump_nccl_trace(includeCollectives, includeStackTraces, onlyActive)``,
#:   bound only where torch is built with NCCL (torch/csrc/distributed/c10d/init.cpp, under ``USE_C10D_NCCL``;
#:   ProcessGroupNCCL.hpp ``dump_nccl_trace``): absent from CPU builds.
FR_NCCL_DUMP = "_dump_nccl_trace"
#: The backends whose calls a native recorder holds (the default one, legacy NCCL's): never a hook's.
FR_NATIVE_BACKENDS = frozenset({BACKEND_GLOO, BACKEND_NCCL})
#: The desc torch gives its default group, which holds every rank of the world.
FR_DEFAULT_PG_DESC = "default_pg"
#: The point-to-point ops (types.py ``P2P``); their meta is "<src>-><dst>" (send) or "<dst><-<src>"
#: (recv), in group ranks.
FR_P2P_OPS = frozenset({"send", "recv"})
#: Collectives whose per-rank buffers differ in size by design (torch 2.15's types.py ``_UNEVEN_COLLECTIVES``).
FR_UNEVEN_OPS = frozenset({"all_to_all", "all_to_all_single"})
#: Collectives whose input sizes the analyzer does not compare across ranks (types.py ``Op.match``),
#: and those whose output sizes it does not.
FR_UNCOMPARED_INPUTS = FR_UNEVEN_OPS | {"scatter"}
FR_UNCOMPARED_OUTPUTS = FR_UNEVEN_OPS | {"gather"}
#: Collectives whose output gathers every member's input, and those whose input is every member's
#: output (types.py ``Op.match``, checked by ``_gathered_numel_matches``).
FR_GATHERING_OPS = frozenset({"all_gather", "_all_gather_base", "all_gather_into_tensor_coalesced"})
FR_SCATTERING_OPS = frozenset({"reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"})
#: all_to_all's sizes are per-rank splits: the analyzer leaves it UNDECIDED; commtag judges it by
#: the splits where its own dump records them.
FR_ALL_TO_ALL_OPS = frozenset({"all_to_all", "all_to_all_single", "all_to_all_v_single"})

#: commtag's keys added to an entry of its own dumps (never a torch key).
CT_PEER = "commtag_peer"  # a p2p op's peer, global rank
CT_PAIR_SEQ = "commtag_pair_seq"  # the n-th op this rank made to/from that peer in that direction
CT_IN_SPLITS = "commtag_input_splits"
CT_OUT_SPLITS = "commtag_output_splits"
#: On a group whose collectives CUDA-graph replays ran, collective_seq_id numbers every collective of
#: the group in time order (a replay repeats its capture's Seq); each keeps its own Seq (a replay: its
#: capture's) in CT_CAPTURE_SEQ, and a replay its index since that capture in CT_REPLAY.
CT_REPLAY = "commtag_replay"
CT_CAPTURE_SEQ = "commtag_capture_seq"
CT_END_NS = "commtag_time_ended_ns"
CT_ERROR = "commtag_error"  # what a failed call raised (torch's states cannot say it failed)
#: commtag's top-level keys: the dump's own time and why it was written.
CT_DUMP_NS = "commtag_dump_time_ns"
CT_DUMP_REASON = "commtag_dump_reason"
CT_RANK = "commtag_rank"
CT_WORLD_SIZE = "commtag_world_size"
CT_RING_SIZE = "commtag_ring_size"


#: The eager "Collective name" (vocab.COLLECTIVES) -> the op in torch's profiling_name. NCCL's: the
#: titles ProcessGroupNCCL.cpp gives each op, found as strings in the torch 2.14.1 wheel's
#: libtorch_cuda.so ("nccl:all_reduce", "nccl:_all_gather_base", "nccl:all_to_all", ...; a barrier is
#: an all_reduce titled "nccl:all_reduce_barrier"). gloo's: the titles in the torch 2.15.0 wheel's
#: libtorch_cpu.so ("gloo:all_reduce", "gloo:all_gather", "gloo:all_to_all", "gloo:barrier", ...) and
#: measured with torch 2.13 (all_to_all_single and all_gather_into_tensor record as all_to_all and
#: all_gather); no gloo title for allreduce_coalesced or reduce_scatter is among them (not confirmed).
FR_OPS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "allreduce_coalesced", "broadcast": "broadcast",
    "reduce": "reduce", "all_gather": "all_gather", "_allgather_base": "_all_gather_base",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "_reduce_scatter_base",
    "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "gather": "gather", "scatter": "scatter",
    "barrier": "all_reduce_barrier", "send": "send", "recv": "recv",
}
FR_OPS_GLOO = {**FR_OPS, "_allgather_base": "all_gather", "barrier": "barrier"}


def fr_op(backend: str, eager_name: str) -> str:
    """The op torch's recorder names a call of this eager name (the eager name where it has none)."""
    return (FR_OPS_GLOO if backend == "gloo" else FR_OPS).get(eager_name, eager_name)


def profiling_name(backend: str, op: str) -> str:
    """The ``profiling_name`` torch's recorder gives a call of ``op`` (:func:`fr_op`): ``"nccl:all_reduce"``;
    a send/recv adds its ranks (see :func:`split_profiling_name`)."""
    return f"{backend}:{op}"


def split_profiling_name(name: str) -> tuple[str, str, Optional[str]]:
    """``"nccl:send 0->1"`` -> ``("nccl", "send", "0->1")``; a name without backend gets ``""``. Split
    at the last colon before the op, as torch 2.15's analyzer does: a backend's name may hold one."""
    head, _, meta = name.partition(" ")
    backend, _, op = head.rpartition(":")
    return backend, op, (meta or None)


def p2p_peer(op: str, meta: Optional[str]) -> Optional[int]:
    """The peer's group rank in a send/recv's meta ("0->1": send to 1; "1<-0": recv from 0)."""
    if meta is None:
        return None
    parts = meta.split("->") if op == "send" else meta.split("<-")
    if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        return None
    return int(parts[1])

"""torch's Flight Recorder (FR) dumps: their files, keys, states and what torch's analyzer checks.

Sources: torch/csrc/distributed/c10d/FlightRecorder.hpp and FlightRecorderDetail.hpp (the ring,
its entries and the pickle/JSON writers ``_dump_fr_trace`` and ``_dump_fr_trace_json``), and
torch/distributed/flight_recorder/components/{loader,types,utils}.py (the analyzer ``fr_trace``).
Measured with torch 2.13 on gloo: version "2.10", ``state`` always "scheduled", send/recv not
recorded, ``pg_config`` one entry keyed "" whose ``ranks`` is "[]" (the analyzer then fails).
"""

from __future__ import annotations

from typing import Optional

#: The environment variable naming the dump files' prefix; each rank writes ``<prefix><rank>``
#: (FlightRecorder.hpp reads TORCH_FR_DUMP_TEMP_FILE, then the older TORCH_NCCL_DEBUG_INFO_TEMP_FILE).
FR_DUMP_PREFIX_ENV = "TORCH_FR_DUMP_TEMP_FILE"
#: torch's prefix when the variable is unset (FlightRecorder.hpp).
FR_DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
#: How many entries each rank's ring keeps; 0 (torch's default) turns the recorder off.
FR_BUFFER_SIZE_ENV = "TORCH_FR_BUFFER_SIZE"

#: The dump's top-level keys (FlightRecorderDetail.hpp, ``dump_pickle``/``dump_json``).
FR_VERSION = "version"
FR_ENTRIES = "entries"
FR_PG_CONFIG = "pg_config"
FR_PG_STATUS = "pg_status"
FR_COMM_LIB_VERSION = "comm_lib_version"
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
E_FRAMES = "frames"
E_THREAD_ID = "thread_id"
E_THREAD_NAME = "thread_name"
#: The keys an entry must have for commtag to place it; every other key may be absent.
E_REQUIRED = (E_PROCESS_GROUP, E_SEQ, E_PROFILING_NAME)

#: Entry states (FlightRecorderDetail.hpp): gloo writes only the first.
STATE_SCHEDULED = "scheduled"
STATE_STARTED = "started"
STATE_COMPLETED = "completed"

#: The versions known: torch 2.13 writes "2.10" (FlightRecorder.hpp ``version_val``). Another
#: version is read by the keys above, those it lacks left out, and said.
FR_KNOWN_VERSIONS = ("2.10",)
#: The desc torch gives its default group, which holds every rank of the world.
FR_DEFAULT_PG_DESC = "default_pg"
#: The point-to-point ops (types.py ``P2P``); their meta is "<src>-><dst>" (send) or "<dst><-<src>"
#: (recv), in group ranks.
FR_P2P_OPS = frozenset({"send", "recv"})
#: Collectives whose input sizes the analyzer does not compare across ranks (types.py ``Op.match``),
#: and those whose output sizes it does not.
FR_UNCOMPARED_INPUTS = frozenset({"all_to_all", "scatter"})
FR_UNCOMPARED_OUTPUTS = frozenset({"all_to_all", "gather"})
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


#: The eager "Collective name" (vocab.COLLECTIVES) -> the op in torch's profiling_name. NCCL's from
#: ProcessGroupNCCL.cpp's profilingTitle of each op; gloo's as torch 2.13 wrote them (measured:
#: all_to_all_single and all_gather_into_tensor record as all_to_all and all_gather).
FR_OPS = {
    "allreduce": "all_reduce", "allreduce_coalesced": "allreduce_coalesced", "broadcast": "broadcast",
    "reduce": "reduce", "all_gather": "all_gather", "_allgather_base": "_all_gather_base",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "_reduce_scatter_base",
    "all_to_all": "all_to_all", "all_to_allv": "all_to_all", "gather": "gather", "scatter": "scatter",
    "barrier": "barrier", "send": "send", "recv": "recv",
}
FR_OPS_GLOO = {**FR_OPS, "_allgather_base": "all_gather"}


def fr_op(backend: str, eager_name: str) -> str:
    """The op torch's recorder names a call of this eager name (the eager name where it has none)."""
    return (FR_OPS_GLOO if backend == "gloo" else FR_OPS).get(eager_name, eager_name)


def profiling_name(backend: str, op: str) -> str:
    """The ``profiling_name`` torch's recorder gives a call of ``op`` (:func:`fr_op`): ``"nccl:all_reduce"``;
    a send/recv adds its ranks (see :func:`split_profiling_name`)."""
    return f"{backend}:{op}"


def split_profiling_name(name: str) -> tuple[str, str, Optional[str]]:
    """``"nccl:send 0->1"`` -> ``("nccl", "send", "0->1")``; a name without backend gets ``""``."""
    backend, _, rest = name.partition(":") if ":" in name else ("", "", name)
    op, _, meta = rest.partition(" ")
    return backend, op, (meta or None)


def p2p_peer(op: str, meta: Optional[str]) -> Optional[int]:
    """The peer's group rank in a send/recv's meta ("0->1": send to 1; "1<-0": recv from 0)."""
    if meta is None:
        return None
    parts = meta.split("->") if op == "send" else meta.split("<-")
    if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        return None
    return int(parts[1])

"""Flight Recorder dumps of a hung NCCL job, generated where no GPU is at hand: the NCCL-side dumps the
tests check commtag's diagnosis and torch's own analyzer on, and the 1,024-rank benchmark's input.

The job: ``world`` ranks in tensor-parallel groups of ``tp`` consecutive ranks and data-parallel groups
of the ranks ``tp`` apart; each step all_reduces on its TP group, then reduce_scatters and all_gathers
on its DP group. Some ranks get stuck before a chosen call (``stuck``: rank -> call index in its
schedule) and never enter it; every other rank runs until a call some member never entered, and waits
in it. That is decided by a fixed point over the ranks (a rank's call completes only when every member
entered it), so the dumps are those of a real hang, not drawn by hand.

Every field is written as torch writes it in an NCCL job's dump. ``Job.release`` picks the torch
release (vocab.flight_recorder.FR_WRITERS: 2.11.0 to 2.15.0 write the same version and keys, each read
from that release's wheel); ``Job.backend`` "nccl2" picks torch 2.15's c10d FlightRecorderHook, which
records nccl2's groups (what "nccl" builds in 2.15), with what differs there (vocab.flight_recorder
``FR_HOOK_*``):
- the dump's keys, ``version`` (the release's ``version_val``), ``pg_config`` (per group name: ``name``,
  ``desc``, ``ranks`` as the string of a list) and ``pg_status`` (per pg_id: last enqueued, started and
  completed Seq): torch/csrc/distributed/c10d/FlightRecorderDetail.hpp, ``dump``, ``getPgConfig`` and
  ``getPgStatus``; ``comm_lib_version``: an NCCL version as NCCLUtils.hpp ``getNcclVersion`` writes it
  ("2.21.5"), "" for the hook's recorder (the gloo recorder's, which nothing sets, is "", measured);
- an entry's keys, in ``getCollectiveTrace`` there: ``record_id`` (its index in the ring, counted over the
  whole run), ``pg_id``, ``process_group`` (name, desc), ``collective_seq_id`` (the group's collective
  count, 1-based), ``p2p_seq_id`` (0: no p2p here), ``op_id``, ``profiling_name`` ("<backend>:<op>": the
  title ProcessGroupNCCL.cpp gives each op, "nccl:all_reduce", "nccl:_reduce_scatter_base",
  "nccl:_all_gather_base", strings of the torch 2.14.1 wheel's libtorch_cuda.so; under the hook the
  backend's name, "nccl2:all_reduce" as torch 2.15's analyzer spells it), ``time_created_ns``,
  ``input_sizes``/``output_sizes`` (one shape per tensor; the hook's gathered and scattered buffers are
  the caller's list, one shard per rank, so its job calls the list forms ``reduce_scatter`` and
  ``all_gather``), ``input_dtypes``/``output_dtypes`` (c10::toString of the
  ScalarType: "BFloat16"), ``state`` ("completed" once the watchdog saw the work end, "started" while its
  kernel runs: a call waiting on a missing peer; under the hook "completed" when the backend reported
  completion, else "scheduled" and never retired), the discovered start/completion times (None where not
  seen; the hook stamps both at completion), ``retired``, ``timeout_ms`` (600,000: ProcessGroupNCCL.hpp
  kProcessGroupNCCLDefaultTimeout, the group's timeout), ``is_p2p``, ``frames`` (the dump asked with stack
  traces: ``name``, ``filename``, ``line``), ``thread_id`` (std::this_thread::get_id() as text: the thread's
  pthread id in decimal, measured) and ``thread_name`` (c10::getThreadName(): "python" for the main
  thread of a Python job, measured with torch 2.13); ``duration_ms`` is left out, as torch leaves it out
  of a call it did not time (NCCL's timing is off by default; the hook's backend may not time);
- the file: ``<prefix><rank>``, torch's pickle of that dict (c10d's pickle writer emits only dicts,
  lists, tuples, strings, numbers, booleans and None, which Python's pickle of the same dict matches).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import orjson

from commtag.vocab import flight_recorder as fr

#: torch's default dump file name prefix (TORCH_FR_DUMP_TEMP_FILE's default).
PREFIX = fr.FR_DEFAULT_DUMP_NAME
#: One step's calls: (group kind, op, the shapes of its input, of its output) per call, elements per rank.
STEP = (("tp", "all_reduce", "in", "in"), ("dp", "_reduce_scatter_base", "dp_in", "in"),
        ("dp", "_all_gather_base", "in", "dp_in"))
#: The same step as torch 2.15's c10d hook records it (the gathered and scattered buffers as lists).
HOOK_STEP = (("tp", "all_reduce", "in", "in"), ("dp", "reduce_scatter", "dp_list", "in"),
             ("dp", "all_gather", "in", "dp_list"))
#: An NCCL version as getNcclVersion() writes it, and the main thread's id as the dump writes it.
NCCL_VERSION = "2.21.5"
THREAD_ID = str(0x7F3A8C5F4740)
TIMEOUT_MS = 600_000
ELEMENTS = 1 << 20
START_NS = 1_780_000_000_000_000_000
CALL_NS = 2_000_000


@dataclass(frozen=True)
class Job:
    world: int
    tp: int
    steps: int
    #: rank -> index of the call (in its schedule) it never enters.
    stuck: dict[int, int]
    ring: int = 2000
    #: The torch release whose writer is imitated (vocab.flight_recorder.FR_WRITERS).
    release: str = "2.13.0"
    #: "nccl" (ProcessGroupNCCL's own recorder) or "nccl2" (torch 2.15's c10d hook).
    backend: str = "nccl"

    def __post_init__(self) -> None:
        if self.release not in fr.FR_WRITERS:
            raise ValueError(f"no writer known for torch {self.release}: {', '.join(fr.FR_WRITERS)}")
        if self.backend != "nccl" and self.release != fr.FR_HOOK_RELEASE:
            raise ValueError(f"torch {self.release} records no {self.backend} group (its c10d hook is {fr.FR_HOOK_RELEASE}'s)")

    @property
    def hooked(self) -> bool:
        return self.backend != "nccl"

    def groups(self, rank: int) -> dict[str, tuple[str, str, tuple[int, ...]]]:
        """kind -> (group name, desc, members) of this rank's groups."""
        tp_index, dp_index = rank // self.tp, rank % self.tp
        tp_ranks = tuple(range(tp_index * self.tp, (tp_index + 1) * self.tp))
        dp_ranks = tuple(range(dp_index, self.world, self.tp))
        return {"tp": (str(1 + tp_index), f"tp{tp_index}", tp_ranks),
                "dp": (str(1 + self.world // self.tp + dp_index), f"dp{dp_index}", dp_ranks)}

    def calls(self) -> int:
        return self.steps * len(STEP)


def positions(job: Job) -> tuple[dict[int, int], set[int]]:
    """Each rank's call where it stopped, and the ranks that entered that call and wait in it: a stuck
    rank stops before its call (unless held up earlier), every other rank at the first call some member
    of its group never entered, or at the end of the run."""
    pos = {rank: job.stuck.get(rank, job.calls()) for rank in range(job.world)}
    waiting: set[int] = set()
    members = {rank: {kind: g[2] for kind, g in job.groups(rank).items()} for rank in range(job.world)}
    changed = True
    while changed:
        changed = False
        for rank in range(job.world):
            for index in range(pos[rank]):
                kind = STEP[index % len(STEP)][0]
                if any(pos[m] < index or (pos[m] == index and m not in waiting and m != rank)
                       for m in members[rank][kind]):
                    pos[rank] = index  # entered, and waits: a member never came
                    waiting.add(rank)
                    changed = True
                    break
    return pos, waiting


def write_dumps(job: Job, out_dir: Path, prefix: str = PREFIX, as_json: bool = False) -> dict[int, int]:
    """One dump per rank in ``out_dir``, torch's pickle or (``as_json``) its JSON (:func:`json_form`);
    each rank's stopping call (see :func:`positions`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pos, waiting = positions(job)
    for rank in range(job.world):
        doc = dump_of(job, rank, pos[rank], rank in waiting)
        data = orjson.dumps(json_form(doc)) if as_json else pickle.dumps(doc, protocol=2)
        (out_dir / f"{prefix}{rank}").write_bytes(data)
    return pos


def json_form(doc: dict) -> dict:
    """A dump as ``_dump_fr_trace_json`` writes it (FlightRecorderDetail.hpp ``dump_json``): pg_status's
    counts as text, no frames, 0 for a time not seen, and no ``entries`` key where the ring is empty."""
    entries = [{**{k: v for k, v in e.items() if k != fr.E_FRAMES},
                fr.E_PROCESS_GROUP: list(e[fr.E_PROCESS_GROUP]),
                fr.E_STARTED_NS: e[fr.E_STARTED_NS] or 0, fr.E_COMPLETED_NS: e[fr.E_COMPLETED_NS] or 0}
               for e in doc[fr.FR_ENTRIES]]
    out = {k: v for k, v in doc.items() if k != fr.FR_ENTRIES}
    out[fr.FR_PG_STATUS] = {pg: {k: str(v) for k, v in status.items()} for pg, status in doc[fr.FR_PG_STATUS].items()}
    if entries:
        out[fr.FR_ENTRIES] = entries
    return out


def dump_of(job: Job, rank: int, stop: int, in_flight: bool) -> dict:
    groups = job.groups(rank)
    pg_ids = {kind: i for i, kind in enumerate(groups)}
    seqs = {kind: 0 for kind in groups}
    last = stop + (1 if in_flight else 0)
    entries = []
    status = {kind: [0, 0] for kind in groups}
    step = HOOK_STEP if job.hooked else STEP
    for index in range(last):
        kind, op, ins, outs = step[index % len(step)]
        seqs[kind] += 1
        name, desc, members = groups[kind]
        shape = {"in": [[ELEMENTS]], "dp_in": [[ELEMENTS * len(members)]], "dp_list": [[ELEMENTS]] * len(members)}
        done = index < stop
        status[kind] = [seqs[kind], seqs[kind] if done else status[kind][1]]
        created = START_NS + index * CALL_NS
        entry = {
            fr.E_FRAMES: [{"name": "train_step", "filename": "train.py", "line": 100 + index % len(step)}],
            fr.E_RECORD_ID: index, fr.E_PG_ID: pg_ids[kind], fr.E_PROCESS_GROUP: (name, desc),
            fr.E_THREAD_NAME: "python", fr.E_THREAD_ID: THREAD_ID,
            fr.E_SEQ: seqs[kind], fr.E_P2P_SEQ: 0, fr.E_OP_ID: seqs[kind],
            fr.E_PROFILING_NAME: fr.profiling_name(job.backend, op),
            fr.E_CREATED_NS: created, fr.E_INPUT_SIZES: shape[ins], fr.E_INPUT_DTYPES: ["BFloat16"] * len(shape[ins]),
            fr.E_OUTPUT_SIZES: shape[outs], fr.E_OUTPUT_DTYPES: ["BFloat16"] * len(shape[outs]),
            **(_hook_state(created, done) if job.hooked else _native_state(created, done)),
            fr.E_TIMEOUT_MS: TIMEOUT_MS, fr.E_IS_P2P: False,
        }
        entries.append({key: entry[key] for key in fr.FR_ENTRY_KEYS[fr.FR_WRITERS[job.release][0]] if key in entry})
    return {
        fr.FR_VERSION: fr.FR_WRITERS[job.release][0],
        fr.FR_PG_CONFIG: {g[0]: {"name": g[0], "desc": g[1], "ranks": str(list(g[2]))} for g in groups.values()},
        fr.FR_COMM_LIB_VERSION: "" if job.hooked else NCCL_VERSION,
        fr.FR_PG_STATUS: {str(pg_ids[k]): {fr.FR_LAST_ENQUEUED: s[0], fr.FR_LAST_STARTED: s[0],
                                          fr.FR_LAST_COMPLETED: s[1]} for k, s in status.items()},
        fr.FR_ENTRIES: entries[-job.ring:],
    }


def _native_state(created: int, done: bool) -> dict:
    """ProcessGroupNCCL's watchdog: started when its kernel ran, completed and retired when it ended."""
    return {fr.E_STATE: fr.STATE_COMPLETED if done else fr.STATE_STARTED, fr.E_STARTED_NS: created + 1000,
            fr.E_COMPLETED_NS: created + CALL_NS // 2 if done else None, fr.E_RETIRED: done}


def _hook_state(created: int, done: bool) -> dict:
    """torch 2.15's hook: both times stamped and retired when the backend reports completion; a call
    never completed keeps neither and reads "scheduled"."""
    end = created + CALL_NS // 2 if done else None
    return {fr.E_STATE: fr.STATE_COMPLETED if done else fr.STATE_SCHEDULED, fr.E_STARTED_NS: end,
            fr.E_COMPLETED_NS: end, fr.E_RETIRED: done}


def expected_stuck(job: Job) -> list[int]:
    """The ranks a diagnosis must name stuck: the generator's own stuck ranks that no one else holds up
    (a stuck rank whose own call is held up by another rank is waiting, not the cause)."""
    pos, _ = positions(job)
    causes = []
    for rank in sorted(job.stuck):
        index = job.stuck[rank]
        held = any(pos[m] < index for m in job.groups(rank)[STEP[index % len(STEP)][0]][2] if m != rank)
        if not held:
            causes.append(rank)
    return causes

"""Flight Recorder dumps of a hung NCCL job, generated where no GPU is at hand: the NCCL-side dumps the
tests check commtag's diagnosis and torch's own analyzer on, and the 1,024-rank benchmark's input.

The job: ``world`` ranks in tensor-parallel groups of ``tp`` consecutive ranks and data-parallel groups
of the ranks ``tp`` apart; each step all_reduces on its TP group, then reduce_scatters and all_gathers
on its DP group. Some ranks get stuck before a chosen call (``stuck``: rank -> call index in its
schedule) and never enter it; every other rank runs until a call some member never entered, and waits
in it. That is decided by a fixed point over the ranks (a rank's call completes only when every member
entered it), so the dumps are those of a real hang, not drawn by hand.

Every field is written as torch writes it in an NCCL job's dump (torch 2.13):
- the dump's keys, ``version`` "2.10", ``pg_config`` (per group name: ``name``, ``desc``, ``ranks`` as the
  string of a list) and ``pg_status`` (per pg_id: last enqueued, started and completed Seq):
  torch/csrc/distributed/c10d/FlightRecorderDetail.hpp, ``FlightRecorder<EventType>::dump``,
  ``getPgConfig`` and ``getPgStatus``;
- an entry's keys, in ``dump_entries`` there: ``record_id`` (its index in the ring, counted over the whole
  run), ``pg_id``, ``process_group`` (name, desc), ``collective_seq_id`` (the group's collective count,
  1-based), ``p2p_seq_id`` (0: no p2p here), ``op_id``, ``profiling_name`` ("nccl:<op>", the title
  ProcessGroupNCCL.cpp gives each op: "nccl:all_reduce", "nccl:_reduce_scatter_base",
  "nccl:_all_gather_base"), ``time_created_ns``, ``input_sizes``/``output_sizes`` (one shape per tensor),
  ``input_dtypes``/``output_dtypes`` (c10 ScalarType names), ``state`` ("completed" once the watchdog saw
  the work end, "started" while its kernel runs: a call waiting on a missing peer), the discovered
  start/completion times (None where not seen), ``retired``, ``timeout_ms``, ``is_p2p``, ``frames``,
  ``thread_id`` and ``thread_name``;
- the file: ``<prefix><rank>``, torch's pickle of that dict (c10d's pickle writer emits only dicts,
  lists, tuples, strings, numbers, booleans and None, which Python's pickle of the same dict matches).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

from commtag.vocab import flight_recorder as fr

#: torch's default dump prefix's base name (FlightRecorder.hpp: TORCH_FR_DUMP_TEMP_FILE's default).
PREFIX = Path(fr.FR_DEFAULT_DUMP_PREFIX).name
#: One step's calls: (group kind, op, the shape of its input, of its output) per call, elements per rank.
STEP = (("tp", "all_reduce", "in", "in"), ("dp", "_reduce_scatter_base", "dp_in", "in"),
        ("dp", "_all_gather_base", "in", "dp_in"))
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


def write_dumps(job: Job, out_dir: Path, prefix: str = PREFIX) -> dict[int, int]:
    """One dump per rank in ``out_dir``; each rank's stopping call (see :func:`positions`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pos, waiting = positions(job)
    for rank in range(job.world):
        data = pickle.dumps(dump_of(job, rank, pos[rank], rank in waiting), protocol=2)
        (out_dir / f"{prefix}{rank}").write_bytes(data)
    return pos


def dump_of(job: Job, rank: int, stop: int, in_flight: bool) -> dict:
    groups = job.groups(rank)
    pg_ids = {kind: i for i, kind in enumerate(groups)}
    seqs = {kind: 0 for kind in groups}
    last = stop + (1 if in_flight else 0)
    entries = []
    status = {kind: [0, 0] for kind in groups}
    for index in range(last):
        kind, op, ins, outs = STEP[index % len(STEP)]
        seqs[kind] += 1
        name, desc, members = groups[kind]
        shape = {"in": [ELEMENTS], "dp_in": [ELEMENTS * len(members)]}
        done = index < stop
        status[kind] = [seqs[kind], seqs[kind] if done else status[kind][1]]
        created = START_NS + index * CALL_NS
        entries.append({
            fr.E_RECORD_ID: index, fr.E_PG_ID: pg_ids[kind], fr.E_PROCESS_GROUP: (name, desc),
            fr.E_SEQ: seqs[kind], fr.E_P2P_SEQ: 0, fr.E_OP_ID: seqs[kind], fr.E_PROFILING_NAME: fr.profiling_name("nccl", op),
            fr.E_CREATED_NS: created, fr.E_INPUT_SIZES: [shape[ins]], fr.E_INPUT_DTYPES: ["BFloat16"],
            fr.E_OUTPUT_SIZES: [shape[outs]], fr.E_OUTPUT_DTYPES: ["BFloat16"],
            fr.E_STATE: fr.STATE_COMPLETED if done else fr.STATE_STARTED,
            fr.E_STARTED_NS: created + 1000, fr.E_COMPLETED_NS: created + CALL_NS // 2 if done else None,
            fr.E_RETIRED: done, fr.E_TIMEOUT_MS: 600_000, fr.E_IS_P2P: False,
            fr.E_FRAMES: [{"name": "train_step", "filename": "train.py", "line": 100 + index % len(STEP)}],
            fr.E_THREAD_ID: "1", fr.E_THREAD_NAME: "pt_main_thread",
        })
    return {
        fr.FR_VERSION: fr.FR_KNOWN_VERSIONS[-1],
        fr.FR_PG_CONFIG: {g[0]: {"name": g[0], "desc": g[1], "ranks": str(list(g[2]))} for g in groups.values()},
        fr.FR_PG_STATUS: {str(pg_ids[k]): {fr.FR_LAST_ENQUEUED: s[0], fr.FR_LAST_STARTED: s[0],
                                          fr.FR_LAST_COMPLETED: s[1]} for k, s in status.items()},
        fr.FR_COMM_LIB_VERSION: "2.21.5",
        fr.FR_ENTRIES: entries[-job.ring:],
    }


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

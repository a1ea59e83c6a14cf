"""`commtag export-fr`: a profiled job's collectives written as Flight Recorder dumps, one per rank, in
torch's pickle format and file naming, so torch's own analyzer (``fr_trace``) reads the job too.

Each rank's instances go in time order; a collective keeps its Seq as ``collective_seq_id``. On a
group where CUDA graphs replayed collectives (on any rank), every collective of the group is numbered in time order
instead (a replay has no Seq of its own: its capture's repeats), its real Seq and replay index kept
beside (``commtag_capture_seq``, ``commtag_replay``). A call the dump cannot hold truthfully, or
torch's analyzer cannot match (a send/recv on a group of more than two ranks: it looks for the call on
every member), is left out and counted.
"""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from commtag.atomic import temporary, write_atomic
from commtag.merge.errors import MergeInputError
from commtag.merge.records import CollectiveInstance
from commtag.vocab import DST_RANK_KEY, PG_DESC_KEY, PG_NAME_KEY, SRC_RANK_KEY
from commtag.vocab import flight_recorder as fr

#: The exported dumps' prefix: ``<DIR>/commtag_export_rank_<R>``.
EXPORT_PREFIX = "commtag_export_rank_"


@dataclass(slots=True)
class Exported:
    """What export wrote, and what it left out and why."""

    paths: list[Path]
    entries: int
    left_out: dict[str, int] = field(default_factory=dict)


def export_fr(instances: Sequence[CollectiveInstance], out_dir: Path) -> Exported:
    """Write one dump per rank of ``instances`` into ``out_dir`` (created; no dump of it may exist yet):
    all of them or none (MergeInputError: an output that cannot be written)."""
    out_dir = Path(out_dir)
    ranks = sorted({i.rank for i in instances})
    targets = [out_dir / f"{EXPORT_PREFIX}{rank}" for rank in ranks]
    taken = [t for t in targets if t.exists()]
    if taken:
        raise MergeInputError(taken[0], "exists already: export-fr never writes over a dump")
    by_rank: dict[int, list[CollectiveInstance]] = {rank: [] for rank in ranks}
    for instance in instances:
        by_rank[instance.rank].append(instance)
    # Numbered in time order on every rank of a group some rank replayed on: a rank that never
    # reached a replay (a hang) is numbered like the others, not by its Seq.
    renumbered = {i.pg_uid for i in instances if i.replay is not None}
    left_out: dict[str, int] = {}
    documents = [_document(rank, by_rank[rank], renumbered, left_out) for rank in ranks]
    created = not out_dir.exists()
    written: list[Path] = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for target, doc in zip(targets, documents):
            written.append(write_atomic(target, pickle.dumps(doc, protocol=2)))
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        for target in targets:
            temporary(target).unlink(missing_ok=True)
        if created:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise MergeInputError(out_dir, f"cannot write the dumps: {exc.strerror or exc}") from None
    return Exported(paths=written, entries=sum(len(d[fr.FR_ENTRIES]) for d in documents), left_out=left_out)


def _document(rank: int, instances: list[CollectiveInstance], renumbered: set[str],
              left_out: dict[str, int]) -> dict:
    instances = sorted(instances, key=lambda i: (i.start_ns, i.seq))
    groups: dict[str, tuple[str, str, tuple[int, ...]]] = {}
    counters: dict[str, int] = {}
    entries: list[dict] = []
    for instance in instances:
        name, desc = _group_names(instance)
        groups.setdefault(name, (name, desc, instance.group_ranks))
        entry = _entry(len(entries), list(groups).index(name), name, desc, instance)
        if isinstance(entry, str):
            left_out[entry] = left_out.get(entry, 0) + 1
            continue
        if instance.pg_uid in renumbered and not instance.is_p2p:
            counters[name] = counters.get(name, 0) + 1
            entry[fr.E_SEQ] = counters[name]
            entry[fr.CT_CAPTURE_SEQ] = instance.seq
            entry[fr.CT_REPLAY] = instance.replay
        entries.append(entry)
    return {
        fr.FR_VERSION: fr.FR_KNOWN_VERSIONS[-1],
        fr.FR_PG_CONFIG: {name: {"name": name, "desc": desc, "ranks": str(list(ranks))}
                          for name, (name, desc, ranks) in groups.items()},
        fr.FR_PG_STATUS: {},
        fr.FR_COMM_LIB_VERSION: "",
        fr.FR_ENTRIES: entries,
        fr.CT_RANK: rank,
    }


def _group_names(instance: CollectiveInstance) -> tuple[str, str]:
    """The group's c10d name and description as the trace recorded them (the uid where it did not)."""
    args = instance.common_args
    name = args.get(PG_NAME_KEY)
    desc = args.get(PG_DESC_KEY)
    return (str(name) if name not in (None, "") else instance.pg_uid), (str(desc) if desc else "undefined")


#: Why a send/recv is left out of the export.
PEER_UNKNOWN = "send/recv whose peer is unknown"
P2P_ON_LARGE_GROUP = ("send/recv on a group of more than two ranks (torch's analyzer looks for a call on every "
                      "member of its group, and would report the others missing)")


def _entry(record_id: int, pg_id: int, name: str, desc: str, instance: CollectiveInstance) -> dict | str:
    """The call's entry, or why it is left out."""
    backend = "gloo" if instance.source == "gloo" else "nccl"
    op = fr.fr_op(backend, instance.collective)
    profiling_name = fr.profiling_name(backend, op)
    if instance.is_p2p:
        peer = _peer(instance, op)
        if peer is None or peer not in instance.group_ranks or instance.rank not in instance.group_ranks:
            return PEER_UNKNOWN
        if len(instance.group_ranks) > 2:
            return P2P_ON_LARGE_GROUP
        own, other = instance.group_ranks.index(instance.rank), instance.group_ranks.index(peer)
        profiling_name += f" {own}->{other}" if op == "send" else f" {own}<-{other}"
    return {
        fr.E_RECORD_ID: record_id, fr.E_PG_ID: pg_id, fr.E_PROCESS_GROUP: (name, desc),
        fr.E_SEQ: 0 if instance.is_p2p else instance.seq, fr.E_P2P_SEQ: instance.seq if instance.is_p2p else 0,
        fr.E_OP_ID: record_id, fr.E_PROFILING_NAME: profiling_name, fr.E_CREATED_NS: instance.start_ns,
        fr.E_INPUT_SIZES: [[instance.in_nelems]], fr.E_INPUT_DTYPES: [instance.dtype],
        fr.E_OUTPUT_SIZES: [[instance.out_nelems]], fr.E_OUTPUT_DTYPES: [instance.dtype],
        fr.E_STATE: fr.STATE_COMPLETED, fr.E_STARTED_NS: instance.start_ns, fr.E_COMPLETED_NS: instance.end_ns,
        fr.E_RETIRED: True, fr.E_TIMEOUT_MS: 0, fr.E_IS_P2P: instance.is_p2p, fr.E_FRAMES: [],
        fr.E_THREAD_ID: "", fr.E_THREAD_NAME: "", fr.CT_END_NS: instance.end_ns,
    }


def _peer(instance: CollectiveInstance, op: str) -> Optional[int]:
    """A send's or recv's peer, a global rank, as commtag recorded it."""
    key = DST_RANK_KEY if op == "send" else SRC_RANK_KEY
    for args in (instance.args, instance.common_args):
        value = args.get(key)
        if isinstance(value, int) and value >= 0:
            return value
    return None


def job_instances(source: Path, rank_pattern: Optional[str] = None, rank: Optional[int] = None,
                  warnings: Optional[list[str]] = None) -> list[CollectiveInstance]:
    """The collectives of a profiled job: a folder of traces and sidecars (read as the merge reads
    them) or a merged .pftrace (read back). MergeInputError: input that cannot be read."""
    source = Path(source)
    if source.is_file() and not source.name.endswith((".json", ".json.gz")):
        from commtag.merge.pftrace.readback import ReadbackError, read_merged

        try:
            return read_merged(source)[0]
        except ReadbackError as exc:
            raise MergeInputError(source, str(exc).removeprefix(f"{source}: ")) from None
        except OSError as exc:
            raise MergeInputError(source, f"cannot read: {exc.strerror or exc}") from None
    if not os.path.lexists(source):
        raise MergeInputError(source, "no such file or directory")
    from commtag.merge.engine.pipeline import collect

    return collect([source], rank_pattern=rank_pattern, rank=rank, warnings=warnings)[1]

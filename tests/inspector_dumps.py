"""NCCL Inspector dumps generated for a job's collectives, shaped exactly as the plugin writes them.

No Inspector runs here (it needs NCCL on GPUs), so the tests write what it would. Every fact is
read from NCCL's source (github.com/NVIDIA/nccl at 5067397c, plugins/profiler/inspector/):

- one file per process named ``<hostname>-pid<pid>.log`` (inspector.cc, the output file's snprintf);
- one JSON object a line, ``{"header": ..., "metadata": ..., "coll_perf": ...}`` in that order,
  every line carrying all three (inspector_json.cc, inspectorCommInfoDumpColl); a communicator's
  lines in the order its operations completed (inspector_ring.h, inspectorRingDrain drains first to last);
- ``header`` (inspectorCommInfoHeader): ``id`` (the communicator's hash string), ``comm_name``
  (torch's commName, ``"<group_desc>:<group_name>"``), ``rank`` (in the communicator),
  ``n_ranks``, ``nnodes``;
- ``metadata`` (inspectorCommInfoMetaHeader): ``inspector_output_format_version`` (always
  ``v4.0``), ``git_rev``, ``rec_mechanism`` (``nccl_profiler_interface``), ``dump_timestamp_us``
  (when the line was written, us since the epoch), ``hostname``, ``pid``;
- ``coll_perf`` (inspectorCompletedColl): ``coll`` (ncclFuncToString: ``AllReduce``), ``coll_sn``
  (the communicator's count of earlier collectives of that function, from 0: src/plugin/profiler.cc
  passes ``comm->seqNumber[func]``), ``coll_msg_size_bytes`` (the type size times NCCL's count,
  inspector_plugin.cc inspectorPluginCollInfoInit: one rank's share for AllGather and
  ReduceScatter, whose counts src/collectives.cc takes per rank), ``coll_exec_time_us``,
  ``coll_timing_source`` (``kernel_gpu``), ``coll_algobw_gbs``, ``coll_busbw_gbs``; without
  NCCL_INSPECTOR_DUMP_VERBOSE no more keys.

Each record's busbw is a value planted for its instance, so a test can tell which it joined.
"""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import orjson

from commtag.merge.analysis.analyze import message_bytes
from commtag.merge.inputs.inspector import comm_name
from commtag.vocab import COLLECTIVES, PER_RANK_SIZE


def planted_busbw(rank: int, k: int) -> float:
    """The busbw planted on rank ``rank``'s ``k``-th record of a communicator."""
    return round(100 + rank + k / 1000, 6)


def write_dumps(instances, processes: dict[int, tuple[str, int]], out: Path, *, teardown_ranks=frozenset(),
                min_size: int = 16384, before: int = 2, stray: int = 3) -> dict[tuple, float]:
    """Dumps for ``instances`` (each rank's NCCL-timed collectives) into ``out``. Ranks in
    ``teardown_ranks`` dump once, after the job (a record per instance). The others dump as they go
    (each record 1 ms after its operation ended, never before an earlier one), per communicator and
    rank: ``before`` records of operations before the profiled window, a record per instance of at
    least ``min_size`` bytes (the plugin's NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES leaves smaller ones
    out), and after each third an operation the traces do not show (a Broadcast of 8 bytes).
    ``processes``: each rank's (host, pid), as its sidecar says. The lowest rank also writes
    ``stray`` records of a communicator no trace shows (``"pp:9"``). Returns (rank, pg uid, Seq,
    replay) -> the busbw planted for the instances given a record."""
    hosts = {rank: host for rank, (host, _) in processes.items()}
    out.mkdir(parents=True, exist_ok=True)
    planted: dict[tuple, float] = {}
    by_rank: dict[int, dict[str, list]] = {}
    for inst in instances:
        if inst.is_p2p or inst.source not in ("nccl-kernel", "graph-replay"):
            continue
        by_rank.setdefault(inst.rank, {}).setdefault(comm_name(inst), []).append(inst)
    for rank, comms in sorted(by_rank.items()):
        lines: list[bytes] = []
        pid = processes[rank][1]

        def line(header: dict, coll: str, sn: int, size: int, dump_ns: int, busbw: float) -> bytes:
            metadata = {"inspector_output_format_version": "v4.0", "git_rev": "0000000",
                        "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": dump_ns // 1000,
                        "hostname": hosts[rank], "pid": pid}
            perf = {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": 42,
                    "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": round(busbw / 2, 6),
                    "coll_busbw_gbs": busbw}
            return orjson.dumps({"header": header, "metadata": metadata, "coll_perf": perf})

        for name, insts in sorted(comms.items()):
            insts.sort(key=lambda i: (i.start_ns, i.end_ns))
            first = insts[0]
            header = {"id": f"0x{zlib.crc32(name.encode()):x}", "comm_name": name,
                      "rank": first.group_ranks.index(rank), "n_ranks": len(first.group_ranks),
                      "nnodes": len({hosts[r] for r in first.group_ranks})}
            teardown = insts[-1].end_ns + 50_000_000 if rank in teardown_ranks else None
            sn: Counter[str] = Counter()  # NCCL's per-function sequence numbers, from 0
            dumped = 0

            def record(coll: str, size: int, done_ns: int, busbw: float) -> None:
                nonlocal dumped
                dumped = teardown if teardown is not None else max(dumped, done_ns + 1_000_000)
                lines.append(line(header, coll, sn[coll], size, dumped, busbw))
                sn[coll] += 1

            row = COLLECTIVES[first.collective]
            for _ in range(0 if teardown else before):  # dumped before the window's first collective ended: not its
                record(row.nccl_kernel, _size(first), first.start_ns - 6_000_000, 1.0)
            for k, inst in enumerate(insts):
                coll = COLLECTIVES[inst.collective].nccl_kernel
                if teardown or message_bytes(inst) >= min_size:
                    busbw = planted_busbw(rank, k)
                    record(coll, _size(inst), inst.end_ns, busbw)
                    planted[(rank, inst.pg_uid, inst.seq, inst.replay)] = busbw
                else:
                    sn[coll] += 1  # counted by NCCL, left out of the dump
                if k % 3 == 2 and not teardown:
                    record("Broadcast", 8, inst.end_ns, 2.0)
        if rank == min(by_rank):
            stray_header = {"id": "0x9", "comm_name": "pp:9", "rank": 0, "n_ranks": 2, "nnodes": 1}
            lines += [line(stray_header, "AllReduce", sn, 65536, 1000, 1.0) for sn in range(stray)]
        (out / f"{hosts[rank]}-pid{pid}.log").write_bytes(b"\n".join(lines) + b"\n")
    return planted


def _size(inst) -> int:
    nbytes = message_bytes(inst)
    row = COLLECTIVES[inst.collective]
    return nbytes // len(inst.group_ranks) if row.nccl_kernel in PER_RANK_SIZE else nbytes

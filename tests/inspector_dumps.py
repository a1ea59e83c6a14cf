"""NCCL Inspector dumps generated for a job's collectives, in the plugin's format.

No Inspector runs here (it needs NCCL on GPUs), so the tests write what it would: one file per
process named ``<hostname>-pid<pid>.log`` and one JSON object a line, each field as NCCL's
Inspector plugin (plugins/profiler/inspector, earlier ext-profiler/inspector: inspector.cc and
its JSON writer; its README's "JSON output" gives the same record) writes it:

- ``header``: ``id`` (the communicator's hash), ``comm_name`` (torch's commName,
  ``"<group_desc>:<group_name>"``), ``rank`` (in the communicator), ``n_ranks``, ``nnodes``;
- ``metadata``: ``inspector_output_format_version`` (``v4.2``; ``v4.3`` writes header and
  metadata once per communicator in a ``dump_stats`` record), ``git_rev``, ``rec_mechanism``
  (``nccl_profiler_interface``), ``dump_timestamp_us`` (when the record was dumped, us since the
  epoch), ``hostname``, ``pid``;
- ``coll_perf``: ``coll`` (NCCL's name: ``AllReduce``), ``coll_sn`` (the communicator's operation
  count), ``coll_msg_size_bytes`` (NCCL's count times the type size: one rank's share for
  AllGather and ReduceScatter), ``coll_exec_time_us``, ``coll_timing_source`` (``kernel_gpu``),
  ``coll_algobw_gbs``, ``coll_busbw_gbs``.

Each record's busbw is a value planted for its instance, so a test can tell which it joined.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import orjson

from commtag.merge.analysis.analyze import message_bytes
from commtag.merge.inputs.inspector import comm_name
from commtag.vocab import COLLECTIVES, PER_RANK_SIZE


def planted_busbw(rank: int, k: int) -> float:
    """The busbw planted on rank ``rank``'s ``k``-th record of a communicator."""
    return round(100 + rank + k / 1000, 6)


def write_dumps(instances, processes: dict[int, tuple[str, int]], out: Path, *, v43_ranks=frozenset(),
                min_size: int = 16384, before: int = 2, stray: int = 3) -> dict[tuple, float]:
    """Dumps for ``instances`` (each rank's NCCL-timed collectives) into ``out``. Ranks in
    ``v43_ranks`` write format v4.3, dumped at teardown (one ``dump_stats`` per communicator, a
    record per instance). The others write v4.2 dumped as they go (each record 1 ms after its
    operation ended), per communicator and rank: ``before`` records of operations before the
    profiled window, a record per instance of at least ``min_size`` bytes (the plugin's
    NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES leaves smaller ones out), and after each third an operation
    the traces do not show (a Broadcast of 8 bytes). ``processes``: each rank's (host, pid), as its
    sidecar says. The lowest rank also writes ``stray`` records of a communicator no trace shows
    (``"pp:9"``). Returns (rank, pg uid, Seq, replay) -> the busbw planted for the instances given a record."""
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
        for name, insts in sorted(comms.items()):
            insts.sort(key=lambda i: (i.start_ns, i.end_ns))
            first = insts[0]
            header = {"id": f"0x{zlib.crc32(name.encode()):x}", "comm_name": name,
                      "rank": first.group_ranks.index(rank), "n_ranks": len(first.group_ranks),
                      "nnodes": len({hosts[r] for r in first.group_ranks})}
            v43 = rank in v43_ranks

            def record(coll: str, sn: int, size: int, dump_ns: int, busbw: float) -> None:
                metadata = {"inspector_output_format_version": "v4.3" if v43 else "v4.2", "git_rev": "0000000",
                            "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": dump_ns // 1000,
                            "hostname": hosts[rank], "pid": pid}
                perf = {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": 42.5,
                        "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": round(busbw / 2, 6),
                        "coll_busbw_gbs": busbw}
                lines.append(orjson.dumps({"coll_perf": perf} if v43 else
                                          {"header": header, "metadata": metadata, "coll_perf": perf}))

            if v43:
                lines.append(orjson.dumps({"dump_stats": {"header": header, "metadata": {
                    "inspector_output_format_version": "v4.3", "git_rev": "0000000",
                    "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": insts[-1].end_ns // 1000 + 50_000,
                    "hostname": hosts[rank], "pid": pid}}}))
            sn = 0
            row = COLLECTIVES[first.collective]
            for _ in range(0 if v43 else before):  # dumped before the window's first collective ended: not its
                sn += 1
                record(row.nccl_kernel, sn, _size(first), first.start_ns - 5_000_000, 1.0)
            for k, inst in enumerate(insts):
                sn += 1
                if v43 or message_bytes(inst) >= min_size:
                    busbw = planted_busbw(rank, k)
                    record(COLLECTIVES[inst.collective].nccl_kernel, sn, _size(inst), inst.end_ns + 1_000_000, busbw)
                    planted[(rank, inst.pg_uid, inst.seq, inst.replay)] = busbw
                if k % 3 == 2 and not v43:
                    sn += 1
                    record("Broadcast", sn, 8, inst.end_ns + 1_000_000, 2.0)
        if rank == min(by_rank):
            for sn in range(1, stray + 1):
                lines.append(orjson.dumps({
                    "header": {"id": "0x9", "comm_name": "pp:9", "rank": 0, "n_ranks": 2, "nnodes": 1},
                    "metadata": {"inspector_output_format_version": "v4.2", "git_rev": "0000000",
                                 "rec_mechanism": "nccl_profiler_interface", "dump_timestamp_us": 1, "hostname": hosts[rank],
                                 "pid": pid},
                    "coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 65536, "coll_exec_time_us": 1.0,
                                  "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": 1.0, "coll_busbw_gbs": 1.0}}))
        (out / f"{hosts[rank]}-pid{pid}.log").write_bytes(b"\n".join(lines) + b"\n")
    return planted


def _size(inst) -> int:
    nbytes = message_bytes(inst)
    row = COLLECTIVES[inst.collective]
    return nbytes // len(inst.group_ranks) if row.nccl_kernel in PER_RANK_SIZE else nbytes

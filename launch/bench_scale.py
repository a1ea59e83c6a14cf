"""The merge of a 1,024-rank job with ``--detail none``, and a projection to 16,384 ranks on 64 hosts.

The job (``commtag.testing.scaleset``, reused when present):
1,024 ranks of about 5,000 events each, 8 ranks per host, 8-way tensor-parallel
groups (128 of them), 128-way data-parallel groups (8), the world group, CUDA
graph replays. Two smaller sets give the per-rank and per-event costs: 128
ranks of the same size and 32 ranks of 20,000 events (as many events as the
128-rank set in a quarter of the ranks).

What runs, each in its own process (peak RSS is every process's VmHWM, polled
from /proc as in launch/bench_merge.py):

* ``-j 1`` (unless ``--skip-j1``) and ``torchrun-2``:
  ``python -m commtag.merge DIR -o OUT --detail none`` on the 1,024-rank set;
* ``-j 2`` and ``-j 4`` on the 1,024- and the 128-rank set: the same merge through the
  library (:func:`shares`), the analysis shared out (commtag/merge/engine/shards.py), worker 0
  (the lead) timed: each stage's CPU, the bytes each all-gather brings it by what they carry
  (every rank's summaries, the records dealt to their owners, the rows going back, the pooled
  numbers, the member times for the lead's replay) and the CPU of parsing them, its VmHWM
  around the replay, and what the largest part of each kind holds once parsed (tracemalloc);
  the other workers run as they are, their peaks polled. Two worker counts on one set tell a
  cost per rank of the job from one per slice of a worker's share (with ``-j 2`` alone the
  two grow together);
* ``phases``: the merge in one process through the library, with
  ``--align collectives``, timing its stages (clock alignment, reading and
  converting the ranks, gathering, analysis, lanes) on each set (the convert fit per rank
  and per event, --align's cost, the output per slice);
* a process importing torch and joining a gloo group (what a worker on several hosts adds);
* the checks: ``commtag validate`` on the ``-j 2`` output, the torchrun
  output byte-identical to it, the output read back (ranks, collective
  slices, distinct collectives and group sizes as the generator's manifest
  says), worker 0 of every sharded merge counting every slice, every rank's account
  (events read as generated; left out only
  metadata, launch flows and the timeline ``--detail none`` omits), the
  clock offsets ``--align`` found against the manifest's.

Then the costs and the projection (:func:`costs`, :func:`projection`): a worker's time is
converting its own ranks + the rest of its work fitted as a fixed part, a part per rank of the
job and a part per slice of its share + parsing what the all-gathers bring it + the lanes of
its ranks, and the lead adds its replay over the whole job; its bytes received per what they
carry; its peak RSS fitted as a fixed part, a part per rank of the job and a part per slice of
its share, plus its largest round once parsed, and the lead's extra per slice of the job.
Usage: ``python launch/bench_scale.py [--quick] [--skip-j1] [--workdir DIR] [--json FILE]``
(``--report FILE`` prints again what ``--json FILE`` saved). 6 to 11 minutes on
the 2-core machine at load 6 to 10 once the sets exist (generating them: about 4 more).
Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Sequence

import orjson

from commtag.testing.bench import machine, markdown_table, run_child

HERE = Path(__file__).resolve()
TP = 8
RANKS_PER_NODE = 8
#: name -> (ranks, events per rank): the job, fewer ranks of its size, fewer and longer ranks.
SETS = {"big": (1024, 5_000), "small": (128, 5_000), "long": (32, 20_000)}
#: --quick: the same shapes, small enough to try the script in a minute.
QUICK_SETS = {"big": (64, 5_000), "small": (16, 5_000), "long": (8, 20_000)}
BIG = "big"
#: The job projected: ranks, merge hosts, workers per host (as on this 2-core machine).
PROJECT_RANKS = 16_384
PROJECT_HOSTS = 64
PROJECT_WORKERS_PER_HOST = 2
#: What --detail none leaves out of every rank, besides nothing else (rows.left_out_reason's words).
EXPECTED_LEFT_OUT = ("timeline not written (--detail)", "launch flows 'ac2g'", "metadata (")
CHILD_TIMEOUT_S = 900.0


# --------------------------------------------------------------------------- the children


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def phases(directory: Path, out: Path) -> dict:
    """Merge ``directory`` in this process (--detail none, --align collectives), timing each stage."""
    from commtag.merge import merge
    from commtag.merge.engine import pipeline
    from commtag.merge.analysis.hook import MergeAnalysis
    from commtag.merge.inputs.selection import Selection

    stages: dict[str, dict] = {}

    def timed(name: str, func):
        # CPU time, steadier than wall time on a shared machine (and what a host of its own would take).
        def wrapper(*args, **kwargs):
            start, cpu = time.perf_counter(), time.process_time()
            result = func(*args, **kwargs)
            stages[name] = {"s": time.process_time() - cpu, "wall_s": time.perf_counter() - start,
                            "rss_kb": _status_kb("VmRSS"), "hwm_kb": _status_kb("VmHWM")}
            return result
        return wrapper

    # Instrumentation only: the stages run unchanged, each wrapped in a timer.
    pipeline.align_clocks = timed("align", pipeline.align_clocks)
    pipeline.write_ranks = timed("convert", pipeline.write_ranks)
    pipeline.gather = timed("gather", pipeline.gather)
    pipeline.write_lanes = timed("lanes", pipeline.write_lanes)
    pipeline.share_analysis = timed("analysis", pipeline.share_analysis)  # the one driver, in a world of one
    analysis = MergeAnalysis()
    start_kb = _status_kb("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    result = merge(directory, out, align="collectives", analysis=analysis, jobs=1,
                   selection=Selection(detail=frozenset()), progress=False)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    hwm_kb = _status_kb("VmHWM")
    accounts = {a.rank: a for a in result.accounts}
    reasons: dict[str, int] = {}
    for account in accounts.values():
        for reason, count in account.left_out.items():
            reasons[reason] = reasons.get(reason, 0) + count
    align = result.alignment
    found = analysis.result
    return {
        "total_s": total, "cpu_s": total_cpu, "start_rss_kb": start_kb, "hwm_kb": hwm_kb, "stages": stages,
        "instances": len(result.instances),
        "output_bytes": out.stat().st_size,
        "ranks": sorted(result.ranks),
        "events_read": {str(r): a.read - a.left_out.get(_metadata_reason(a), 0) for r, a in accounts.items()},
        "written": sum(a.written for a in accounts.values()),
        "left_out": reasons,
        "offsets_ns": {str(r): o for r, o in align.offsets.items()},
        "align": {"unit": align.unit, "matched": align.matched, "clocks": align.clocks,
                  "residual_median_ns": align.residual_median_ns, "residual_max_ns": align.residual_max_ns},
        "desyncs": len(found.desyncs) if found else None, "findings": len(found.findings) if found else None,
        "skipped": [str(e) for e in result.skipped], "warnings": result.warnings,
    }


def _metadata_reason(account) -> str:
    return next((r for r in account.left_out if r.startswith("metadata (")), "")


def shares(directory: Path, out: Path, jobs: int) -> dict:
    """Merge ``directory`` with ``jobs`` workers through the library (--detail none), timing worker 0
    (this process, the lead): each stage's CPU, the bytes every all-gather brings it and the CPU of
    parsing them, by what they carry, and its VmHWM around the lead's replay. The other workers run
    unchanged; their peaks are polled from outside (:func:`run_merges`)."""
    from commtag.merge import merge
    from commtag.merge.engine import exchange, jobs as launch, pipeline, shards
    from commtag.merge.inputs.selection import Selection

    stack: list[str] = []
    cpu: dict[str, float] = {}
    parse: dict[str, float] = {}
    received: dict[str, int] = {}
    parsed_b: dict[str, int] = {}
    largest: dict[str, int] = {}
    rounds: dict[str, int] = {}
    found: dict = {"back": False}
    kept: dict[str, int] = {}
    waited: dict[str, float] = {}
    in_exchange = {"parse": 0.0, "gather": 0.0}

    def carried() -> str:
        # What an all-gather carries, from the stage it runs in (engine/shards.py's steps).
        if "lead" in stack:
            return "lead"
        if "route" in stack:
            return "back" if found["back"] else "records"
        return "numbers" if "analysis" in stack else "summaries"

    def timed(name: str, func):
        # Instrumentation only: the stage runs unchanged, timed (CPU: what a core of its own would take).
        def wrapper(*args, **kwargs):
            stack.append(name)
            start = time.process_time()
            try:
                return func(*args, **kwargs)
            finally:
                cpu[name] = cpu.get(name, 0.0) + time.process_time() - start
                stack.pop()
        return wrapper

    this_round = {"parsed": 0}

    def loads(blob):
        # Every orjson.loads in engine/exchange.py parses what a gather brought: of a round of pieces
        # (exchange.addressed) only the line of sizes and this worker's own piece, else whole parts.
        start = time.process_time()
        data = orjson.loads(blob)
        key = carried()
        parse[key] = parse.get(key, 0.0) + time.process_time() - start
        if "exchange" in stack:
            in_exchange["parse"] += time.process_time() - start
        parsed_b[key] = parsed_b.get(key, 0) + len(blob)
        this_round["parsed"] += len(blob)
        largest[key] = max(largest.get(key, 0), this_round["parsed"])
        if len(blob) > kept.get(key, 0):  # the largest document of each kind, parsed again below, on disk meanwhile
            kept[key] = len(blob)
            out.with_suffix(f".{key}.blob").write_bytes(blob)
        return data

    gather_bytes = launch.LocalWorld.all_gather_bytes

    def gathered(world, data: bytes) -> list[bytes]:
        start = time.process_time()
        blobs = gather_bytes(world, data)  # the file world's writing, waiting and reading: the network's part
        got, key = sum(len(b) for i, b in enumerate(blobs) if i != world.index), carried()
        waited[key] = waited.get(key, 0.0) + time.process_time() - start
        if "exchange" in stack:
            in_exchange["gather"] += time.process_time() - start
        received[key] = received.get(key, 0) + got
        rounds[key] = rounds.get(key, 0) + 1
        this_round["parsed"] = 0  # what loads() parses next is this round's
        return blobs

    def back_pieces(*args):
        found["back"] = True
        return back(*args)

    def lead(*args):
        found["hwm_before_lead_kb"] = _status_kb("VmHWM")
        result = lead_timed(*args)
        found["hwm_after_lead_kb"] = _status_kb("VmHWM")
        return result

    def analysis(world, held, *args):
        found["own_ranks"] = len(held.records)
        found["own_slices"] = sum(held.counts[rank] for rank in held.records)
        outcome = analysis_timed(world, held, *args)
        found["share"], found["most_at_once"] = outcome.analysed, outcome.most_at_once
        return outcome

    back, lead_timed = shards.back_pieces, timed("lead", shards._on_lead)
    analysis_timed = timed("analysis", pipeline.share_analysis)
    launch.LocalWorld.all_gather_bytes = gathered
    exchange.orjson = SimpleNamespace(dumps=orjson.dumps, loads=loads)
    shards.back_pieces, shards._on_lead, shards.route = back_pieces, lead, timed("route", shards.route)
    pipeline.share_analysis = analysis
    pipeline.write_ranks = timed("convert", pipeline.write_ranks)
    pipeline.gather = timed("settle", pipeline.gather)
    pipeline.exchange = timed("exchange", pipeline.exchange)
    pipeline.write_lanes = timed("lanes", pipeline.write_lanes)
    start = time.process_time()
    result = merge(directory, out, jobs=jobs, selection=Selection(detail=frozenset()), progress=False)
    total = time.process_time() - start
    found_analysis = result.analysis
    # What a received part holds once parsed, per byte: a round's parts are all parsed before any is let go.
    held: dict[str, float] = {}
    for key in kept:
        path = out.with_suffix(f".{key}.blob")
        blob = path.read_bytes()
        path.unlink()
        tracemalloc.start()
        parsed = orjson.loads(blob)
        held[key] = tracemalloc.get_traced_memory()[0] / len(blob)
        tracemalloc.stop()
        del parsed, blob
    return {
        "workers": jobs, "lead": result.lead, "slices": result.slices, "ranks": len(result.ranks),
        "cpu_s": total, "stages_s": cpu, "parse_s": parse, "gather_s": waited,
        "in_exchange_s": in_exchange, "received_b": received, "parsed_b": parsed_b, "largest_round_b": largest,
        "rounds": rounds, "parsed_per_byte": held, "hwm_kb": _status_kb("VmHWM"), **{k: v for k, v in found.items() if k != "back"},
        "desyncs": len(found_analysis.desyncs) if found_analysis else None,
        "skipped": [str(e) for e in result.skipped],
    }


def readback(path: Path) -> dict:
    """What the merged file says: ranks, lane slices, distinct collectives and the group sizes per group."""
    from commtag.merge.pftrace.readback import read_merged

    instances, _, coverage = read_merged(path)
    collectives = {(i.pg_uid, i.seq, i.replay) for i in instances}
    groups: dict[str, set[int]] = {}
    for i in instances:
        groups.setdefault(i.pg_uid, set()).add(i.rank)
    sizes: dict[int, int] = {}
    for members in groups.values():
        sizes[len(members)] = sizes.get(len(members), 0) + 1
    return {"ranks": sorted(coverage.windows), "slices": len(instances), "collectives": len(collectives),
            "groups_by_size": {str(k): v for k, v in sorted(sizes.items())},
            "members_match_size": all(i.group_size == len(groups[i.pg_uid]) for i in instances)}


# --------------------------------------------------------------------------- the parent


def _ensure_set(workdir: Path, ranks: int, per_rank: int) -> tuple[Path, dict]:
    directory = workdir / f"scale-{ranks}x{per_rank}"
    print(f"scale set: {ranks} ranks x {per_rank} events in {directory}", file=sys.stderr, flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "commtag.testing.scaleset", "--ranks", str(ranks), "--events", str(ranks * per_rank),
         "--tp", str(TP), "--ranks-per-node", str(RANKS_PER_NODE), "-o", str(directory), "--reuse"],
        capture_output=True, text=True, check=False, timeout=CHILD_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise SystemExit(f"generating {directory} failed:\n{done.stderr}")
    return directory, orjson.loads(done.stdout)


def _json_child(mode: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE), mode, *args], capture_output=True, text=True, check=False,
                          timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise SystemExit(f"{mode} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return orjson.loads(done.stdout)


def _merge_command(variant: str, directory: Path, out: Path) -> list[str]:
    py = sys.executable
    common = [str(directory), "-o", str(out), "--detail", "none", "--no-progress"]
    if variant == "-j 1":
        return [py, "-m", "commtag.merge", *common, "-j", "1"]
    if variant.startswith("-j"):  # the analysis shared out: worker 0 timed (shares())
        return [py, str(HERE), "_shares", str(directory), str(out), variant.removeprefix("-j "),
                str(out.with_suffix(".json"))]
    workers = variant.split("-")[1]
    return [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}", "-m", "commtag.merge",
            *common]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_merges(directory: Path, variants: Sequence[str], outdir: Path) -> dict[str, dict]:
    """Each variant once, its wall time, every merge process's peak RSS, the output's size and hash."""
    runs = {}
    outdir.mkdir(parents=True, exist_ok=True)
    for variant in variants:
        out = outdir / f"{variant.replace(' ', '')}.pftrace"
        child = run_child(_merge_command(variant, directory, out), timeout_s=CHILD_TIMEOUT_S)
        # The merge processes: under -j worker 0 (this script's _shares, or -j 1's commtag.merge) and the
        # workers it starts (serve(), commtag.merge.engine.jobs); under torchrun its workers (the agent,
        # torch.distributed.run, merges nothing).
        merges = [(cmd, peak) for cmd, peak in child.peaks.values()
                  if ("commtag.merge" in cmd or "_shares" in cmd) and "torch.distributed.run" not in cmd]
        runs[variant] = {
            "wall_s": child.wall_s, "returncode": child.returncode, "error": child.stderr_tail if child.returncode else "",
            "peaks": sorted((peak for _, peak in merges), reverse=True),
            "all_peaks": {str(p): v for p, v in child.peaks.items()},
            "output_bytes": out.stat().st_size if out.exists() else 0,
            "sha256": _sha256(out) if out.exists() else "", "path": str(out),
        }
        timed = out.with_suffix(".json")
        if timed.exists():
            lead = [peak for cmd, peak in merges if "_shares" in cmd]
            others = sorted((peak for cmd, peak in merges if "serve()" in cmd), reverse=True)
            runs[variant].update(shares=orjson.loads(timed.read_bytes()), lead_peak=max(lead, default=0),
                                 worker_peaks=others, peaks=lead + others)
        status = "ok" if child.returncode == 0 else f"FAILED rc={child.returncode}"
        print(f"{directory.name} {variant:<11} {child.wall_s:7.1f} s  peaks MB "
              f"{[round(p / 1e6) for p in runs[variant]['peaks']]}  {status}", file=sys.stderr, flush=True)
    return runs


def checks(manifest: dict, runs: dict[str, dict], phased: dict, back: dict, validate_rc: int,
           back_j1: Optional[dict]) -> list[tuple[str, bool, str]]:
    """(what, passed, measured) for every correctness check on the big set."""
    ranks = manifest["ranks"]
    calls = manifest["collective_calls_per_rank"]
    groups = manifest["process_groups"]
    per_rank_events = manifest["events"] // ranks
    expected_collectives = sum(groups[role][0] * calls[role] for role in calls)
    expected_sizes: dict[str, int] = {}
    for count, size in groups.values():
        expected_sizes[str(size)] = expected_sizes.get(str(size), 0) + count
    offsets = manifest["clock_offset_us"]
    found = {int(r): o for r, o in phased["offsets_ns"].items()}
    # --align pins rank 0's clock; a rank's offset is minus its clock error relative to rank 0's.
    errors_us = [abs(found[r] / 1000 + (offsets[r] - offsets[0])) for r in range(ranks)] if len(found) == ranks else [1e9]
    same = runs["-j 2"]["sha256"] == runs["torchrun-2"]["sha256"]
    reasons = phased["left_out"]
    found_j1 = [] if back_j1 is None else [
        ("-j 1 output reads back as -j 2's (its packet sequences differ)", back_j1 == back, ""),
    ]
    return found_j1 + [
        ("every sharded merge's worker 0 led and counted every slice, nothing skipped, no desync",
         all(r["shares"]["lead"] and r["shares"]["slices"] == ranks * sum(calls.values()) and not r["shares"]["skipped"]
             and r["shares"]["desyncs"] == 0 for r in runs.values() if "shares" in r),
         ", ".join(f"{v}: {r['shares']['slices']:,}" for v, r in runs.items() if "shares" in r)),
        ("every merge exited 0", all(r["returncode"] == 0 for r in runs.values()),
         ", ".join(f"{v}: {r['returncode']}" for v, r in runs.items())),
        ("`commtag validate` passes on the -j 2 output", validate_rc == 0, f"exit {validate_rc}"),
        ("-j 2 and torchrun-2 outputs byte-identical", same, "same sha256" if same else "differ"),
        ("ranks read back = generated", back["ranks"] == list(range(ranks)), f"{len(back['ranks'])} of {ranks}"),
        ("collective slices = ranks x calls per rank", back["slices"] == ranks * sum(calls.values()),
         f"{back['slices']:,} = {ranks} x {sum(calls.values())}"),
        ("distinct collectives = groups x calls per role", back["collectives"] == expected_collectives,
         f"{back['collectives']:,} (expected {expected_collectives:,})"),
        ("groups by size (world, TP, DP) as generated", back["groups_by_size"] == dict(sorted(expected_sizes.items(),
                                                                                          key=lambda kv: int(kv[0]))),
         ", ".join(f"{n} of {s}" for s, n in back["groups_by_size"].items())),
        ("every slice's group has group_size members", back["members_match_size"], ""),
        ("every rank read as generated (phases run)",
         sorted(set(phased["events_read"].values())) == [per_rank_events] and len(phased["events_read"]) == ranks,
         f"{sorted(set(phased['events_read'].values()))} events per rank"),
        ("left out only metadata, launch flows, --detail timeline",
         all(r.startswith(EXPECTED_LEFT_OUT) for r in reasons) and phased["written"] == 0,
         "; ".join(f"{n:,} {r}" for r, n in reasons.items())),
        ("nothing skipped, no warning, no desync",
         not phased["skipped"] and not phased["warnings"] and phased["desyncs"] == 0,
         f"{len(phased['skipped'])} skipped, {len(phased['warnings'])} warnings, {phased['desyncs']} desyncs "
         f"({phased['findings']} findings)"),
        ("--align offsets = manifest clock offsets (within 1 us)", max(errors_us) < 1.0,
         f"max error {max(errors_us):.3f} us over {ranks} ranks"),
        ("--align residual end spread", phased["align"]["residual_max_ns"] < 1000,
         f"median {phased['align']['residual_median_ns'] / 1000:.1f} us, max {phased['align']['residual_max_ns'] / 1000:.1f} us"
         f" ({phased['align']['matched']:,} collectives, {phased['align']['clocks']} clocks)"),
    ]


def _lstsq(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least-squares coefficients of ys ~ rows (normal equations; a handful of unknowns)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(n)]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, n), key=lambda k: abs(a[k][col]))
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for k in range(n):
            if k != col and a[col][col]:
                f = a[k][col] / a[col][col]
                a[k] = [x - f * y for x, y in zip(a[k], a[col])]
                b[k] -= f * b[col]
    return [b[i] / a[i][i] if a[i][i] else 0.0 for i in range(n)]


#: What the all-gathers carry (:func:`shares`' labels), and the count that their bytes received by
#: one of N workers go with, q = (N - 1) / N: every rank's summary, Seq runs and lanes (per rank,
#: x q); the records dealt to their owners and the rows going back (every worker receives every
#: pair's piece of a round: per slice of the job, x q^2); the numbers every worker pools (skews,
#: flow counts, busbw edges: per slice, x q); every collective's member times for the lead's
#: replay (per slice, x q; the other workers receive them too). What a worker parses is
#: :func:`_parsed_count`'s.
CARRIED = ("summaries", "records", "back", "numbers", "lead")


#: The rounds that grow with the job or the workers (:func:`_largest_rounds`).
ROUNDS = ("summaries", "records", "back", "lead")


def members_per_rank(ranks: int) -> int:
    """The members of a rank's groups together (world, data-parallel, tensor-parallel), as the
    generator groups them: every rank's summary lists each of its groups' ranks."""
    return ranks + ranks // TP + TP


def _nnls(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """:func:`_lstsq` with no coefficient below zero: a term fitted negative (below the noise of the
    sets: a cost cannot be) is dropped and the rest fitted again; it reads 0."""
    keep = list(range(len(rows[0])))
    while True:
        found = _lstsq([[r[i] for i in keep] for r in rows], ys)
        if min(found) >= 0 or len(keep) == 1:
            out = [0.0] * len(rows[0])
            for i, k in zip(keep, found):
                out[i] = k
            return out
        keep.pop(found.index(min(found)))


def _received_count(what: str, ranks: float, slices: float, workers: int) -> float:
    q = (workers - 1) / workers
    return ranks * q if what == "summaries" else slices * q * q if what in ("records", "back") else slices * q


def _parsed_count(what: str, ranks: float, slices: float, workers: int) -> float:
    """The count the bytes one of N workers parses go with: of a round of pieces only its own (the
    records of its share and the rows back for its ranks from the others: per slice of the job x
    q / N; the member times, the lead's: x q), of what every worker shares all (as received)."""
    q = (workers - 1) / workers
    return slices * q / workers if what in ("records", "back") else _received_count(what, ranks, slices, workers)


def summaries_received(c: dict, ranks: int, workers: int) -> float:
    """Bytes of the other workers' summaries one worker receives: per rank, a part of its own and
    one per member of its groups (each summary lists its groups' ranks, so they grow as ranks squared)."""
    fixed, per_member = c["summaries_fit"]
    return (fixed + per_member * members_per_rank(ranks)) * _received_count("summaries", ranks, 0, workers)


def _largest_rounds(c: dict, ranks: int, slices: float, distinct: float, workers: int) -> dict[str, float]:
    """The bytes one worker parses in the largest round of each kind, from the bytes per slice and
    the rounds' shape in engine/shards.py and routes.py: the summaries, all in one round (with the
    analysis shared out they carry no records); a bucket's records, one piece (at most PIECE_ROWS)
    per worker pair a round, the pieces from each other worker to this one; the lead's rows, one
    per collective, at most PIECE_ROWS a piece."""
    from commtag.merge.engine.routes import PIECE_ROWS
    from commtag.merge.engine.shards import BUCKET_ROWS

    n = workers
    buckets = max(1, math.ceil(slices / (n * BUCKET_ROWS)))
    per_pair = min(PIECE_ROWS, slices / (buckets * n * n))
    lead_rounds = max(1, math.ceil(distinct / n / PIECE_ROWS))
    return {"summaries": summaries_received(c, ranks, n),
            "records": c["bytes_per"]["records"] * (n - 1) * per_pair,
            "back": c["bytes_per"]["back"] * (n - 1) * min(PIECE_ROWS, slices / (n * n)),
            "lead": c["bytes_per"]["lead"] * slices * (n - 1) / n / lead_rounds}


def distinct_collectives(manifest: dict, ranks: int) -> int:
    """Distinct collectives of a job of ``ranks`` shaped like ``manifest``'s: the world group,
    ranks / TP tensor-parallel groups and TP data-parallel ones, each with the calls of its role."""
    calls = manifest["collective_calls_per_rank"]
    return calls["default"] + ranks // TP * calls["tp"] + TP * calls["dp"]


def costs(phased: dict[str, dict], manifests: dict[str, dict], runs: dict[str, dict[str, dict]],
          torch_b: float) -> dict:
    """The costs the projection is made of: converting (one process, per rank and per event, over
    the three sets) and, from worker 0 of each sharded merge (-j 2 and -j 4 on two sets), its
    stages per own rank, per slice of its share, per rank and per slice of the job; the bytes
    per what they carry; the workers' peaks fitted."""
    names = list(phased)
    ranks = [manifests[n]["ranks"] for n in names]
    events = [manifests[n]["events"] for n in names]
    slices = [phased[n]["instances"] for n in names]
    convert = [phased[n]["stages"]["convert"]["s"] for n in names]
    per_rank_s, per_event_s = _lstsq([[r, e] for r, e in zip(ranks, events)], convert)
    sharded = []
    for name, variants in runs.items():
        for variant, r in variants.items():
            if "shares" not in r:
                continue
            s = r["shares"]
            n, job, job_ranks = s["workers"], s["slices"], manifests[name]["ranks"]
            st, parse, got, waited = s["stages_s"], s["parse_s"], s["received_b"], s["gather_s"]
            parsed = s["parsed_b"]
            lead_own = st.get("lead", 0.0) - parse.get("lead", 0.0) - waited.get("lead", 0.0)
            rounds = {k: s["largest_round_b"].get(k, 0) * s["parsed_per_byte"].get(k, 0.0) for k in ROUNDS}
            ex = s["in_exchange_s"]
            summaries_s = st["exchange"] - st["convert"] - ex["parse"] - ex["gather"]
            sharded.append({
                "set": name, "variant": variant, "workers": n, "ranks": job_ranks, "slices": job,
                "own_ranks": s["own_ranks"], "own_slices": s["own_slices"], "share": s["share"],
                "convert_per_rank_s": st["convert"] / s["own_ranks"],
                "lanes_per_slice_s": st["lanes"] / s["own_slices"],
                "lead_per_slice_s": lead_own / job,
                "parse_per_byte_s": sum(parse.values()) / max(1, sum(parsed.values())),
                # What is left of worker 0's CPU: starting, exchanging summaries, settling, keying and
                # dealing its ranks' records out, matching and checking its share, the figures back.
                # (The all-gathers' own CPU, the file world's writing, waiting and reading, is the network's part.)
                "rest_s": s["cpu_s"] - st["convert"] - st["lanes"] - lead_own - sum(parse.values()) - sum(waited.values())
                - summaries_s,
                # Decoding the other workers' summaries (their groups' rank lists made tuples and interned).
                "summaries_s": summaries_s,
                "gather_s": sum(waited.values()),
                "bytes_per": {k: got.get(k, 0) / _received_count(k, job_ranks, job, n) for k in CARRIED},
                "largest_round_b": max(s["largest_round_b"].values()),
                "parsed_per_byte": s["parsed_per_byte"],
                # The largest round's parts parsed and held at once, on top of what the worker holds.
                "round_held_b": max(rounds.values()),
                "lead_peak": r["lead_peak"], "worker_peaks": r["worker_peaks"],
                "hwm_lead_kb": [s["hwm_before_lead_kb"], s["hwm_after_lead_kb"]],
            })
    rest = _nnls([[1.0, x["ranks"], x["share"]] for x in sharded], [x["rest_s"] for x in sharded])
    summaries_fit = _lstsq([[1.0, members_per_rank(x["ranks"])] for x in sharded],
                           [x["bytes_per"]["summaries"] for x in sharded])
    # A worker's peak, the other workers' (worker 0 also replays): the largest round's parts parsed
    # (measured apart, above), on a fixed part, every rank's summary, Seq runs and lanes, and its
    # share's records and matched members.
    mem_rows = [([1.0, x["ranks"], x["share"]], p - x["round_held_b"]) for x in sharded for p in x["worker_peaks"]]
    memory = _nnls([row for row, _ in mem_rows], [p for _, p in mem_rows])
    for x in sharded:
        x["worker_fit"] = sum(k * v for k, v in zip(memory, [1.0, x["ranks"], x["share"]])) + x["round_held_b"]
        x["lead_extra_per_slice_b"] = (x["lead_peak"] - x["worker_fit"]) / x["slices"]
    jobs = [x["slices"] for x in sharded]
    big = [x for x in sharded if x["set"] == BIG]

    def mean(key: str) -> float:
        return sum(x[key] for x in sharded) / len(sharded)

    c = {
        "per_rank_s": per_rank_s, "per_event_s": per_event_s,
        "convert_fit": [(n, got, per_rank_s * r + per_event_s * e) for n, got, r, e in zip(names, convert, ranks, events)],
        "align_per_event_s": [phased[n]["stages"]["align"]["s"] / e for n, e in zip(names, events)],
        "output_per_slice_b": [phased[n]["output_bytes"] / s for n, s in zip(names, slices)],
        "names": names, "sharded": sharded,
        "rest_s": rest, "memory": memory, "summaries_fit": summaries_fit,
        # Per other worker's rank: a part of its own, and one per member of its groups.
        "summaries_time_fit": _nnls([[_received_count("summaries", x["ranks"], 0, x["workers"]),
                                      _received_count("summaries", x["ranks"], 0, x["workers"])
                                      * members_per_rank(x["ranks"])] for x in sharded],
                                    [x["summaries_s"] for x in sharded]),
        "convert_per_rank_s": mean("convert_per_rank_s"), "lanes_per_slice_s": mean("lanes_per_slice_s"),
        "lead_per_slice_s": mean("lead_per_slice_s"), "parse_per_byte_s": mean("parse_per_byte_s"),
        "bytes_per": {k: sum(x["bytes_per"][k] for x in sharded) / len(sharded) for k in CARRIED},
        # Parsed on the job most like the projected one (the longest rank lists in the summaries).
        "parsed_per_byte": {k: sum(x["parsed_per_byte"].get(k, 0.0) for x in big) / len(big) for k in ROUNDS},
        # Through the origin, weighted by the job's slices: the bigger jobs say more.
        "lead_extra_per_slice_b": sum(x["lead_extra_per_slice_b"] * j * j for x, j in zip(sharded, jobs))
        / sum(j * j for j in jobs),
    }
    for x in sharded:
        m = manifests[x["set"]]
        x["predicted_rounds"] = _largest_rounds(c, x["ranks"], x["slices"], distinct_collectives(m, x["ranks"]),
                                                x["workers"])
    c["torch_b"] = torch_b
    return c


def projection(c: dict, manifests: dict[str, dict]) -> tuple[list[list[str]], list[str]]:
    """The 16,384-rank job on 64 hosts of 2 workers, the analysis shared out, from the measured costs."""
    big = manifests[BIG]
    ranks_big = big["ranks"]
    per_rank_events = big["events"] / ranks_big
    slices_per_rank = sum(big["collective_calls_per_rank"].values())
    ranks, slices = PROJECT_RANKS, PROJECT_RANKS * slices_per_rank
    distinct = distinct_collectives(big, ranks)
    n = PROJECT_HOSTS * PROJECT_WORKERS_PER_HOST
    own_ranks, share = ranks / n, slices / n
    convert = c["convert_per_rank_s"] * own_ranks
    base_s, per_job_rank_s, per_share_s = c["rest_s"]
    per_summary_s, per_member_s = c["summaries_time_fit"]
    summaries = (per_summary_s + per_member_s * members_per_rank(ranks)) * _received_count("summaries", ranks, 0, n)
    rest = base_s + per_job_rank_s * ranks + per_share_s * share
    got = {k: c["bytes_per"][k] * _received_count(k, ranks, slices, n) for k in CARRIED}
    got["summaries"] = summaries_received(c, ranks, n)
    q = (n - 1) / n
    # Sent to this worker for itself (what a point-to-point exchange would carry): the job-wide
    # numbers, its share's records and rows back; the member times to the lead only.
    own = got["summaries"] + got["numbers"] + (c["bytes_per"]["records"] + c["bytes_per"]["back"]) * share * q
    parsed = {k: c["bytes_per"][k] * _parsed_count(k, ranks, slices, n) for k in CARRIED}
    parsed["summaries"] = got["summaries"]
    parse = c["parse_per_byte_s"] * sum(parsed.values())
    lanes_own = c["lanes_per_slice_s"] * share
    lead = c["lead_per_slice_s"] * slices
    worker = convert + summaries + rest + parse + lanes_own
    rounds = _largest_rounds(c, ranks, slices, distinct, n)
    held = {k: rounds[k] * c["parsed_per_byte"][k] for k in ROUNDS}
    base_b, per_rank_b, per_share_b = c["memory"]
    memory = base_b + per_rank_b * ranks + per_share_b * share + max(held.values())
    lead_memory = memory + c["lead_extra_per_slice_b"] * slices
    align = c["align_per_event_s"][c["names"].index(BIG)] * own_ranks * per_rank_events
    output = c["output_per_slice_b"][c["names"].index(BIG)] * slices
    rows = [
        ["workers / ranks per host / per worker", f"{n} / {ranks // PROJECT_HOSTS} / {own_ranks:.0f}"],
        ["collective slices in the job / in each worker's share", f"{slices / 1e6:.2f} M ({slices_per_rank} per rank, "
                                                                  f"{distinct:,} collectives) / {share:,.0f}"],
        ["each worker: read, convert and pack its ranks", f"{convert:.0f} s"],
        ["each worker: decode every rank's summary (its groups' rank lists)", f"{summaries:.0f} s"],
        ["each worker: deal out its records, match and check its share, figures back",
         f"{rest:.0f} s ({base_s:.1f} s + {per_job_rank_s * ranks:.1f} s for the job's ranks + "
         f"{per_share_s * share:.1f} s for its share)"],
        ["each worker: parse its pieces and what every worker shares", f"{parse:.0f} s ({sum(parsed.values()) / 1e9:.2f} GB)"],
        ["each worker: lanes of its own ranks", f"{lanes_own:.1f} s"],
        ["worker 0 (the lead): replay the impact, gather the findings (whole job)", f"{lead:.0f} s"],
        ["merge wall time, about (the lead's)", f"{worker + lead:.0f} s (+ {align:.0f} s with --align, "
                                                f"whose first pass still all-gathers every record)"],
        ["bytes each worker receives, rounds as now (every worker receives every pair's piece)",
         ", ".join(f"{k} {v / 1e6:,.0f} MB" for k, v in got.items()) + f": {sum(got.values()) / 1e9:.2f} GB"],
        ["  of which sent for it (a point-to-point exchange's; the lead + member times)",
         f"{own / 1e6:,.0f} MB (lead {(own + got['lead']) / 1e6:,.0f} MB)"],
        ["largest round a worker parses (held once parsed)",
         ", ".join(f"{k} {v / 1e6:,.0f} MB ({held[k] / 1e9:.2f} GB)" for k, v in rounds.items())],
        ["worker 0: receives and appends every part (the output)", f"{output / 1e9:.2f} GB"],
        ["peak RSS of a worker / of worker 0", f"{memory / 1e9:.2f} GB / {lead_memory / 1e9:.2f} GB"],
        ["  on worker 0's host (2 workers), + torch under torchrun",
         f"{(memory + lead_memory) / 1e9:.2f} GB, + {2 * c['torch_b'] / 1e9:.2f} GB"],
    ]
    fits = "; ".join(f"{x['set']} `{x['variant']}`" for x in c["sharded"])
    assumptions = [
        f"{PROJECT_RANKS:,} ranks like the {ranks_big}-rank set's (SPMD clones of one {per_rank_events:,.0f}-event window, "
        f"{slices_per_rank} collective calls per rank, TP {TP}, DP {PROJECT_RANKS // TP:,}, world), traces on each host's "
        f"local disk, `torchrun --nnodes={PROJECT_HOSTS} --nproc-per-node={PROJECT_WORKERS_PER_HOST}` "
        f"({n} workers of {own_ranks:.0f} ranks each), `--detail none`, the analysis shared out as engine/shards.py does.",
        f"Every time is worker 0's CPU in the sharded merges ({fits}); a worker is alone on its core. Reading, "
        f"converting and packing a rank: {c['convert_per_rank_s'] * 1e3:.1f} ms (its ranks one after another); "
        f"lanes: {c['lanes_per_slice_s'] * 1e6:.1f} us per slice of its own ranks; parsing what it takes of an all-gather: "
        f"{c['parse_per_byte_s'] * 1e9:.1f} ns per byte; the lead's replay and gathering: "
        f"{c['lead_per_slice_s'] * 1e6:.2f} us per slice of the job (its parsing counted with the rest).",
        f"Decoding the other workers' summaries (timed around the exchange, less converting, parsing and the "
        f"all-gather): {per_summary_s * 1e6:.1f} us per rank + {per_member_s * 1e9:.1f} ns per member of its groups "
        f"(least squares with no negative term over the two job sizes; {members_per_rank(ranks):,} members a rank "
        f"at {ranks:,} ranks). The rest of a worker's "
        f"CPU, least squares with no negative term over those merges: {base_s:.2f} s + "
        f"{per_job_rank_s * 1e3:.2f} ms per rank of the job (Seq runs, lanes, counts of every rank) + "
        f"{per_share_s * 1e6:.2f} us per slice of its share (-j 2 against -j 4 on one set tells these apart; "
        f"a term the fit put below zero reads 0).",
        f"Bytes received: per what they carry, from worker 0's all-gathers, divided by the count each goes with "
        f"(summaries per rank of the job x q, {c['summaries_fit'][0]:.0f} B + {c['summaries_fit'][1]:.2f} B per member of "
        f"its groups, fitted over the two job sizes; per slice of the job x q^2 for records and rows back, since every "
        "worker receives every pair's piece; x q for the pooled numbers and the member times; q = (N-1)/N). Bytes "
        "parsed: the same, but of records and rows back only the pieces sent to the worker, per slice x q / N. "
        "The network's time is not counted, only the volume and its parsing.",
        f"A worker's peak RSS = {base_b / 1e6:.0f} MB + {per_rank_b:,.0f} B per rank of the job + "
        f"{per_share_b:,.0f} B per slice of its share (least squares with no negative term over the peaks of the "
        f"workers other than worker 0 in those merges, less their largest round) + its largest round once parsed (all of a round's "
        f"parts are parsed before any is let go: "
        + ", ".join(f"{k} {c['parsed_per_byte'][k]:.1f} B" for k in ROUNDS)
        + " per byte parsed, tracemalloc on the largest document of each kind; the rounds' bytes from the bytes "
        f"per slice and engine/shards.py's buckets and pieces); worker 0 adds "
        f"{c['lead_extra_per_slice_b']:,.0f} B per slice of the job (its peak over the fit). Under torchrun each "
        f"worker also imports torch and joins a gloo group: {c['torch_b'] / 1e6:.0f} MB (a process doing only that, "
        "over a bare interpreter; on one host, as here, torchrun's workers exchange through files without torch).",
        f"Output bytes per collective slice as on the {ranks_big}-rank set (--detail none writes lanes only).",
    ]
    return rows, assumptions


def report(results: dict) -> str:
    manifests, runs, phased = results["manifests"], results["runs"], results["phased"]
    big = manifests[BIG]
    lines = [f"Machine: {results['machine']}; `uptime` before: {results['uptime_before']}; after: {results['uptime_after']}.",
             ""]
    for name, m in manifests.items():
        calls = m["collective_calls_per_rank"]
        groups = ", ".join(f"{n} {role} of {s}" for role, (n, s) in m["process_groups"].items())
        lines.append(f"- set {name}: {m['ranks']} ranks, {m['events']:,} events ({m['events'] // m['ranks']:,} per rank), "
                     f"{m['json_bytes'] / 1e6:.0f} MB JSON ({m['gz_bytes'] / 1e6:.0f} MB gzip); groups: {groups}; "
                     f"{sum(calls.values())} collective calls per rank ({m['replays_per_rank']} graph replays)")
    lines.append("")
    rows = []
    for name, variants in runs.items():
        for variant, r in variants.items():
            peaks = " / ".join(f"{p / 1e6:.0f}" for p in r["peaks"]) if r["returncode"] == 0 else "failed"
            rows.append([f"{manifests[name]['ranks']} ranks", f"`{variant}`", f"{r['wall_s']:.1f}", peaks,
                         f"{r['output_bytes'] / 1e6:.1f}"])
    for name, p in phased.items():
        stages = p["stages"]
        split = ", ".join(f"{k} {v['s']:.1f}" for k, v in stages.items())
        m = manifests[name]
        rows.append([f"{m['ranks']} ranks" + ("" if name != "long" else f" ({m['events'] // m['ranks']:,} events each)"),
                     f"phases: `-j 1 --align collectives` (CPU s: {split})", f"{p['total_s']:.1f}", f"{p['hwm_kb'] * 1024 / 1e6:.0f}",
                     f"{p['output_bytes'] / 1e6:.1f}"])
    lines.append(markdown_table(["set", "variant", "wall s", "peak RSS MB per merge process (worker 0 first)",
                                 "output MB"], rows))
    lines.append("")
    lines.append(f"Checks on the {big['ranks']:,}-rank merges:")
    lines.append("")
    lines.append(markdown_table(["check", "result", "measured"],
                                [[what, "pass" if ok else "FAIL", got] for what, ok, got in results["checks"]]))
    c = results["costs"]
    lines.append("")
    lines.append("Worker 0 of each sharded merge (CPU s, stages inclusive: route within analysis, lead within "
                 "analysis; MB received over its all-gathers, by what they carry, and parsed; the largest round of each kind "
                 "it parsed, measured / as the model predicts it; the other workers' peaks against the memory fit, "
                 "and the part of it that is the largest round parsed):")
    lines.append("")
    rows = []
    for x, name in ((x, x["set"]) for x in c["sharded"]):
        s = runs[name][x["variant"]]["shares"]
        st = s["stages_s"]
        stages = ", ".join(f"{k} {st.get(k, 0.0):.1f}" for k in ("convert", "settle", "analysis", "route", "lead", "lanes"))
        got = ", ".join(f"{k} {s['received_b'].get(k, 0) / 1e6:.1f} ({s['parsed_b'].get(k, 0) / 1e6:.1f})"
                        for k in CARRIED)
        rows.append([f"{x['ranks']} ranks `{x['variant']}`", f"{x['own_ranks']} / {x['share']:,}",
                     f"{s['cpu_s']:.1f} ({stages}; parse {sum(s['parse_s'].values()):.1f}, "
                     f"all-gathers {x['gather_s']:.1f})", got,
                     ", ".join(f"{k} {s['largest_round_b'].get(k, 0) / 1e6:.1f} / {x['predicted_rounds'][k] / 1e6:.1f}"
                               for k in ROUNDS),
                     " / ".join(f"{p / 1e6:.0f}" for p in x["worker_peaks"]) + f" vs {x['worker_fit'] / 1e6:.0f} "
                     f"(round {x['round_held_b'] / 1e6:.0f})",
                     f"{x['lead_peak'] / 1e6:.0f} ({x['hwm_lead_kb'][0] * 1024 / 1e6:.0f} before its replay)"])
    lines.append(markdown_table(["merge", "own ranks / share (slices)", "worker 0 CPU s", "MB received (parsed)",
                                 "largest round MB", "other workers' peak MB vs fit", "worker 0's peak MB"], rows))
    lines.append("")
    lines.append(f"Costs (one process, CPU time): reading and converting a rank {c['per_rank_s'] * 1e3:.1f} ms + "
                 f"{c['per_event_s'] * 1e6:.1f} us per event (fit: "
                 + ", ".join(f"{n} {got:.1f} s vs {fit:.1f} s" for n, got, fit in c["convert_fit"]) + "); "
                 + " / ".join(f"{x:.0f}" for x in c["output_per_slice_b"]) + " B of output per slice"
                 + f" (sets {', '.join(c['names'])}). Sharded, per worker 0 (" +
                 ", ".join(f"{x['set']} `{x['variant']}`" for x in c["sharded"]) + "): converting and packing a rank "
                 + " / ".join(f"{x['convert_per_rank_s'] * 1e3:.1f}" for x in c["sharded"]) + " ms, lanes "
                 + " / ".join(f"{x['lanes_per_slice_s'] * 1e6:.1f}" for x in c["sharded"]) + " us per own slice, "
                 "the lead's replay " + " / ".join(f"{x['lead_per_slice_s'] * 1e6:.2f}" for x in c["sharded"])
                 + " us per slice of the job, parsing " + " / ".join(f"{x['parse_per_byte_s'] * 1e9:.1f}" for x in c["sharded"])
                 + " ns per byte parsed; bytes received per unit: " + "; ".join(
                     f"{k} " + " / ".join(f"{x['bytes_per'][k]:.0f}" for x in c["sharded"]) for k in CARRIED)
                 + "; worker 0's peak over the fit " + " / ".join(f"{x['lead_extra_per_slice_b']:.0f}" for x in c["sharded"])
                 + " B per slice of the job.")
    rows, assumptions = projection(c, manifests)
    lines.append("")
    lines.append(f"Projection: {PROJECT_RANKS:,} ranks on {PROJECT_HOSTS} merge hosts")
    lines.append("")
    lines.append(markdown_table(["what", "projected"], rows))
    lines.append("")
    lines.append("Assumptions:")
    lines += [f"- {a}" for a in assumptions]
    return "\n".join(lines)


#: What a worker on several hosts adds (engine/worlds.py's TorchWorld): torch and a gloo group of its own.
_TORCH = ("import torch.distributed as d; d.init_process_group('gloo', init_method='tcp://127.0.0.1:29517', "
          "rank=0, world_size=1); d.destroy_process_group()")


def torch_peak() -> float:
    """The peak RSS a process importing torch and joining a gloo group takes over a bare interpreter's
    (on one host torchrun's workers exchange through files and import no torch)."""
    bare = run_child([sys.executable, "-c", "pass"], timeout_s=CHILD_TIMEOUT_S)
    joined = run_child([sys.executable, "-c", _TORCH], timeout_s=CHILD_TIMEOUT_S)
    if joined.returncode != 0:
        raise SystemExit(f"torch with a gloo group failed:\n{joined.stderr_tail}")
    return float(max(p for _, p in joined.peaks.values()) - max(p for _, p in bare.peaks.values()))


def _uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_phases":
        print(orjson.dumps(phases(Path(argv[1]), Path(argv[2]))).decode())
        return 0
    if argv and argv[0] == "_shares":
        Path(argv[4]).write_bytes(orjson.dumps(shares(Path(argv[1]), Path(argv[2]), int(argv[3]))))
        return 0
    if argv and argv[0] == "_readback":
        print(orjson.dumps(readback(Path(argv[1]))).decode())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64, 16 and 8 ranks instead of 1,024, 128 and 32")
    parser.add_argument("--skip-j1", action="store_true", help="leave out -j 1 on the big set (and its readback)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "commtag-bench-scale")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--report", type=Path, metavar="JSON", help="print the report of results --json wrote, run nothing")
    args = parser.parse_args(argv)
    if args.report:
        results = orjson.loads(args.report.read_bytes())
        results["costs"] = costs(results["phased"], results["manifests"], results["runs"], results["torch_b"])
        print(report(results))
        return 0 if all(ok for _, ok, _ in results["checks"]) else 1
    args.workdir.mkdir(parents=True, exist_ok=True)
    sets = {name: _ensure_set(args.workdir, *shape) for name, shape in (QUICK_SETS if args.quick else SETS).items()}
    manifests = {name: m for name, (_, m) in sets.items()}
    started = time.perf_counter()
    results: dict = {"machine": machine(), "uptime_before": _uptime(), "manifests": manifests, "runs": {}, "phased": {}}
    outdir = Path(tempfile.mkdtemp(prefix="commtag-bench-scale-", dir=args.workdir))
    try:
        big_dir = sets[BIG][0]
        variants = ([] if args.skip_j1 else ["-j 1"]) + ["-j 2", "-j 4", "torchrun-2"]
        results["runs"][BIG] = run_merges(big_dir, variants, outdir / BIG)
        results["runs"]["small"] = run_merges(sets["small"][0], ["-j 2", "-j 4"], outdir / "small")
        failed = [f"{name} {variant}: {r['error']}" for name, variants in results["runs"].items()
                  for variant, r in variants.items() if r["returncode"] != 0]
        if failed:  # nothing to measure the costs on
            raise SystemExit("merges failed:\n" + "\n".join(failed))
        j2 = Path(results["runs"][BIG]["-j 2"]["path"])
        validate_rc = subprocess.run([sys.executable, "-m", "commtag", "validate", str(j2)], capture_output=True,
                                     timeout=CHILD_TIMEOUT_S, check=False).returncode
        back = _json_child("_readback", str(j2)) if j2.exists() else {"ranks": [], "slices": 0, "collectives": 0,
                                                                      "groups_by_size": {}, "members_match_size": False}
        j1 = Path(results["runs"][BIG].get("-j 1", {}).get("path", outdir / "none"))
        back_j1 = _json_child("_readback", str(j1)) if j1.exists() else None
        for name, (directory, _) in sets.items():
            print(f"phases on {name}", file=sys.stderr, flush=True)
            results["phased"][name] = _json_child("_phases", str(directory), str(outdir / f"phases-{name}.pftrace"))
        results["checks"] = checks(manifests[BIG], results["runs"][BIG], results["phased"][BIG], back, validate_rc,
                                   back_j1)
        results["torch_b"] = torch_peak()
        results["costs"] = costs(results["phased"], manifests, results["runs"], results["torch_b"])
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    results["uptime_after"] = _uptime()
    results["bench_s"] = time.perf_counter() - started
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    print(report(results))
    print(f"\n(benchmark took {results['bench_s']:.0f} s after the sets were ready)")
    return 0 if all(ok for _, ok, _ in results["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())

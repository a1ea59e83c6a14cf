"""The merge of a 1,024-rank job with ``--detail none``, and a projection to 16,384 ranks on 64 hosts.

Issue #17 item 6. The job (``commtag.testing.scaleset``, reused when present):
1,024 ranks of about 5,000 events each, 8 ranks per host, 8-way tensor-parallel
groups (128 of them), 128-way data-parallel groups (8), the world group, CUDA
graph replays. Two smaller sets give the per-rank and per-event costs: 128
ranks of the same size and 32 ranks of 20,000 events (as many events as the
128-rank set in a quarter of the ranks).

What runs, each in its own process (peak RSS is every process's VmHWM, polled
from /proc as in launch/bench_merge.py):

* ``-j 1`` (unless ``--skip-j1``), ``-j 2`` and ``torchrun-2``:
  ``python -m commtag.merge DIR -o OUT --detail none`` on the 1,024-rank set,
  and ``-j 2`` on the 128-rank set for the growth with ranks;
* ``phases``: the same merge in one process through the library, with
  ``--align collectives``, timing its stages (clock alignment, reading and
  converting the ranks, gathering, analysis, lanes) and reading VmRSS/VmHWM
  between them, on each set; it also encodes the records as the workers
  exchange them (to measure the volume) and decodes them (what each other
  worker pays);
* the checks: ``commtag validate`` on the ``-j 2`` output, the torchrun
  output byte-identical to it, the output read back (ranks, collective
  slices, distinct collectives and group sizes as the generator's manifest
  says), every rank's account (events read as generated; left out only
  metadata, launch flows and the timeline ``--detail none`` omits), the
  clock offsets ``--align`` found against the manifest's.

Then the costs (least squares over the three sets) and the projection. Usage:
``python launch/bench_scale.py [--quick] [--skip-j1] [--workdir DIR] [--json FILE]``
(``--report FILE`` prints again what ``--json FILE`` saved). About 6 minutes on
the 2-core machine at load 2-5 once the sets exist (generating them: about 4 more).
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
from pathlib import Path
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
    from commtag.merge.engine import exchange, pipeline
    from commtag.merge.analysis.hook import MergeAnalysis
    from commtag.merge.records import Interner
    from commtag.merge.inputs.selection import Selection

    stages: dict[str, dict] = {}
    kept: dict[str, list] = {}

    def timed(name: str, func):
        # CPU time, steadier than wall time on a shared machine (and what a host of its own would take).
        def wrapper(*args, **kwargs):
            start, cpu = time.perf_counter(), time.process_time()
            result = func(*args, **kwargs)
            stages[name] = {"s": time.process_time() - cpu, "wall_s": time.perf_counter() - start,
                            "rss_kb": _status_kb("VmRSS"), "hwm_kb": _status_kb("VmHWM")}
            return result
        return wrapper

    def keep_summaries(plan):
        summaries = write_ranks(plan)
        kept["summaries"] = summaries
        return summaries

    write_ranks = pipeline.write_ranks
    # Instrumentation only: the stages run unchanged, each wrapped in a timer.
    pipeline.align_clocks = timed("align", pipeline.align_clocks)
    pipeline.write_ranks = timed("convert", keep_summaries)
    pipeline.gather = timed("gather", pipeline.gather)
    pipeline.write_lanes = timed("lanes", pipeline.write_lanes)
    analysis = MergeAnalysis()
    start_kb = _status_kb("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    result = merge(directory, out, align="collectives", analysis=timed("analysis", analysis), jobs=1,
                   selection=Selection(detail=frozenset()), progress=False)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    hwm_kb = _status_kb("VmHWM")
    summaries = kept.pop("summaries")
    # What the workers exchange: this worker's records as one JSON message, and their decoding.
    wire = orjson.dumps(exchange.to_wire(summaries))
    start = time.process_time()
    exchange.from_wire(orjson.loads(wire), Interner())
    decode_s = time.process_time() - start
    accounts = {a.rank: a for a in result.accounts}
    reasons: dict[str, int] = {}
    for account in accounts.values():
        for reason, count in account.left_out.items():
            reasons[reason] = reasons.get(reason, 0) + count
    align = result.alignment
    found = analysis.result
    return {
        "total_s": total, "cpu_s": total_cpu, "start_rss_kb": start_kb, "hwm_kb": hwm_kb, "stages": stages,
        "instances": len(result.instances), "wire_bytes": len(wire), "decode_s": decode_s,
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
    if variant.startswith("-j"):
        return [py, "-m", "commtag.merge", *common, "-j", variant.removeprefix("-j ")]
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
        # The merge processes: under -j the child and the workers it starts (commtag.merge.engine.jobs),
        # under torchrun its workers (the agent, torch.distributed.run, merges nothing).
        merges = [peak for cmd, peak in child.peaks.values() if "commtag.merge" in cmd and "torch.distributed.run" not in cmd]
        runs[variant] = {
            "wall_s": child.wall_s, "returncode": child.returncode, "error": child.stderr_tail if child.returncode else "",
            "peaks": sorted(merges, reverse=True), "all_peaks": {str(p): v for p, v in child.peaks.items()},
            "output_bytes": out.stat().st_size if out.exists() else 0,
            "sha256": _sha256(out) if out.exists() else "", "path": str(out),
        }
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


def costs(phased: dict[str, dict], manifests: dict[str, dict], runs: dict[str, dict[str, dict]]) -> dict:
    """Per-rank, per-event and per-collective-slice costs, fitted over the sets."""
    names = list(phased)
    ranks = [manifests[n]["ranks"] for n in names]
    events = [manifests[n]["events"] for n in names]
    slices = [phased[n]["instances"] for n in names]
    convert = [phased[n]["stages"]["convert"]["s"] for n in names]
    per_rank_s, per_event_s = _lstsq([[r, e] for r, e in zip(ranks, events)], convert)
    after = [sum(phased[n]["stages"][k]["s"] for k in ("gather", "analysis")) for n in names]
    lanes = [phased[n]["stages"]["lanes"]["s"] for n in names]
    # A -j 2 worker's peak (the larger one) on the small and the big set: every worker holds every record.
    held = [(phased[n]["instances"], runs[n]["-j 2"]["peaks"][0]) for n in ("small", BIG)]
    per_slice_b = (held[1][1] - held[0][1]) / (held[1][0] - held[0][0])
    return {
        "per_rank_s": per_rank_s, "per_event_s": per_event_s,
        "convert_fit": [(n, c, per_rank_s * r + per_event_s * e) for n, c, r, e in zip(names, convert, ranks, events)],
        "analysis_per_slice_s": [a / s for a, s in zip(after, slices)],
        "lanes_per_slice_s": [x / s for x, s in zip(lanes, slices)],
        "align_per_event_s": [phased[n]["stages"]["align"]["s"] / e for n, e in zip(names, events)],
        "decode_per_slice_s": [phased[n]["decode_s"] / s for n, s in zip(names, slices)],
        "wire_per_slice_b": [phased[n]["wire_bytes"] / s for n, s in zip(names, slices)],
        "output_per_slice_b": [phased[n]["output_bytes"] / s for n, s in zip(names, slices)],
        "worker_base_mb": (held[0][1] - per_slice_b * held[0][0]) / 1e6, "worker_per_slice_b": per_slice_b,
        "names": names,
    }


def projection(c: dict, manifests: dict[str, dict]) -> tuple[list[list[str]], list[str]]:
    """The 16,384-rank job on 64 hosts, from the fitted costs and the big set's shape."""
    big = manifests[BIG]
    ranks_big = big["ranks"]
    per_rank_events = big["events"] / ranks_big
    slices_per_rank = sum(big["collective_calls_per_rank"].values())
    slices = PROJECT_RANKS * slices_per_rank
    per_host = PROJECT_RANKS // PROJECT_HOSTS
    workers = PROJECT_HOSTS * PROJECT_WORKERS_PER_HOST
    per_worker_ranks = per_host / PROJECT_WORKERS_PER_HOST
    big_i, small_i = c["names"].index(BIG), c["names"].index("small")
    # The analysis cost per slice grew from the small set to the big one; the high end carries that
    # growth per doubling of the ranks on to the projected job.
    per_slice = c["analysis_per_slice_s"][big_i]
    doublings = math.log2(ranks_big / manifests["small"]["ranks"])
    growth = max(0.0, per_slice - c["analysis_per_slice_s"][small_i]) / doublings
    analysis = (per_slice * slices, (per_slice + growth * math.log2(PROJECT_RANKS / ranks_big)) * slices)
    lanes_own = c["lanes_per_slice_s"][big_i] * slices / workers
    decode = c["decode_per_slice_s"][big_i] * slices * (workers - 1) / workers
    wire = c["wire_per_slice_b"][big_i] * slices
    output = c["output_per_slice_b"][big_i] * slices
    parse = per_worker_ranks * (c["per_rank_s"] + c["per_event_s"] * per_rank_events)
    align = c["align_per_event_s"][big_i] * per_worker_ranks * per_rank_events
    memory = c["worker_base_mb"] * 1e6 + c["worker_per_slice_b"] * slices
    total = [parse + decode + a + lanes_own for a in analysis]
    rows = [
        ["ranks per host / per worker", f"{per_host} / {per_worker_ranks:.0f}"],
        ["collective slices in the job", f"{slices / 1e6:.2f} M ({slices_per_rank} per rank)"],
        ["each worker: read and convert its ranks", f"{parse:.0f} s"],
        ["each worker: --align's first pass over its ranks (optional)", f"{align:.0f} s"],
        ["records all-gathered (JSON rows, as exchange.to_wire)", f"{wire / 1e9:.2f} GB from all workers; each "
                                                                f"worker, worker 0 too, receives {wire * (workers - 1) / workers / 1e9:.2f} GB"],
        ["each worker: decode the others' records", f"{decode:.0f} s"],
        ["each worker (worker 0 too): gather + analysis over every record", f"{analysis[0]:.0f}-{analysis[1]:.0f} s"],
        ["each worker: lanes of its own ranks", f"{lanes_own:.1f} s"],
        ["worker 0: receives and appends every part (the output)", f"{output / 1e9:.2f} GB"],
        ["merge wall time, about", f"{total[0]:.0f}-{total[1]:.0f} s (+ {align:.0f} s with --align)"],
        ["peak RSS of every worker (it holds the records of the whole job)", f"{memory / 1e9:.1f} GB"],
        ["  the same on one host", f"{PROJECT_WORKERS_PER_HOST * memory / 1e9:.1f} GB"],
    ]
    assumptions = [
        f"{PROJECT_RANKS:,} ranks like the {ranks_big}-rank set's (SPMD clones of one {per_rank_events:,.0f}-event window, "
        f"{slices_per_rank} collective calls per rank, TP {TP}, DP {PROJECT_RANKS // TP:,}, world), traces on each host's "
        f"local disk, `torchrun --nnodes={PROJECT_HOSTS} --nproc-per-node={PROJECT_WORKERS_PER_HOST}` "
        f"({workers} workers of {per_worker_ranks:.0f} ranks each), `--detail none`.",
        "Converting a rank costs per rank + per event as fitted over the three sets (least squares); "
        "a worker converts its ranks one after another on its own core.",
        f"Every worker gathers and analyzes every rank's records (as the merge does today: records are all-gathered); "
        f"per collective slice that cost {c['analysis_per_slice_s'][small_i] * 1e6:.1f} us at "
        f"{manifests['small']['ranks']} ranks and {per_slice * 1e6:.1f} us at {ranks_big}: the low end keeps "
        f"the {ranks_big}-rank cost, the high end adds the same growth per doubling of the ranks.",
        f"A worker's peak RSS = {c['worker_base_mb']:.0f} MB + {c['worker_per_slice_b']:.0f} B per collective slice "
        f"of the job, the line through the larger -j 2 worker's peak on the {manifests['small']['ranks']}- and "
        f"{ranks_big}-rank sets (a -j 2 worker receives half the records; one of {workers} receives nearly all, "
        "so its exchange step may peak higher). Under torchrun on several hosts each worker also imports torch "
        "and joins a gloo group (about 2 s and 300 MB, docs/benchmarks.md).",
        "The all-gather and the parts sent to worker 0 over the network are not timed; their volume is given.",
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
    lines.append(markdown_table(["set", "variant", "wall s", "peak RSS MB per merge process", "output MB"], rows))
    lines.append("")
    lines.append(f"Checks on the {big['ranks']:,}-rank merges:")
    lines.append("")
    lines.append(markdown_table(["check", "result", "measured"],
                                [[what, "pass" if ok else "FAIL", got] for what, ok, got in results["checks"]]))
    c = results["costs"]
    lines.append("")
    lines.append(f"Costs (one process, CPU time): reading and converting a rank {c['per_rank_s'] * 1e3:.1f} ms + "
                 f"{c['per_event_s'] * 1e6:.1f} us per event (fit: "
                 + ", ".join(f"{n} {got:.1f} s vs {fit:.1f} s" for n, got, fit in c["convert_fit"]) + "); "
                 "gather + analysis " + " / ".join(f"{x * 1e6:.1f}" for x in c["analysis_per_slice_s"])
                 + " us per collective slice, lanes " + " / ".join(f"{x * 1e6:.1f}" for x in c["lanes_per_slice_s"])
                 + " us, decoding exchanged records " + " / ".join(f"{x * 1e6:.1f}" for x in c["decode_per_slice_s"])
                 + " us, " + " / ".join(f"{x:.0f}" for x in c["wire_per_slice_b"]) + " B on the wire and "
                 + " / ".join(f"{x:.0f}" for x in c["output_per_slice_b"]) + " B of output per slice"
                 + f" (sets {', '.join(c['names'])}); a -j 2 worker's peak RSS {c['worker_base_mb']:.0f} MB + "
                 f"{c['worker_per_slice_b']:.0f} B per collective slice of the job.")
    rows, assumptions = projection(c, manifests)
    lines.append("")
    lines.append(f"Projection: {PROJECT_RANKS:,} ranks on {PROJECT_HOSTS} merge hosts")
    lines.append("")
    lines.append(markdown_table(["what", "projected"], rows))
    lines.append("")
    lines.append("Assumptions:")
    lines += [f"- {a}" for a in assumptions]
    return "\n".join(lines)


def _uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_phases":
        print(orjson.dumps(phases(Path(argv[1]), Path(argv[2]))).decode())
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
        results["costs"] = costs(results["phased"], results["manifests"], results["runs"])
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
        variants = ([] if args.skip_j1 else ["-j 1"]) + ["-j 2", "torchrun-2"]
        results["runs"][BIG] = run_merges(big_dir, variants, outdir / BIG)
        results["runs"]["small"] = run_merges(sets["small"][0], ["-j 2"], outdir / "small")
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
        results["costs"] = costs(results["phased"], manifests, results["runs"])
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

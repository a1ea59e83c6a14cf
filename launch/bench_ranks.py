"""Merge memory against the rank count: peak RSS of 32- and 512-rank sets of equal per-rank size.

The target: the peak RSS of a 512-rank merge may be at most 1.5x a 32-rank one's
beyond the per-collective records, which every merge keeps until its lanes are
written. So this prints, from one run:

* ``records``   the bytes one collective instance's records take, per set (a child merges
  the set in-process and measures its instances, shared parts counted once, plus what the
  merge's driver holds for each until its lane is written; see :func:`record_bytes`);
* ``merge``     ``python -m commtag.merge DIR -o FILE -j 1``: the process's peak RSS;
* ``torchrun-2`` the same under ``torchrun --nproc-per-node=2``: each worker's peak;

then per variant the 512/32 ratio of the peaks, raw and beyond the records (peak minus
the set's instances x its record bytes: a torchrun worker of N holds its share of the
instances, at most 2/N of them as -j's memory model counts them (commtag.merge.engine.jobs),
and its own ranks' share of what the driver holds for them).
Sets are generated (commtag.testing.scaleset) when missing.

Usage: ``python launch/bench_ranks.py [--ranks 32,512] [--per-rank 5000] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

import orjson

from commtag.testing.bench import machine, markdown_table, records_size, run_child, verdict

TARGET_FLAT = 1.5


def record_bytes(directory: Path) -> dict:
    """Merge ``directory`` here, in one process (``-j 1``: every record made here, none decoded
    from another worker's part), and measure what its collective records take, per instance.

    The records are every instance's object, its own args and their values, and the
    objects it shares with others (call-site args, member tuples), counted once over all;
    then what the merge's driver holds for every instance at once until its lane is written
    (its record packed by lane, what came back for it: figures, wait, cross-rank flow ids).
    """
    import tracemalloc

    from commtag.merge import merge
    from commtag.merge.engine import shards
    from commtag.merge.engine.owned import Held
    from commtag.merge.engine.worlds import SoloWorld
    from commtag.merge.records import Coverage, Interner, RankSummary

    with tempfile.TemporaryDirectory() as out:
        instances = merge(directory, Path(out) / "merged.pftrace", progress=False, jobs=1).instances
    total = records_size(instances)
    gc.collect()
    tracemalloc.start()
    kept = Held()
    for rank in sorted({inst.rank for inst in instances}):
        kept.take(RankSummary(rank, "", None, [], instances=[inst for inst in instances if inst.rank == rank]))
    shards.settle(SoloWorld(), kept)
    lanes = shards.analyse(SoloWorld(), kept, None, Coverage.unknown_windows(kept.counts), Interner()).lanes
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del lanes, kept
    n = len(instances)
    return {"instances": n, "record_bytes": total / n, "lanes_bytes": held / n, "per_instance": (total + held) / n}


def _ensure_set(workdir: Path, ranks: int, per_rank: int) -> dict:
    directory = workdir / f"ranks-{ranks}x{per_rank}"
    print(f"scale set: {ranks} ranks x {per_rank} events in {directory}", file=sys.stderr, flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "commtag.testing.scaleset", "--ranks", str(ranks), "--events", str(ranks * per_rank),
         "-o", str(directory), "--reuse"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"generating {directory} failed:\n{done.stderr}")
    return {"dir": directory, **orjson.loads(done.stdout)}


def _command(variant: str, directory: Path, out: Path) -> list[str]:
    if variant == "merge":
        return [sys.executable, "-m", "commtag.merge", str(directory), "-o", str(out), "-j", "1", "--no-progress"]
    workers = variant.split("-")[1]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={workers}",
            "-m", "commtag.merge", str(directory), "-o", str(out), "--no-progress"]


def measure(workdir: Path, ranks: Sequence[int], per_rank: int, workers: Sequence[int]) -> dict:
    """Every variant on every set, sets interleaved per variant; and each set's record cost."""
    sets = {n: _ensure_set(workdir, n, per_rank) for n in ranks}
    cost = {}
    for n, made in sets.items():
        cost_run = subprocess.run([sys.executable, __file__, "_records", str(made["dir"])],
                                  capture_output=True, text=True, check=False, timeout=1800)
        if cost_run.returncode != 0:
            raise SystemExit(f"measuring the record cost failed:\n{cost_run.stderr[-2000:]}")
        cost[n] = orjson.loads(cost_run.stdout)
        print(f"records    N={n:<4} {cost[n]['instances']} instances, {cost[n]['per_instance']:.0f} bytes each",
              file=sys.stderr, flush=True)
    runs: dict[str, dict[int, dict]] = {}
    for variant in ["merge"] + [f"torchrun-{w}" for w in workers]:
        for n in ranks:
            with tempfile.TemporaryDirectory(dir=workdir) as out:
                result = run_child(_command(variant, sets[n]["dir"], Path(out) / "merged.pftrace"), timeout_s=1800)
            peaks = result.worker_peaks if variant.startswith("torchrun") else [result.root_peak]
            runs.setdefault(variant, {})[n] = {"wall_s": result.wall_s, "peaks": peaks,
                                               "returncode": result.returncode, "error": result.stderr_tail}
            status = "ok" if result.returncode == 0 else f"FAILED rc={result.returncode}"
            print(f"{variant:<11} N={n:<4} {result.wall_s:7.1f} s peaks "
                  f"{', '.join(f'{p / 1e6:.0f}' for p in peaks)} MB {status}", file=sys.stderr, flush=True)
    return {"machine": machine(), "per_rank": per_rank, "sets": {n: {k: v for k, v in s.items() if k != "dir"}
                                                                  for n, s in sets.items()},
            "record_cost": cost, "runs": runs}


def report(results: dict) -> str:
    costs = results["record_cost"]
    small, large = min(results["sets"]), max(results["sets"])
    lines = [f"Machine: {results['machine']}.", ""]
    for n, cost in sorted(costs.items()):
        lines.append(f"{n} ranks x {results['per_rank']} events: {cost['instances']:,} collective instances, "
                     f"{cost['per_instance']:.0f} bytes of records each ({cost['record_bytes']:.0f} the instance "
                     f"and its args, {cost['lanes_bytes']:.0f} what the driver holds for it until its lane is written).")
    lines.append("")
    rows, targets = [], []
    for variant, by_n in results["runs"].items():
        peaks = {}
        for n, run in sorted(by_n.items()):
            if run["returncode"] != 0:
                rows.append([variant, str(n), "failed", "", ""])
                continue
            peak = max(run["peaks"]) if run["peaks"] else 0
            # A worker holds its share of the instances (its ranks' packed, its collectives' a bucket
            # at a time: at most 2/N) and what the driver holds for its own ranks only.
            workers = int(variant.split("-")[1]) if variant.startswith("torchrun") else 1
            cost = costs[n]
            held = min(1.0, 2 / workers)
            beyond = peak - cost["instances"] * (cost["record_bytes"] * held + cost["lanes_bytes"] / workers)
            peaks[n] = (peak, beyond)
            rows.append([variant, str(n), f"{run['wall_s']:.1f}",
                         ", ".join(f"{p / 1e6:.0f}" for p in run["peaks"]), f"{beyond / 1e6:.0f}"])
        if small in peaks and large in peaks:
            raw = peaks[large][0] / peaks[small][0]
            flat = peaks[large][1] / peaks[small][1]
            targets.append([variant, f"peak RSS {large} / {small} ranks", f"{raw:.2f}x", "-"])
            targets.append([variant, f"  beyond the records <= {TARGET_FLAT}x", f"{flat:.2f}x",
                            verdict(flat, TARGET_FLAT)])
    lines.append(markdown_table(["variant", "ranks", "wall s", "peak RSS MB (per process)",
                                 "beyond records MB"], rows))
    lines += ["", markdown_table(["variant", "ratio", "measured", "verdict"], targets)]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_records":
        print(orjson.dumps(record_bytes(Path(argv[1]))).decode())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="32,512", help="rank counts (default 32,512)")
    parser.add_argument("--per-rank", type=int, default=5000, help="events per rank (default 5000)")
    parser.add_argument("--workers", default="2", help="torchrun worker counts ('' for none; default 2)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "commtag-bench")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = measure(args.workdir, [int(x) for x in args.ranks.split(",") if x], args.per_rank,
                      [int(x) for x in args.workers.split(",") if x])
    if args.json:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    print(report(results))
    return 1 if any(r["returncode"] for by_n in results["runs"].values() for r in by_n.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

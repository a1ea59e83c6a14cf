"""A hung 1,024-rank job diagnosed from its Flight Recorder dumps: `commtag summary` on one core.

The dumps are generated (commtag.testing.fr_dumps: an NCCL job of tensor-parallel groups of 8 and
data-parallel groups of 128, each rank's ring holding its last ``--ring`` calls, a few ranks stuck before
calls at different steps; every other rank waits where a hang leaves it). Measured: the CPU and wall time of
``commtag summary DIR --format json`` in a child process bound to one CPU, and its peak RSS, against
the dumps' total size; checked: the summary names exactly the stuck ranks that no one else holds up.

Target: under 10 s of CPU on one core, peak memory bounded by the dumps' size.

Usage: ``python -m launch.bench_hangs [--ranks 1024] [--steps 700] [--ring 2000] [--json F]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from commtag.testing.bench import machine, markdown_table, run_child, verdict
from commtag.testing.fr_dumps import Job, expected_stuck, write_dumps

TARGET_S = 10.0


def stuck_ranks(world: int, steps: int) -> dict[int, int]:
    """Three ranks of three tensor-parallel groups stuck before the same step's all_reduce (each its own
    cause: a data-parallel group spans every TP group, so a rank stuck any later is held up by these)."""
    index = (steps - 10) * 3
    return {37: index, world // 2 + 5: index, world - 3: index}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--ring", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench_hangs_"))
    try:
        job = Job(world=args.ranks, tp=8, steps=args.steps, stuck=stuck_ranks(args.ranks, args.steps), ring=args.ring)
        write_dumps(job, folder)
        size = sum(p.stat().st_size for p in folder.iterdir())
        out = folder.parent / f"{folder.name}.json"
        command = [sys.executable, "-m", "commtag", "summary", str(folder), "--format", "json"]
        pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if shutil.which("taskset") else []
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run = run_child([*pin, "sh", "-c", " ".join([*command, ">", str(out)])], timeout_s=600)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if run.returncode != 0:
            sys.stderr.write(run.stderr_tail)
            return 1
        report = json.loads(out.read_text())
        out.unlink()
        peak = max((p for _, p in run.peaks.values()), default=0)
        found, wanted = report["stuck_ranks"], expected_stuck(job)
        text = subprocess.run(command[:-2], capture_output=True, text=True, check=True).stdout.splitlines()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = [("ranks", args.ranks), ("groups", len(report["fr_groups"])),
            ("calls in the rings", sum(min(args.ring, args.steps * 3) for _ in range(args.ranks))),
            ("dumps", f"{size / 2**20:.0f} MiB"), ("wall, one core", f"{run.wall_s:.1f} s"),
            ("CPU time (user + system)", f"{cpu_s:.1f} s"),
            ("peak RSS", f"{peak / 2**20:.0f} MiB"), ("hangs", len(report["hangs"])),
            ("stuck ranks named", found), ("stuck ranks generated (not held up by another)", wanted),
            ("text report lines", len(text))]
    print(f"# {args.ranks}-rank hang, diagnosed from Flight Recorder dumps ({machine()})\n")
    print(markdown_table(("figure", "value"), rows))
    # Judged on CPU time: on a shared machine the wall time mostly measures waiting for the core.
    print(f"\nCPU {cpu_s:.1f} s (wall {run.wall_s:.1f} s), target < {TARGET_S:.0f} s: {verdict(cpu_s, TARGET_S)}; "
          f"stuck ranks {'match' if found == wanted else 'DIFFER'}")
    print("\nthe report's first lines:\n" + "\n".join(text[:4]))
    if args.json is not None:
        args.json.write_text(json.dumps(dict(rows), default=str, indent=2))
    return 0 if found == wanted else 1


if __name__ == "__main__":
    sys.exit(main())

"""Each merge worker's peak RSS against one process's, on a generated job (issue #33).

``python launch/bench_shards.py DIR [--variants j1,j2,torchrun2] [--repeat N]`` merges the set in
``DIR`` (made by ``python -m commtag.testing.scaleset``) with ``--detail none`` as each variant,
and prints per run: wall seconds, every merge process's peak RSS (VmHWM polled from /proc; under
torchrun its workers', not the agent's), each worker's peak over ``-j 1``'s, the output's size and
its SHA-256 (equal digests: the same bytes). Exit status 1 when a merge fails.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from commtag.testing.bench import machine, markdown_table, run_child

#: The worker-to-single-process peak RSS the sharded analysis is held to (issue #33).
TARGET_WORKER_RATIO = 0.6


def command(variant: str, directory: Path, out: Path) -> list[str]:
    merge = ["-m", "commtag.merge", str(directory), "-o", str(out), "--detail", "none", "--no-progress"]
    if variant == "torchrun2":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *merge]
    return [sys.executable, *merge, "-j", variant.removeprefix("j")]


def workers_of(peaks: dict[int, tuple[str, int]]) -> list[int]:
    """The peak RSS (bytes) of each merge process: those running commtag.merge, not a launcher's agent
    (torchrun's) nor the -j workers' interpreter started ahead."""
    return sorted((peak for cmdline, peak in peaks.values()
                   if "commtag.merge" in cmdline and "torch.distributed.run" not in cmdline
                   or "serve()" in cmdline), reverse=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--variants", default="j1,j2,torchrun2")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    rows, single = [], None
    work = Path(tempfile.mkdtemp(prefix="commtag-shards-"))
    failed = False
    try:
        for _ in range(args.repeat):
            for variant in args.variants.split(","):
                out = work / f"{variant}.pftrace"
                run = run_child(command(variant, args.directory, out), env={**os.environ, "OMP_NUM_THREADS": "1"})
                if run.returncode != 0:
                    print(f"{variant} failed: {run.stderr_tail}", file=sys.stderr)
                    failed = True
                    continue
                peaks = [p for p in workers_of(run.peaks) if p > 0]
                if variant == "j1":
                    single = peaks[0]
                ratio = "/".join(f"{p / single:.2f}" for p in peaks) if single else "-"
                rows.append([variant, f"{run.wall_s:.1f}", " / ".join(f"{p / 2**20:.0f}" for p in peaks), ratio,
                             f"{out.stat().st_size / 1e6:.1f}", hashlib.sha256(out.read_bytes()).hexdigest()[:16]])
                out.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine())
    print(markdown_table(["variant", "wall s", "peak RSS MiB per merge process", "per worker / -j 1 "
                          f"(target <= {TARGET_WORKER_RATIO})", "output MB", "sha256"], rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

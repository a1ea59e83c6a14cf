"""Each merge worker's peak RSS against one process's, on a generated job.

``python launch/bench_shards.py DIR [--variants j1,j2,torchrun2] [--repeat N] [--before SRC]``
merges the set in ``DIR`` (``python launch/gen_scaleset.py --ranks 1024 --events 5000000 --tp 8
-o DIR``) with ``--detail none`` as each variant, and prints per run: wall seconds, every merge
process's peak RSS (VmHWM polled from /proc; under torchrun its workers', not the agent's), each
worker's peak over the same code's ``-j 1``, the output's size and SHA-256, and whether it is
``-j 1``'s bytes and the other workers' variants' bytes. ``--before SRC``: each variant also runs
with the ``commtag`` package of another checkout first on the path (``SRC/commtag``: e.g. ``git
archive main commtag | tar -x -C SRC``), alternating, so that old and new are measured in one run.
Exit status 1 when a merge fails.
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

#: The worker-to-single-process peak RSS the sharded analysis is held to.
TARGET_WORKER_RATIO = 0.6


def command(variant: str, directory: Path, out: Path) -> list[str]:
    merge = ["-m", "commtag.merge", str(directory), "-o", str(out), "--detail", "none", "--no-progress"]
    if variant == "torchrun2":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *merge]
    return [sys.executable, *merge, "-j", variant.removeprefix("j")]


def workers_of(peaks: dict[int, tuple[str, int]]) -> list[int]:
    """The peak RSS (bytes) of each merge process: those running commtag.merge, not a launcher's
    agent (torchrun's); a ``-j`` worker runs ``serve()``."""
    return sorted((peak for cmdline, peak in peaks.values()
                   if "commtag.merge" in cmdline and "torch.distributed.run" not in cmdline
                   or "serve()" in cmdline), reverse=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--variants", default="j1,j2,torchrun2")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--before", type=Path, default=None, help="a checkout's root holding commtag/, run too")
    args = parser.parse_args(argv)
    # Each code's commtag/ first on the path, the merges run in an empty folder: ``-m`` puts the
    # working folder before PYTHONPATH, so a checkout there would be "before"'s code too.
    codes = [("now", Path(__file__).resolve().parents[1])]
    codes += [("before", args.before.resolve())] if args.before else []
    directory = args.directory.resolve()
    rows = []
    single: dict[str, int] = {}
    digests: dict[tuple[str, str], str] = {}
    work = Path(tempfile.mkdtemp(prefix="commtag-shards-"))
    failed = False
    try:
        for _ in range(args.repeat):
            for variant in args.variants.split(","):
                for code, src in codes:
                    out = work / f"{code}-{variant}.pftrace"
                    env = {**os.environ, "OMP_NUM_THREADS": "1"}
                    env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
                    run = run_child(command(variant, directory, out), env=env, cwd=str(work))
                    if run.returncode != 0:
                        print(f"{code} {variant} failed: {run.stderr_tail}", file=sys.stderr)
                        failed = True
                        continue
                    peaks = [p for p in workers_of(run.peaks) if p > 0]
                    if variant == "j1":
                        single[code] = peaks[0]
                    ratio = "/".join(f"{p / single[code]:.2f}" for p in peaks) if code in single else "-"
                    digest = hashlib.sha256(out.read_bytes()).hexdigest()
                    digests[(code, variant)] = digest
                    same_j1 = {None: "-", True: "yes", False: "no"}[
                        None if (code, "j1") not in digests else digests[(code, "j1")] == digest]
                    same_j2 = {None: "-", True: "yes", False: "no"}[
                        None if (code, "j2") not in digests else digests[(code, "j2")] == digest]
                    rows.append([code, variant, f"{run.wall_s:.1f}", " / ".join(f"{p / 2**20:.0f}" for p in peaks),
                                 ratio, f"{out.stat().st_size / 1e6:.1f}", digest[:16], same_j1, same_j2])
                    out.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine())
    print(markdown_table(["code", "variant", "wall s", "peak RSS MiB per merge process",
                          f"per worker / -j 1 (target <= {TARGET_WORKER_RATIO})", "output MB", "sha256",
                          "-j 1's bytes", "-j 2's bytes"], rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

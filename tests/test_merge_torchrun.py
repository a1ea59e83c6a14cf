"""torchrun with 2 merge workers writes the single-process merge, byte for byte."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from commtag.merge.validate import validate_file

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DLRM = SHARED / "data" / "public-traces" / "param-dlrm-8rank"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--master-addr=127.0.0.1",
           f"--master-port={_free_port()}", "-m", "commtag.merge", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_two_workers_equal_one(tmp_path: Path) -> None:
    single = tmp_path / "single.pftrace"
    one = subprocess.run([sys.executable, "-m", "commtag.merge", str(DLRM), "-o", str(single), "--align",
                          "collectives", "--no-progress"], capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    double = tmp_path / "double.pftrace"
    proc = _torchrun([str(DLRM), "-o", str(double), "--align", "collectives", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert double.read_bytes() == single.read_bytes()
    assert validate_file(double) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["double.pftrace", "single.pftrace"]


def test_a_bad_rank_stops_every_worker(tmp_path: Path) -> None:
    for r in range(4):
        (tmp_path / f"rank{r}.json").symlink_to(next(DLRM.glob(f"worker{r}_*")))
    (tmp_path / "rank3.json").unlink()
    (tmp_path / "rank3.json").write_text('{"traceEvents": 5}')
    out = tmp_path / "out.pftrace"
    proc = _torchrun([str(tmp_path), "-o", str(out), "--no-progress"])
    assert proc.returncode != 0
    assert "rank3.json: not a profiler trace" in proc.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.pftrace*"))

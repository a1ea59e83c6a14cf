"""``python -m commtag.merge`` under torchrun, the way users run the merge on several workers."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

from commtag.testing.bench import free_port


def torchrun_command(args: list[str], workers: int = 2,
                     env: Optional[dict[str, str]] = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that run the merge CLI with ``workers`` torchrun workers."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={workers}", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", "-m", "commtag.merge", *args]
    return cmd, env


def torchrun_merge(args: list[str], workers: int = 2, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run the merge CLI with ``workers`` torchrun workers on this host; its result, never raising on failure."""
    cmd, env = torchrun_command(args, workers, env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
